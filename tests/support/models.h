// Shipped configs scaled down for tests that run every model, and deterministic batches
// for any graph.
#pragma once

#include <algorithm>
#include <vector>

#include <nlohmann/json.hpp>

#include "remat/data.h"
#include "remat/graph.h"
#include "support/golden.h"

namespace remat::test {

// Deterministic values for every input of `g`, built on the host and moved to `d`: f32
// inputs random_tensor(seed); i32 inputs (i * m + seed) mod the smallest id range their
// readers state (Layer::input_id_range: an embedding's vocabulary, a loss's classes), with
// m = 3 for the loss's targets and 5 for the others, shifted to start at the largest least
// value its readers state (Layer::input_id_min: attention's key lengths start at 1).
inline Batch batch_for(const Graph& g, uint32_t seed, Device d = Device::cpu()) {
  Batch b;
  for (int id : g.input_ids) {
    const Layer& in = g.layer(id);
    if (in.out_dtype != DType::i32) {
      const Tensor host = random_tensor(in.out_shape, seed);
      b.set(in.name, d.is_cpu() ? host : host.to(d));
      continue;
    }
    int64_t range = 0, lo = 0;
    for (int i = 0; i < g.size(); ++i)
      for (size_t k = 0; k < g.layer(i).inputs.size(); ++k) {
        if (g.layer(i).inputs[k] != id) continue;
        if (const int64_t r = g.layer(i).input_id_range(static_cast<int>(k)); r > 0)
          range = range > 0 ? std::min(range, r) : r;
        lo = std::max(lo, g.layer(i).input_id_min(static_cast<int>(k)));
      }
    range = std::max<int64_t>(range, lo + 1);
    const size_t m = id == g.targets_id ? 3 : 5;
    std::vector<int32_t> ids(static_cast<size_t>(in.out_shape.numel()));
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<int32_t>(lo + static_cast<int64_t>((i * m + seed) % static_cast<size_t>(range - lo)));
    b.set(in.name, Tensor::from_ints(ids, in.out_shape, d));
  }
  return b;
}

// A shipped config scaled down: transformer widths scaled so that model width D becomes
// 12 (3 heads of 4; qkv 3D -> 36, MLP 4D -> 48; with kv_heads, 2 heads sharing 1), other
// widths and counts clamped. D: an embedding's dim, or a vision transformer's patch
// conv2d channels (the conv2d before patch_tokens).
inline int64_t model_dim(const nlohmann::json& j) {
  if (j.is_object()) {
    if (j.value("type", "") == "embedding" && j.contains("dim") && j["dim"].is_number_integer())
      return j["dim"].get<int64_t>();
    for (const auto& v : j)
      if (int64_t d = model_dim(v)) return d;
  } else if (j.is_array()) {
    for (size_t i = 1; i < j.size(); ++i)
      if (j[i].is_object() && j[i].value("type", "") == "patch_tokens" && j[i - 1].is_object() &&
          j[i - 1].value("type", "") == "conv2d" && j[i - 1].contains("out_channels"))
        return j[i - 1]["out_channels"].get<int64_t>();
    for (const auto& v : j)
      if (int64_t d = model_dim(v)) return d;
  }
  return 0;
}

inline nlohmann::json shrink(nlohmann::json j, int64_t dim) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& k = it.key();
      auto& v = it.value();
      if (v.is_number_integer()) {
        const int64_t x = v.get<int64_t>();
        if (k == "out_features" || k == "out_channels" || k == "dim") {
          v = (dim > 0 && x % dim == 0) ? x / dim * 12 : std::max<int64_t>(3, std::min<int64_t>(x, 12) / 3 * 3);
          if (k == "out_features" && dim > 0 && x % dim != 0) v = std::min<int64_t>(x, 11);
        }
        if (k == "count") v = std::min<int64_t>(x, 3);
        // A position_embedding keeps its table: the scaled-down image's patches may
        // outnumber 8.
        if (k == "seq_len" || (k == "positions" && j.value("type", "") != "position_embedding"))
          v = std::min<int64_t>(x, 8);
        if (k == "vocab") v = std::min<int64_t>(x, 11);
        if (k == "heads") v = 3;
      }
      if (k == "shape" && v.is_array() && v.size() == 3) v = {v[0], 12, 12};
      if (v.is_structured()) v = shrink(v, dim);
    }
    // Grouped-query attention (and its rotary embedding): 2 query heads sharing 1 key/value
    // head of 6, so that a qkv of twice the width (Llama-style with kv_heads = heads / 2:
    // (H + 2 H/2) d = 2 H d) shrinks to 24 = (2 + 2) 6.
    if (j.contains("kv_heads")) {
      j["heads"] = 2;
      j["kv_heads"] = 1;
    }
  } else if (j.is_array()) {
    for (auto& v : j) v = shrink(v, dim);
  }
  return j;
}

// Whether the model has grouped-query attention (a "kv_heads" key anywhere).
inline bool has_kv_heads(const nlohmann::json& j) {
  if (j.is_object() && j.contains("kv_heads")) return true;
  if (j.is_structured())
    for (const auto& v : j)
      if (has_kv_heads(v)) return true;
  return false;
}

// Every linear named "qkv" set to `width` (the shrunk q, k, v of grouped-query attention).
inline nlohmann::json set_qkv_width(nlohmann::json j, int64_t width) {
  if (j.is_object() && j.value("type", "") == "linear" && j.value("name", "") == "qkv") j["out_features"] = width;
  if (j.is_structured())
    for (auto& v : j) v = set_qkv_width(v, width);
  return j;
}

// With grouped-query attention, the qkv projections become (2 + 2 * 1) heads of 6 = 24
// whatever their width was (Llama 3's (32 + 2 * 8) * 128 is 1.5 times the model width).
inline nlohmann::json shrink_model(const nlohmann::json& model) {
  nlohmann::json out = shrink(model, model_dim(model));
  return has_kv_heads(model) ? set_qkv_width(out, 24) : out;
}

// Every attention layer of a model config set to the given "impl" (fused | materialized).
inline nlohmann::json with_attention_impl(nlohmann::json j, const std::string& impl) {
  if (j.is_object()) {
    if (j.value("type", "") == "attention") j["impl"] = impl;
    for (auto& v : j) v = with_attention_impl(v, impl);
  } else if (j.is_array()) {
    for (auto& v : j) v = with_attention_impl(v, impl);
  }
  return j;
}

}  // namespace remat::test
