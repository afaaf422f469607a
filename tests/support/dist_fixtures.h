// What the gradient-reduction tests share (test_grad_reduce, test_shard_optimizer,
// test_nccl_gpu): a tiny model whose parameter sizes make shards and buckets cut tensors and
// each other, micro-batch gradients from a seed, and a barrier for ranks run as threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "remat/config.h"
#include "remat/exec.h"
#include "remat/profile.h"

namespace remat::test {

// Parameters of awkward sizes (a bias of 7, weights of 7x15, 33x7 and 3x33, a layernorm of
// 7); `optimizer` replaces the default optimizer section when given.
inline Config tiny_dist_config(const nlohmann::json& optimizer = nullptr) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "name": "tiny",
    "model": {
      "input": {"type": "image", "shape": [1, 5, 3]},
      "layers": [
        {"type": "flatten"},
        {"type": "linear", "name": "a", "out_features": 7},
        {"type": "layernorm", "name": "ln"},
        {"type": "linear", "name": "b", "out_features": 33},
        {"type": "gelu", "name": "act"},
        {"type": "linear", "name": "head", "out_features": 3}
      ]
    },
    "data": {"dataset": "synthetic_images", "image_shape": [1, 5, 3], "classes": 3, "synthetic_size": 16},
    "training": {"batch": 4, "steps": 1}
  })");
  if (!optimizer.is_null()) j["optimizer"] = optimizer;
  return parse_config(j, "tiny_dist_config");
}

inline Graph tiny_dist_graph() { return build_config_graph(tiny_dist_config(), 4, 0); }

// One micro-batch's gradient: normal values from `seed`, per defined gradient of ps.
inline std::vector<std::vector<float>> seeded_grads(const ParamStore& ps, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<std::vector<float>> out(ps.grads.size());
  for (size_t p = 0; p < ps.grads.size(); ++p) {
    if (!ps.grads[p].defined()) continue;
    out[p].resize(static_cast<size_t>(ps.grads[p].numel()));
    for (float& x : out[p]) x = nd(rng);
  }
  return out;
}

// A reusable barrier for ranks run as threads (C++17 has none).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lk(m_);
    const int gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lk, [&] { return gen != gen_; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_ = 0, gen_ = 0;
};

}  // namespace remat::test
