// The layer graph: a DAG of layers in topological order, built from a model config with
// shape inference, parameter specs, FLOPs and the tensors each layer saves for backward.
//
// A layer's forward produces its *products*: the output and zero or more extras (e.g.
// layernorm's mean and rstd, attention's probabilities). Backward reads some of the
// layer's inputs, its products, and the gradient of its output. The executor owns every
// product and decides, per layer, whether products are kept from forward to backward or
// freed and rebuilt by re-running the layer (checkpointing).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "remat/backend.h"
#include "remat/rng.h"
#include "remat/tensor.h"

namespace remat {

// What a layer computes (reports group layers by it; policies ask the layer itself, e.g.
// Layer::selective_keep).
enum class LayerKind { input, gemm, conv, pointwise, norm, dropout, attention, pool, embedding, view, loss };
const char* layer_kind_name(LayerKind k);

enum class Init { zeros, ones, uniform, normal };

struct ParamSpec {
  std::string name;  // local name: "weight", "bias", "running_mean"
  Shape shape;
  Init init = Init::zeros;
  float scale = 0.0f;        // uniform bound or normal std
  bool trainable = true;     // false for buffers (batchnorm running statistics)
  bool weight_decay = true;  // false for biases and norm parameters
  std::string tie;           // full name of another layer's parameter to share instead

  // Builders: ParamSpec::uniform("weight", {out, in}, in), ParamSpec::ones("weight", {c}).no_decay().
  static ParamSpec zeros(std::string name, Shape shape);
  static ParamSpec ones(std::string name, Shape shape);
  // PyTorch's default for linear and conv layers: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  static ParamSpec uniform(std::string name, Shape shape, int64_t fan_in);
  static ParamSpec normal(std::string name, Shape shape, float std);
  ParamSpec no_decay() const;                      // excluded from weight decay
  ParamSpec buffer() const;                        // not trained (no gradient), no decay
  ParamSpec tied_to(std::string full_name) const;  // shares another layer's parameter
};

struct ForwardContext {
  explicit ForwardContext(Backend& backend) : be(backend) {}
  Backend& be;
  bool training = true;
  bool recompute = false;  // re-running for backward: skip side effects
  RngState rng;            // the range reserved for this layer in this step
  std::vector<Tensor> in;
  std::vector<Tensor> params;  // in param_specs order (buffers included)
  Tensor out;                  // set by forward
  std::vector<Tensor> extras;  // set by forward
  // Recompute of a layer whose output was kept: only the extras are needed, so forward
  // may leave out undefined and skip the work that only the output needs (attention's
  // P V). A layer may also ignore it and compute everything; the output is discarded.
  bool extras_only = false;
  // Incremental decoding (Layer::step_run): the position of the sequence inputs' one row,
  // and, for causal self-attention, its key/value cache [B, T, 2 kv_heads d] (rows 0 ..
  // position - 1 filled by the earlier steps).
  int64_t position = 0;
  Tensor* kv_cache = nullptr;
};

struct BackwardContext;
// The output gradient as the buffer for an input gradient that may alias it (an op whose
// entry in remat/backend_ops.def says "dx may alias dy"), when no other tensor shares its
// storage: saves one activation-sized buffer per pointwise or norm layer in backward. A
// fresh tensor of `shape` otherwise.
Tensor reuse_dout(BackwardContext& c, const Shape& shape);

struct BackwardContext {
  explicit BackwardContext(Backend& backend) : be(backend) {}
  Backend& be;
  RngState rng;
  std::vector<Tensor> in;  // only the inputs backward_inputs() names are defined
  Tensor out;              // defined when backward_uses_output()
  std::vector<Tensor> extras;
  Tensor dout;
  std::vector<Tensor> params;
  std::vector<Tensor> grads;  // param gradients (+=); undefined for buffers
  std::vector<bool> need_din;
  std::vector<Tensor> din;  // set by backward for inputs with need_din
};

class Layer {
 public:
  virtual ~Layer() = default;

  std::string name;  // unique, e.g. "block3.attn"
  std::string type;  // registry name, e.g. "attention"
  int id = -1;
  std::vector<int> inputs;  // ids of the layers whose outputs this layer reads
  Shape out_shape;          // with the batch dimension
  DType out_dtype = DType::f32;
  int unit = -1;            // index of the repeated-block instance it belongs to, or -1
  bool checkpoint = false;  // the config's per-block checkpoint flag (manual policy)

  virtual LayerKind kind() const = 0;
  // Checks input shapes and returns the output shape (with batch). Throws remat::Error.
  // The one method that may change the layer (it records the shapes it was built for).
  virtual Shape infer(const std::vector<Shape>& in) = 0;
  // The dtype input k must have: f32, or i32 for token ids and targets.
  virtual DType input_dtype(int /*k*/) const { return DType::f32; }
  // For an i32 input k: the ids it may hold are [0, range) (an embedding's vocabulary;
  // synthetic data draws from it). 0: not an id input, or no bound.
  virtual int64_t input_id_range(int /*k*/) const { return 0; }
  // ... and at least this (attention's key lengths: 1; the default 0).
  virtual int64_t input_id_min(int /*k*/) const { return 0; }
  virtual std::vector<ParamSpec> param_specs() const { return {}; }
  // Random words one training forward draws. (Other side effects, batchnorm's running
  // statistics, are skipped when ForwardContext::recompute is set.)
  virtual uint64_t rng_words() const { return 0; }
  // What the selective policy keeps of this layer between forward and backward: products
  // that are expensive to recompute and cheap to keep (GEMMs, convolutions, embeddings:
  // `all`; attention keeps its P V product but recomputes its probabilities: `output`),
  // Korthikanti et al. 2022. The rest (pointwise, norms, dropout, softmax) is recomputed.
  enum class SelectiveKeep { nothing, output, all };
  virtual SelectiveKeep selective_keep() const { return SelectiveKeep::nothing; }
  virtual double forward_flops() const { return 0.0; }
  virtual double backward_flops() const { return 2.0 * forward_flops(); }
  // FLOPs of a forward with ForwardContext::extras_only (recompute counts them).
  virtual double extras_flops() const { return forward_flops(); }

  // Forward and backward never change the layer: what they produce goes to the context.
  virtual void forward(ForwardContext& c) const = 0;
  virtual void backward(BackwardContext& c) const = 0;

  // Which inputs (by position) backward reads; whether it reads the output (no built-in
  // layer does; the executor supports it for layers that do, e.g. a sigmoid).
  virtual std::vector<int> backward_inputs() const { return {}; }
  virtual bool backward_uses_output() const { return false; }
  virtual std::vector<std::string> extra_names() const { return {}; }
  // Inputs that never receive a gradient (token ids, targets).
  virtual bool input_differentiable(int /*i*/) const { return true; }
  // A loss over class ids: the target value whose rows it leaves out (accuracy leaves them
  // out too). Empty for every other layer.
  virtual std::optional<int> ignore_index() const { return std::nullopt; }
  // Whether this layer's ops compute on bf16 activations and working weights
  // (training.precision bf16, docs/memory.md "Mixed precision"). Off by default, so a new
  // layer must opt in; a bf16 run of a graph with a layer that does not is refused up
  // front with the layer's name (bf16_unsupported_layer), never failed mid-step.
  virtual bool runs_in_bf16() const { return false; }
  // Incremental decoding (remat/incremental.h): how this layer runs on one sequence
  // position at a time, its sequence inputs [B, 1, ...]. `positionwise`: each position's
  // output reads that position alone, so forward runs as is (linear, norms, pointwise,
  // dropout in evaluation, cross-attention's queries); `positional`: it also reads
  // ForwardContext::position (learned positions); `cached`: causal self-attention, which
  // adds the position's keys and values to ForwardContext::kv_cache and attends over the
  // positions so far. No by default, so a new layer must opt in (rope does not yet).
  enum class StepRun { no, positionwise, positional, cached };
  virtual StepRun step_run() const { return StepRun::no; }
};

// Builds layers of one type from their JSON object (see docs/config.md).
class ConfigReader;
using LayerFactory = std::function<std::unique_ptr<Layer>(ConfigReader&)>;
// Registers a layer type; a duplicate name throws remat::Error. The built-in types
// register themselves, one file each under src/graph/layers/ (REMAT_REGISTER_LAYER).
void register_layer_type(const std::string& type, LayerFactory factory);
std::vector<std::string> layer_types();
// The factory of a type, or an empty function when none is registered.
LayerFactory find_layer_factory(const std::string& type);

struct GraphParam {
  std::string name;  // "block0.fc1.weight"
  ParamSpec spec;
  int owner = -1;  // layer id that declared it
};

class Graph {
 public:
  std::vector<std::unique_ptr<Layer>> layers;  // topological order; layer i has id i
  std::vector<GraphParam> params;              // tied parameters appear once
  // For each layer, indices into params for its param_specs (ties resolved).
  std::vector<std::vector<int>> layer_params;
  // The model's inputs (layers of kind input, named as the config declares them: a Batch
  // maps those names to tensors), in the order declared.
  std::vector<int> input_ids;
  // The loss: the one layer of kind loss, the graph's last layer (backward starts there).
  int loss_id = -1;
  // The loss layer's first input (the logits, what evaluation returns) and, when it is a
  // model input, its second (the targets accuracy is counted against; -1 otherwise).
  int logits_id = -1, targets_id = -1;
  int num_units = 0;  // repeated-block instances
  int64_t batch = 0;

  const Layer& layer(int i) const { return *layers[static_cast<size_t>(i)]; }
  int size() const { return static_cast<int>(layers.size()); }
  // The id of the model input called `name`, or -1.
  int input(const std::string& name) const;
  // The id of the model input called `name`; throws naming the inputs the model declares.
  int require_input(const std::string& name, const std::string& why) const;
  int64_t parameter_count(bool trainable_only = true) const;
  std::string summary() const;  // a table: name, type, output shape, params, FLOPs
};

// Builds the graph for `model` (the config's "model" object) at batch size `batch`.
// `source` names the file in error messages, which carry JSON pointers. `vars` supplies
// values for "$name" integers (e.g. "$vocab" from the data set).
//
// Inputs: `model.inputs` declares them by name ([{"name": "input", "type": "tokens",
// "seq_len": 128}, ...]) and the loss is a layer of `model.layers` (the last one, e.g.
// {"type": "cross_entropy", "inputs": ["head", "targets"]}); or the shorthand
// `model.input` ({"type": "image" | "tokens", ...}) declares the two inputs the built-in
// data sets give, "input" and "targets", and appends the loss layer "loss" of `model.loss`
// (cross-entropy by default) on the last layer's output (docs/config.md).
Graph build_graph(const nlohmann::json& model, int64_t batch, const std::string& source,
                  const std::map<std::string, int64_t>& vars = {});

// The names of the built-in data sets' two inputs: images or token windows, and their
// class labels or next tokens.
inline constexpr const char* kInputName = "input";
inline constexpr const char* kTargetsName = "targets";

// The type a model config declares for its input `name` ("image", "tokens", "labels",
// "tensor"), read from model.inputs or the shorthand model.input without building the
// graph; "" when the model declares no such input (or the config is malformed: build_graph
// says how).
std::string declared_input_type(const nlohmann::json& model, const std::string& name);
// Sets seq_len of every "tokens" input of `model` (the --seq option of memprof and plan);
// returns how many it set.
int set_token_seq_len(nlohmann::json& model, int64_t seq_len);

// training.precision bf16 for g: empty when every layer runs in bf16 (Layer::runs_in_bf16),
// else an error naming the first layer that does not, and its type.
std::string bf16_layer_error(const Graph& g);

}  // namespace remat
