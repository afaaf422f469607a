// Shipped configs scaled down for tests that run every model.
#pragma once

#include <nlohmann/json.hpp>

namespace remat::test {

// A shipped config scaled down: transformer widths scaled so that model width D becomes
// 12 (3 heads of 4; qkv 3D -> 36, MLP 4D -> 48), other widths and counts clamped.
inline int64_t model_dim(const nlohmann::json& j) {
  if (j.is_object()) {
    if (j.value("type", "") == "embedding" && j.contains("dim")) return j["dim"].get<int64_t>();
    for (const auto& v : j)
      if (int64_t d = model_dim(v)) return d;
  } else if (j.is_array()) {
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
        if (k == "seq_len" || k == "positions") v = std::min<int64_t>(x, 8);
        if (k == "vocab") v = std::min<int64_t>(x, 11);
        if (k == "heads") v = 3;
      }
      if (k == "shape" && v.is_array() && v.size() == 3) v = {v[0], 12, 12};
      if (v.is_structured()) v = shrink(v, dim);
    }
  } else if (j.is_array()) {
    for (auto& v : j) v = shrink(v, dim);
  }
  return j;
}

inline nlohmann::json shrink_model(const nlohmann::json& model) { return shrink(model, model_dim(model)); }

}  // namespace remat::test
