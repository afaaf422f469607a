// The layer type registry, and what every layer shares: kind names, parameter spec
// builders, reuse_dout. The built-in types live one family per file in src/graph/layers/
// and register themselves there.
#include <cmath>
#include <map>
#include <mutex>

#include "graph/layers/layer_util.h"

namespace remat {

namespace {

std::map<std::string, LayerFactory>& registry() {
  static auto* r = new std::map<std::string, LayerFactory>();  // never destroyed
  return *r;
}
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

const char* layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::input: return "input";
    case LayerKind::gemm: return "gemm";
    case LayerKind::conv: return "conv";
    case LayerKind::pointwise: return "pointwise";
    case LayerKind::norm: return "norm";
    case LayerKind::dropout: return "dropout";
    case LayerKind::attention: return "attention";
    case LayerKind::pool: return "pool";
    case LayerKind::embedding: return "embedding";
    case LayerKind::view: return "view";
    case LayerKind::loss: return "loss";
  }
  return "?";
}

Tensor reuse_dout(BackwardContext& c, const Shape& shape) {
  if (c.dout.defined() && c.dout.storage_use_count() == 1 && c.dout.shape() == shape) return c.dout;
  return Tensor::empty(shape, c.be.device(), activation_dtype());  // an activation gradient: bf16 under bf16
}

// ---- ParamSpec builders -----------------------------------------------------------------

ParamSpec ParamSpec::zeros(std::string name, Shape shape) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.init = Init::zeros;
  return p;
}

ParamSpec ParamSpec::ones(std::string name, Shape shape) {
  ParamSpec p = zeros(std::move(name), std::move(shape));
  p.init = Init::ones;
  return p;
}

ParamSpec ParamSpec::uniform(std::string name, Shape shape, int64_t fan_in) {
  ParamSpec p = zeros(std::move(name), std::move(shape));
  p.init = Init::uniform;
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(fan_in, 1))));
  return p;
}

ParamSpec ParamSpec::normal(std::string name, Shape shape, float std) {
  ParamSpec p = zeros(std::move(name), std::move(shape));
  p.init = Init::normal;
  p.scale = std;
  return p;
}

ParamSpec ParamSpec::no_decay() const {
  ParamSpec p = *this;
  p.weight_decay = false;
  return p;
}

ParamSpec ParamSpec::buffer() const {
  ParamSpec p = no_decay();
  p.trainable = false;
  return p;
}

ParamSpec ParamSpec::tied_to(std::string full_name) const {
  ParamSpec p = *this;
  p.tie = std::move(full_name);
  return p;
}

// ---- the registry -------------------------------------------------------------------------

void register_layer_type(const std::string& type, LayerFactory factory) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  REMAT_CHECK(type != "repeat" && !registry().count(type), "layer type \"", type, "\" is already registered");
  registry()[type] = std::move(factory);
}

bool layers::register_builtin(const char* type, LayerFactory factory) {
  register_layer_type(type, std::move(factory));
  return true;
}

std::vector<std::string> layer_types() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<std::string> out;
  for (auto& [k, v] : registry()) out.push_back(k);
  return out;
}

LayerFactory find_layer_factory(const std::string& type) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(type);
  return it == registry().end() ? LayerFactory() : it->second;
}

// ---- config helpers -------------------------------------------------------------------------

std::pair<int, int> layers::int_or_pair(ConfigReader& r, const std::string& key, int def, int min) {
  if (!r.has(key)) return {def, def};
  const auto& v = r.raw(key);
  auto check = [&](const nlohmann::json& x, const std::string& k) {
    if (!x.is_number_integer() || x.get<int64_t>() < min || x.get<int64_t>() > 1 << 20)
      r.fail(k, std::string("expected ") + (min > 0 ? "a positive" : "a non-negative") +
                    " integer or a list of two, got " + x.dump());
    return static_cast<int>(x.get<int64_t>());
  };
  if (v.is_array()) {
    if (v.size() != 2) r.fail(key, "expected a list of two integers, got " + v.dump());
    return {check(v[0], key + "/0"), check(v[1], key + "/1")};
  }
  int x = check(v, key);
  return {x, x};
}

}  // namespace remat
