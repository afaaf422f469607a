// Building a Graph from the model section of a config: name scopes, repeated blocks,
// shape inference and parameter resolution (ties), with errors that carry the file and
// the JSON pointer of the layer at fault.
#include <cstdio>
#include <map>
#include <optional>

#include "graph/layers/layer_util.h"
#include "remat/config.h"
#include "remat/error.h"
#include "remat/graph.h"

namespace remat {

namespace {

class InputLayer final : public Layer {
 public:
  bool runs_in_bf16() const override { return true; }
  explicit InputLayer(Shape s, DType dt) : shape_(s) { out_dtype = dt; }
  LayerKind kind() const override { return LayerKind::input; }
  Shape infer(const std::vector<Shape>&) override { return shape_; }
  void forward(ForwardContext&) const override { REMAT_THROW("input layer ", name, " has no forward"); }
  void backward(BackwardContext&) const override {}

 private:
  Shape shape_;
};

struct Builder {
  Graph& g;
  std::string source;
  std::map<std::string, int64_t> vars;
  std::map<std::string, int> param_index;  // full name -> index into g.params

  int add(std::unique_ptr<Layer> layer, const std::vector<int>& inputs, const ConfigReader* r) {
    layer->id = g.size();
    layer->inputs = inputs;
    std::vector<Shape> shapes;
    for (int i : inputs) shapes.push_back(g.layer(i).out_shape);
    try {
      layer->out_shape = layer->infer(shapes);
      for (size_t k = 0; k < inputs.size(); ++k) {
        const Layer& in = g.layer(inputs[k]);
        const DType want = layer->input_dtype(static_cast<int>(k));
        if (in.out_dtype != want)
          REMAT_THROW(layer->type, ": input ", k, " (", in.name, ") is ", dtype_name(in.out_dtype), ", expected ",
                      want == DType::i32 ? "i32 token ids" : dtype_name(want));
      }
    } catch (const Error& e) {
      if (r) REMAT_THROW(source, ": ", r->pointer(), ": layer \"", layer->name, "\" (", layer->type, "): ", e.what());
      throw;
    }
    std::vector<int> pidx;
    for (const ParamSpec& spec : layer->param_specs()) {
      const std::string full = layer->name + "." + spec.name;
      if (!spec.tie.empty()) {
        auto it = param_index.find(spec.tie);
        if (it == param_index.end()) {
          const std::string msg = "no parameter \"" + spec.tie + "\" defined before this layer";
          if (r) r->fail("tie_weight", msg);
          REMAT_THROW(msg);
        }
        const GraphParam& target = g.params[static_cast<size_t>(it->second)];
        if (target.spec.shape != spec.shape) {
          const std::string msg =
              "\"" + spec.tie + "\" has shape " + target.spec.shape.str() + ", this layer needs " + spec.shape.str();
          if (r) r->fail("tie_weight", msg);
          REMAT_THROW(msg);
        }
        pidx.push_back(it->second);
        continue;
      }
      param_index[full] = static_cast<int>(g.params.size());
      pidx.push_back(static_cast<int>(g.params.size()));
      g.params.push_back(GraphParam{full, spec, layer->id});
    }
    g.layer_params.push_back(pidx);
    g.layers.push_back(std::move(layer));
    return g.size() - 1;
  }

  // Builds the layers of `r`'s "layers" array; returns the id of the last one.
  int build_list(ConfigReader& r, std::map<std::string, int> scope, int prev, const std::string& prefix, int unit,
                 bool checkpoint) {
    const size_t n = r.array_size("layers");
    if (n == 0) r.fail("layers", "expected at least one layer");
    for (size_t i = 0; i < n; ++i) {
      ConfigReader lr = r.child("layers", i);
      const std::string type = lr.string("type");
      if (type == "repeat") {
        const int64_t count = lr.positive_int("count");
        const std::string name = lr.string_or("name", "block");
        const bool ckpt = lr.bool_or("checkpoint", false);
        lr.array_size("layers");
        for (int64_t k = 0; k < count; ++k) {
          ConfigReader inst = lr;  // each instance reads the same definition afresh
          std::map<std::string, int> inner = scope;
          inner["in"] = prev;
          prev = build_list(inst, inner, prev, prefix + name + std::to_string(k) + ".", g.num_units++, ckpt);
          inst.finish();
        }
        scope[name] = prev;
        lr.finish();
        continue;
      }
      LayerFactory factory = find_layer_factory(type);
      if (!factory) {
        std::string known;
        for (const auto& t : layer_types()) known += (known.empty() ? "" : ", ") + t;
        lr.fail("type", "unknown layer type \"" + type + "\" (known: repeat, " + known + ")");
      }
      const std::string local = lr.string_or("name", type + std::to_string(i));
      std::vector<int> inputs;
      for (const std::string& ref : lr.string_list_or("inputs", {})) {
        auto it = scope.find(ref);
        if (it == scope.end()) lr.fail("inputs", "no tensor named \"" + ref + "\" before this layer");
        inputs.push_back(it->second);
      }
      if (inputs.empty()) inputs.push_back(prev);
      std::unique_ptr<Layer> layer = factory(lr);
      lr.finish();
      layer->name = prefix + local;
      layer->type = type;
      layer->unit = unit;
      layer->checkpoint = checkpoint;
      for (const auto& l : g.layers)
        if (l->name == layer->name) lr.fail("name", "duplicate layer name \"" + layer->name + "\"");
      prev = add(std::move(layer), inputs, &lr);
      scope[local] = prev;
    }
    return prev;
  }
};

}  // namespace

Graph build_graph(const nlohmann::json& model, int64_t batch, const std::string& source,
                  const std::map<std::string, int64_t>& vars) {
  REMAT_CHECK(batch > 0, "batch size must be positive, got ", batch);
  Graph g;
  g.batch = batch;
  Builder b{g, source, vars, {}};
  ConfigReader r(model, "/model", source, &b.vars);
  if (model.contains("vars")) {
    ConfigReader v = r.child("vars");
    for (auto it = model["vars"].begin(); it != model["vars"].end(); ++it) b.vars[it.key()] = v.positive_int(it.key());
    v.finish();
  }
  ConfigReader in = r.child("input");
  const std::string kind = in.one_of("type", {"image", "tokens"}, "image");
  Shape xs, ts;
  DType xdt = DType::f32;
  if (kind == "image") {
    auto s = in.shape("shape");
    if (s.size() != 3) in.fail("shape", "expected [C, H, W]");
    xs = Shape{batch, s[0], s[1], s[2]};
    ts = Shape{batch};
  } else {
    const int64_t t = in.positive_int("seq_len");
    xs = Shape{batch, t};
    ts = Shape{batch, t};
    xdt = DType::i32;
    b.vars["seq_len"] = t;
  }
  in.finish();
  auto input = std::make_unique<InputLayer>(xs, xdt);
  input->name = "input";
  input->type = "input";
  g.input_id = b.add(std::move(input), {}, nullptr);
  auto targets = std::make_unique<InputLayer>(ts, DType::i32);
  targets->name = "targets";
  targets->type = "input";
  g.targets_id = b.add(std::move(targets), {}, nullptr);

  std::map<std::string, int> scope{{"input", g.input_id}};
  g.logits_id = b.build_list(r, scope, g.input_id, "", -1, false);
  int ignore = -100;
  std::optional<ConfigReader> loss_reader;
  if (r.has("loss")) {
    loss_reader.emplace(r.child("loss"));
    loss_reader->one_of("type", {"cross_entropy"}, "cross_entropy");
    ignore = static_cast<int>(loss_reader->int_or("ignore_index", -100, -(int64_t{1} << 31), (int64_t{1} << 31) - 1));
    loss_reader->finish();
  }
  auto loss = make_cross_entropy(ignore);
  loss->name = "loss";
  loss->type = "cross_entropy";
  g.loss_id = b.add(std::move(loss), {g.logits_id, g.targets_id}, loss_reader ? &*loss_reader : &r);
  r.finish();
  return g;
}

int64_t Graph::parameter_count(bool trainable_only) const {
  int64_t n = 0;
  for (const auto& p : params)
    if (p.spec.trainable || !trainable_only) n += p.spec.shape.numel();
  return n;
}

std::string Graph::summary() const {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-24s %-15s %-20s %12s %14s\n", "layer", "type", "output", "params", "fwd FLOPs");
  out += line;
  for (int i = 0; i < size(); ++i) {
    const Layer& l = layer(i);
    int64_t np = 0;
    for (int p : layer_params[static_cast<size_t>(i)])
      if (params[static_cast<size_t>(p)].owner == i) np += params[static_cast<size_t>(p)].spec.shape.numel();
    std::snprintf(line, sizeof line, "%-24s %-15s %-20s %12lld %14.3g\n", l.name.c_str(), l.type.c_str(),
                  l.out_shape.str().c_str(), static_cast<long long>(np), l.forward_flops());
    out += line;
  }
  std::snprintf(line, sizeof line, "%d layers, %lld trainable parameters\n", size(),
                static_cast<long long>(parameter_count()));
  out += line;
  return out;
}

std::string bf16_layer_error(const Graph& g) {
  for (int i = 0; i < g.size(); ++i) {
    const Layer& l = g.layer(i);
    if (!l.runs_in_bf16())
      return "layer \"" + l.name + "\" (" + l.type + ") has no bf16 ops (Layer::runs_in_bf16): train this model " +
             "with training.precision fp32";
  }
  return "";
}

}  // namespace remat
