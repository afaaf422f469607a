// Building a Graph from the model section of a config: name scopes, repeated blocks,
// shape inference and parameter resolution (ties), with errors that carry the file and
// the JSON pointer of the layer at fault.
#include <algorithm>
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
      if (r)
        throw Error(detail::str_cat(source, ": ", r->pointer(), ": layer \"", layer->name, "\" (", layer->type,
                                    "): ", e.message()),
                    e.source());  // the place in remat's source is the layer's check
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
        param_index[full] = it->second;  // a later layer may tie to this name too
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

namespace {

const std::vector<std::string> kInputTypes{"image", "tokens", "labels", "tensor"};

// One model input from its declaration `in` (an element of model.inputs, or the shorthand
// model.input): [batch, ...] of the type's dtype. The first token input's length is the
// variable $seq_len.
int add_input(Builder& b, ConfigReader& in, const std::string& name, const std::string& type, int64_t batch) {
  Shape shape;
  DType dtype = DType::f32;
  if (type == "image") {
    auto s = in.shape("shape");
    if (s.size() != 3) in.fail("shape", "expected [C, H, W]");
    shape = Shape{batch, s[0], s[1], s[2]};
  } else if (type == "tokens") {
    const int64_t t = in.positive_int("seq_len");
    shape = Shape{batch, t};
    dtype = DType::i32;
    if (!b.vars.count("seq_len")) b.vars["seq_len"] = t;
  } else if (type == "labels") {
    shape = Shape{batch};
    dtype = DType::i32;
  } else {  // tensor
    const auto s = in.shape("shape");
    if (s.empty() || s.size() > 4) in.fail("shape", "expected 1 to 4 dimensions per sample");
    std::vector<int64_t> dims{batch};
    dims.insert(dims.end(), s.begin(), s.end());
    shape = Shape(dims);
    dtype = in.one_of("dtype", {"f32", "i32"}, "f32") == "i32" ? DType::i32 : DType::f32;
  }
  auto layer = std::make_unique<InputLayer>(shape, dtype);
  layer->name = name;
  layer->type = "input";
  const int id = b.add(std::move(layer), {}, nullptr);
  b.g.input_ids.push_back(id);
  return id;
}

// model.inputs: named inputs, in order.
std::map<std::string, int> read_inputs(Builder& b, ConfigReader& r, int64_t batch) {
  std::map<std::string, int> scope;
  const size_t n = r.array_size("inputs");
  if (n == 0) r.fail("inputs", "expected at least one input");
  for (size_t i = 0; i < n; ++i) {
    ConfigReader in = r.child("inputs", i);
    const std::string name = in.string("name");
    if (name.empty() || name.find_first_of(". \t") != std::string::npos)
      in.fail("name", "expected a name without dots or spaces, got \"" + name + "\"");
    if (scope.count(name)) in.fail("name", "duplicate input name \"" + name + "\"");
    const std::string type = in.string("type");
    if (std::find(kInputTypes.begin(), kInputTypes.end(), type) == kInputTypes.end())
      in.fail("type", "expected one of image, tokens, labels, tensor, got \"" + type + "\"");
    scope[name] = add_input(b, in, name, type, batch);
    in.finish();
  }
  return scope;
}

// The shorthand model.input: the built-in data sets' "input" (images or tokens) and
// "targets" (class labels, or the next token of each position).
std::map<std::string, int> read_shorthand_input(Builder& b, ConfigReader& r, int64_t batch) {
  ConfigReader in = r.child("input");
  const std::string type = in.one_of("type", {"image", "tokens"}, "image");
  const int input = add_input(b, in, kInputName, type, batch);
  in.finish();
  const Shape& s = b.g.layer(input).out_shape;
  auto targets = std::make_unique<InputLayer>(type == "image" ? Shape{batch} : s, DType::i32);
  targets->name = kTargetsName;
  targets->type = "input";
  const int t = b.add(std::move(targets), {}, nullptr);
  b.g.input_ids.push_back(t);
  return {{kInputName, input}, {kTargetsName, t}};
}

// The shorthand's loss: model.loss (cross-entropy by default) on the logits and "targets".
void append_shorthand_loss(Builder& b, ConfigReader& r, int logits) {
  static const nlohmann::json kNoKeys = nlohmann::json::object();
  std::optional<ConfigReader> lr;
  if (r.has("loss"))
    lr.emplace(r.child("loss"));
  else
    lr.emplace(kNoKeys, r.pointer() + "/loss", r.source(), &b.vars);
  const std::string type = lr->one_of("type", {"cross_entropy"}, "cross_entropy");
  std::unique_ptr<Layer> loss = find_layer_factory(type)(*lr);
  lr->finish();
  loss->name = "loss";
  loss->type = type;
  b.add(std::move(loss), {logits, b.g.input(kTargetsName)}, &*lr);
}

// Exactly one loss layer, the last one, with a scalar output.
void check_loss(const Graph& g, const ConfigReader& r) {
  int loss = -1;
  for (int i = 0; i < g.size(); ++i) {
    if (g.layer(i).kind() != LayerKind::loss) continue;
    if (loss >= 0)
      r.fail("layers",
             "two loss layers, \"" + g.layer(loss).name + "\" and \"" + g.layer(i).name + "\": a model has one loss");
    loss = i;
  }
  const Layer& last = g.layer(g.size() - 1);
  if (loss < 0)
    r.fail("layers",
           "no loss layer: with \"inputs\", the last layer is the loss (e.g. {\"type\": \"cross_entropy\", "
           "\"inputs\": [\"" +
               last.name + "\", \"targets\"]})");
  if (loss != g.size() - 1)
    r.fail("layers",
           "the loss \"" + g.layer(loss).name + "\" must be the last layer, but \"" + last.name + "\" comes after it");
  if (last.out_shape != Shape{1})
    r.fail("layers", "the loss \"" + last.name + "\" gives " + last.out_shape.str() + ", expected a scalar [1]");
}

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
  const bool shorthand = !r.has("inputs");
  if (!shorthand && r.has("input")) r.fail("input", "give either \"input\" (the shorthand) or \"inputs\", not both");
  if (!shorthand && r.has("loss"))
    r.fail("loss",
           "with \"inputs\", the loss is the last layer of \"layers\" (e.g. {\"type\": \"cross_entropy\", "
           "\"inputs\": [\"head\", \"targets\"]})");
  const std::map<std::string, int> scope = shorthand ? read_shorthand_input(b, r, batch) : read_inputs(b, r, batch);
  const int last = b.build_list(r, scope, g.input_ids.front(), "", -1, false);
  if (shorthand) {
    if (g.layer(last).kind() == LayerKind::loss)
      r.fail("layers",
             "the shorthand \"input\" appends the loss itself (\"loss\"): declare \"inputs\" to give "
             "the loss as a layer");
    append_shorthand_loss(b, r, last);
  }
  check_loss(g, r);
  g.loss_id = g.size() - 1;
  const Layer& loss = g.layer(g.loss_id);
  g.logits_id = loss.inputs.empty() ? -1 : loss.inputs[0];
  if (loss.inputs.size() > 1 && g.layer(loss.inputs[1]).kind() == LayerKind::input) g.targets_id = loss.inputs[1];
  r.finish();
  return g;
}

int Graph::input(const std::string& name) const {
  for (int id : input_ids)
    if (layer(id).name == name) return id;
  return -1;
}

int Graph::require_input(const std::string& name, const std::string& why) const {
  const int id = input(name);
  if (id >= 0) return id;
  std::string names;
  for (int i : input_ids) names += (names.empty() ? "" : ", ") + layer(i).name;
  REMAT_THROW(why, " needs a model input \"", name, "\"; the model declares ", names);
}

std::string declared_input_type(const nlohmann::json& model, const std::string& name) {
  if (!model.is_object()) return "";
  if (model.contains("inputs")) {
    if (!model["inputs"].is_array()) return "";
    for (const auto& in : model["inputs"])
      if (in.is_object() && in.value("name", std::string()) == name && in.contains("type") && in["type"].is_string())
        return in["type"].get<std::string>();
    return "";
  }
  if (!model.contains("input") || !model["input"].is_object()) return "";
  const nlohmann::json& in = model["input"];
  const std::string type = in.contains("type") && in["type"].is_string() ? in["type"].get<std::string>() : "image";
  if (name == kInputName) return type;
  if (name == kTargetsName) return type == "tokens" ? "tokens" : "labels";
  return "";
}

int set_token_seq_len(nlohmann::json& model, int64_t seq_len) {
  int set = 0;
  auto set_in = [&](nlohmann::json& in) {
    if (in.is_object() && in.contains("type") && in["type"] == "tokens") in["seq_len"] = seq_len, ++set;
  };
  if (model.contains("inputs") && model["inputs"].is_array())
    for (auto& in : model["inputs"]) set_in(in);
  else if (model.contains("input"))
    set_in(model["input"]);
  return set;
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
