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
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "remat/backend.h"
#include "remat/rng.h"
#include "remat/tensor.h"

namespace remat {

// What a layer computes; the selective policy keeps gemm/conv products and recomputes the rest.
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
};

struct ForwardContext {
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
};

struct BackwardContext;
// The output gradient as the buffer for an elementwise op's input gradient when no other
// tensor shares its storage (saves one activation-sized buffer per pointwise layer in
// backward); a fresh tensor of `shape` otherwise.
Tensor reuse_dout(BackwardContext& c, const Shape& shape);

struct BackwardContext {
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
  virtual Shape infer(const std::vector<Shape>& in) = 0;
  virtual std::vector<ParamSpec> param_specs() const { return {}; }
  virtual uint64_t rng_words() const { return 0; }  // random words one training forward draws
  virtual bool has_side_effects() const { return false; }
  virtual double forward_flops() const { return 0.0; }
  virtual double backward_flops() const { return 2.0 * forward_flops(); }
  // FLOPs of a forward with ForwardContext::extras_only (recompute counts them).
  virtual double extras_flops() const { return forward_flops(); }

  virtual void forward(ForwardContext& c) = 0;
  virtual void backward(BackwardContext& c) = 0;

  // Which inputs (by position) backward reads; whether it reads the output.
  virtual std::vector<int> backward_inputs() const { return {}; }
  virtual bool backward_uses_output() const { return false; }
  virtual std::vector<std::string> extra_names() const { return {}; }
  // Inputs that never receive a gradient (token ids, targets).
  virtual bool input_differentiable(int /*i*/) const { return true; }
};

// Builds layers of one type from their JSON object (see docs/config.md).
class ConfigReader;
using LayerFactory = std::function<std::unique_ptr<Layer>(ConfigReader&)>;
// Registers a layer type; a duplicate name throws remat::Error.
void register_layer_type(const std::string& type, LayerFactory factory);
std::vector<std::string> layer_types();

struct GraphParam {
  std::string name;  // "block0.fc1.weight"
  ParamSpec spec;
  int owner = -1;    // layer id that declared it
};

class Graph {
 public:
  std::vector<std::unique_ptr<Layer>> layers;  // topological order; layer i has id i
  std::vector<GraphParam> params;              // tied parameters appear once
  // For each layer, indices into params for its param_specs (ties resolved).
  std::vector<std::vector<int>> layer_params;
  int input_id = -1, targets_id = -1, loss_id = -1, logits_id = -1;
  int num_units = 0;  // repeated-block instances
  int64_t batch = 0;

  const Layer& layer(int i) const { return *layers[static_cast<size_t>(i)]; }
  int size() const { return static_cast<int>(layers.size()); }
  int64_t parameter_count(bool trainable_only = true) const;
  std::string summary() const;  // a table: name, type, output shape, params, FLOPs
};

// Builds the graph for `model` (the config's "model" object) at batch size `batch`.
// `source` names the file in error messages, which carry JSON pointers. `vars` supplies
// values for "$name" integers (e.g. "$vocab" from the data set).
Graph build_graph(const nlohmann::json& model, int64_t batch, const std::string& source,
                  const std::map<std::string, int64_t>& vars = {});

}  // namespace remat
