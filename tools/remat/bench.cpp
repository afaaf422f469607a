// `remat bench ops`: times each op's forward + backward at realistic sizes on the CPU
// backend (median of N runs after a warm-up). tools/bench/bench_torch.py times the same cases
// in PyTorch; tools/bench/bench_compare.py prints the ratios (docs/performance.md).
// `remat bench kernels` (bench_kernels.cpp): memory-bound ops of a device in GB/s.
// `remat bench link`: the host link each way, as offload copies.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "remat/backend.h"
#include "remat/error.h"
#include "remat/io.h"
#include "remat/ops.h"
#include "remat/profile.h"

namespace remat::cli {

namespace {

Tensor rnd(const Shape& s, uint32_t seed) {
  Tensor t = Tensor::empty(s);
  float* p = t.f32();
  uint32_t x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    p[i] = static_cast<float>(x >> 8) / 16777216.0f * 2.0f - 1.0f;
  }
  return t;
}

struct Case {
  std::string name;
  double flops;                                  // of forward + backward, for GFLOP/s (0 when not meaningful)
  std::function<std::function<void()>()> setup;  // returns the timed body
};

// GEMMs: a square one, and a linear layer's forward and backward.
void add_gemm_cases(Backend& be, std::vector<Case>& cs) {
  cs.push_back({"gemm_1024", 2.0 * 1024 * 1024 * 1024, [&be] {
                  auto a = std::make_shared<Tensor>(rnd({1024, 1024}, 1));
                  auto b = std::make_shared<Tensor>(rnd({1024, 1024}, 2));
                  auto c = std::make_shared<Tensor>(Tensor::empty({1024, 1024}));
                  return [&be, a, b, c] { be.gemm(*a, *b, *c, GemmParams{}); };
                }});
  cs.push_back({"linear_4096x1024x1024", 3 * 2.0 * 4096 * 1024 * 1024, [&be] {
                  auto x = std::make_shared<Tensor>(rnd({4096, 1024}, 1));
                  auto w = std::make_shared<Tensor>(rnd({1024, 1024}, 2));
                  auto b = std::make_shared<Tensor>(rnd({1024}, 3));
                  auto dw = std::make_shared<Tensor>(Tensor::zeros({1024, 1024}));
                  auto db = std::make_shared<Tensor>(Tensor::zeros({1024}));
                  return [&be, x, w, b, dw, db] {
                    Tensor y = ops::linear(be, *x, *w, *b);
                    Tensor dx = Tensor::empty(x->shape());
                    be.linear_backward(y, *x, *w, dx, *dw, *db);
                  };
                }});
}

// The CNN layers: a 3x3 convolution, models/fashion_cnn.json's two, max pooling, batch norm.
void add_cnn_cases(Backend& be, std::vector<Case>& cs) {
  cs.push_back({"conv_64x64x3x3_32x32_b64", 3 * 2.0 * 64 * 64 * 32 * 32 * 64 * 9, [&be] {
                  auto x = std::make_shared<Tensor>(rnd({64, 64, 32, 32}, 1));
                  auto w = std::make_shared<Tensor>(rnd({64, 64, 3, 3}, 2));
                  auto b = std::make_shared<Tensor>(rnd({64}, 3));
                  auto dw = std::make_shared<Tensor>(Tensor::zeros({64, 64, 3, 3}));
                  auto db = std::make_shared<Tensor>(Tensor::zeros({64}));
                  Conv2dParams p;
                  p.pad_h = p.pad_w = 1;
                  return [&be, x, w, b, dw, db, p] {
                    Tensor y = ops::conv2d(be, *x, *w, *b, p);
                    ops::conv2d_backward(be, y, *x, *w, p, true, *dw, *db);
                  };
                }});
  // The two convolutions of models/fashion_cnn.json at its batch (the first one's input is
  // the data, so its backward computes no dx).
  auto fashion_conv = [&cs, &be](const char* name, int64_t c, int64_t k, int64_t hw, bool need_dx) {
    cs.push_back({name, (need_dx ? 3 : 2) * 2.0 * 64 * k * c * 25 * hw * hw, [&be, c, k, hw, need_dx] {
                    auto x = std::make_shared<Tensor>(rnd({64, c, hw, hw}, 1));
                    auto w = std::make_shared<Tensor>(rnd({k, c, 5, 5}, 2));
                    auto b = std::make_shared<Tensor>(rnd({k}, 3));
                    auto dw = std::make_shared<Tensor>(Tensor::zeros({k, c, 5, 5}));
                    auto db = std::make_shared<Tensor>(Tensor::zeros({k}));
                    Conv2dParams p;
                    p.pad_h = p.pad_w = 2;
                    return [&be, x, w, b, dw, db, p, need_dx] {
                      Tensor y = ops::conv2d(be, *x, *w, *b, p);
                      ops::conv2d_backward(be, y, *x, *w, p, need_dx, *dw, *db);
                    };
                  }});
  };
  fashion_conv("conv_1x32x5x5_28x28_b64_nodx", 1, 32, 28, false);
  fashion_conv("conv_32x64x5x5_14x14_b64", 32, 64, 14, true);
  cs.push_back({"maxpool_2x2_b64_64x32x32", 0, [&be] {
                  auto x = std::make_shared<Tensor>(rnd({64, 64, 32, 32}, 1));
                  return [&be, x] {
                    auto r = ops::maxpool2d(be, *x, Pool2dParams{});
                    Tensor dx = Tensor::empty(x->shape());
                    be.maxpool2d_backward(r.y, r.indices, Pool2dParams{}, dx);
                  };
                }});
  cs.push_back({"batchnorm_b64_64x32x32", 0, [&be] {
                  auto x = std::make_shared<Tensor>(rnd({64, 64, 32, 32}, 1));
                  auto g = std::make_shared<Tensor>(Tensor::full({64}, 1.0f));
                  auto b = std::make_shared<Tensor>(Tensor::zeros({64}));
                  auto rm = std::make_shared<Tensor>(Tensor::zeros({64}));
                  auto rv = std::make_shared<Tensor>(Tensor::full({64}, 1.0f));
                  auto dg = std::make_shared<Tensor>(Tensor::zeros({64}));
                  auto dbeta = std::make_shared<Tensor>(Tensor::zeros({64}));
                  return [&be, x, g, b, rm, rv, dg, dbeta] {
                    auto r = ops::batchnorm2d_train(be, *x, *g, *b, *rm, *rv, BatchNormParams{});
                    Tensor dx = Tensor::empty(x->shape());
                    be.batchnorm2d_backward(r.y, *x, *g, r.mean, r.invstd, dx, *dg, *dbeta);
                  };
                }});
}

// The transformer's layers with parameters or heads: layer norm, attention.
void add_transformer_cases(Backend& be, std::vector<Case>& cs) {
  cs.push_back({"layernorm_16x256x256", 0, [&be] {
                  auto x = std::make_shared<Tensor>(rnd({16, 256, 256}, 1));
                  auto g = std::make_shared<Tensor>(Tensor::full({256}, 1.0f));
                  auto b = std::make_shared<Tensor>(Tensor::zeros({256}));
                  auto dg = std::make_shared<Tensor>(Tensor::zeros({256}));
                  auto db = std::make_shared<Tensor>(Tensor::zeros({256}));
                  return [&be, x, g, b, dg, db] {
                    auto r = ops::layernorm(be, *x, *g, *b);
                    Tensor dx = Tensor::empty(x->shape());
                    ops::layernorm_backward(be, r.y, *x, *g, r.mean, r.invstd, dx, *dg, *db);
                  };
                }});
  cs.push_back({"attention_16x256x256_h4", 3 * 4.0 * 16 * 256 * 256 * 256 * 0.5, [&be] {
                  auto qkv = std::make_shared<Tensor>(rnd({16, 256, 768}, 1));
                  AttentionParams p;
                  p.n_head = 4;
                  return [&be, qkv, p] {
                    auto r = ops::attention(be, *qkv, p, RngState{});
                    ops::attention_backward(be, r.out, *qkv, r.probs, p, RngState{});
                  };
                }});
  // The fused attention at the same shape, and at the GPT twin's (d 256, 8 heads of 32) T 1024,
  // with and without dropout on the probabilities (PyTorch's SDPA: tools/bench/bench_torch.py).
  auto fused = [&be](const std::string& name, int64_t b, int64_t t, int h, int64_t d, float dropout) {
    return Case{name, 3 * 4.0 * b * h * t * t * d * 0.5, [&be, b, t, h, d, dropout] {
                  auto qkv = std::make_shared<Tensor>(rnd({b, t, 3 * h * d}, 1));
                  const FlashAttentionParams p = FlashAttentionParams::packed(h, 0, d, true, dropout);
                  const RngState rng{1, 0};
                  return [&be, qkv, p, rng] {
                    auto r = ops::flash_attention(be, *qkv, *qkv, Tensor(), p, rng);
                    ops::flash_attention_backward(be, r.out, *qkv, *qkv, Tensor(), r.out, r.lse, p, rng);
                  };
                }};
  };
  cs.push_back(fused("flash_attention_16x256x256_h4", 16, 256, 4, 64, 0.0f));
  cs.push_back(fused("flash_attention_4x1024x256_h8", 4, 1024, 8, 32, 0.0f));
  cs.push_back(fused("flash_attention_4x1024x256_h8_p0.1", 4, 1024, 8, 32, 0.1f));
  cs.push_back({"attention_4x1024x256_h8", 3 * 4.0 * 4 * 1024 * 1024 * 256 * 0.5, [&be] {
                  auto qkv = std::make_shared<Tensor>(rnd({4, 1024, 768}, 1));
                  AttentionParams p;
                  p.n_head = 8;
                  return [&be, qkv, p] {
                    auto r = ops::attention(be, *qkv, p, RngState{});
                    ops::attention_backward(be, r.out, *qkv, r.probs, p, RngState{});
                  };
                }});
}

// Pointwise activations and dropout over 4 Mi elements.
void add_pointwise_cases(Backend& be, std::vector<Case>& cs) {
  cs.push_back({"gelu_4M", 0, [&be] {
                  auto x = std::make_shared<Tensor>(rnd({4096, 1024}, 1));
                  return [&be, x] {
                    Tensor y = ops::gelu(be, *x, GeluApprox::tanh);
                    Tensor dx = Tensor::empty(x->shape());
                    be.gelu_backward(y, *x, GeluApprox::tanh, dx);
                  };
                }});
  cs.push_back({"relu_4M", 0, [&be] {
                  auto x = std::make_shared<Tensor>(rnd({4096, 1024}, 1));
                  return [&be, x] {
                    Tensor y = ops::relu(be, *x);
                    Tensor dx = Tensor::empty(x->shape());
                    be.relu_backward(y, *x, dx);
                  };
                }});
  cs.push_back({"dropout_4M", 0, [&be] {
                  auto x = std::make_shared<Tensor>(rnd({4096, 1024}, 1));
                  return [&be, x] {
                    Tensor y = ops::dropout(be, *x, 0.1f, RngState{1, 0});
                    Tensor dx = Tensor::empty(x->shape());
                    be.dropout_backward(y, 0.1f, RngState{1, 0}, dx);
                  };
                }});
}

// Softmax, cross-entropy over 1024 classes, a GPT-2-vocabulary embedding.
void add_softmax_loss_embedding_cases(Backend& be, std::vector<Case>& cs) {
  cs.push_back({"softmax_4096x1024", 0, [&be] {
                  auto x = std::make_shared<Tensor>(rnd({4096, 1024}, 1));
                  return [&be, x] {
                    Tensor y = ops::softmax(be, *x);
                    Tensor dx = Tensor::empty(x->shape());
                    be.softmax_backward(y, y, false, dx);
                  };
                }});
  cs.push_back({"cross_entropy_4096x1024", 0, [&be] {
                  auto x = std::make_shared<Tensor>(rnd({4096, 1024}, 1));
                  std::vector<int32_t> t(4096);
                  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>(i * 37 % 1024);
                  auto tg = std::make_shared<Tensor>(Tensor::from_ints(t, {4096}));
                  return [&be, x, tg] {
                    auto r = ops::cross_entropy(be, *x, *tg);
                    Tensor dx = Tensor::empty(x->shape());
                    be.cross_entropy_backward(1.0f, *x, *tg, r.lse, -100, 0.0f, dx);
                  };
                }});
  cs.push_back({"embedding_16x256_v50257_c256", 0, [&be] {
                  std::vector<int32_t> ids(16 * 256);
                  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i * 7919 % 50257);
                  auto id = std::make_shared<Tensor>(Tensor::from_ints(ids, {16, 256}));
                  auto tab = std::make_shared<Tensor>(rnd({50257, 256}, 2));
                  auto pos = std::make_shared<Tensor>(rnd({256, 256}, 3));
                  auto dt = std::make_shared<Tensor>(Tensor::zeros({50257, 256}));
                  auto dp = std::make_shared<Tensor>(Tensor::zeros({256, 256}));
                  return [&be, id, tab, pos, dt, dp] {
                    Tensor y = ops::embedding(be, *id, *tab, *pos);
                    ops::embedding_backward(be, y, *id, *dt, *dp);
                  };
                }});
}

// The optimizer's update over 10 Mi parameters.
void add_optimizer_cases(Backend& be, std::vector<Case>& cs) {
  cs.push_back({"adamw_10M", 0, [&be] {
                  auto p = std::make_shared<Tensor>(rnd({10 << 20}, 1));
                  auto g = std::make_shared<Tensor>(rnd({10 << 20}, 2));
                  auto m = std::make_shared<Tensor>(Tensor::zeros({10 << 20}));
                  auto v = std::make_shared<Tensor>(Tensor::zeros({10 << 20}));
                  auto step = std::make_shared<int64_t>(0);
                  return [&be, p, g, m, v, step] { be.adamw_step(*p, *g, *m, *v, AdamWParams{}, ++*step); };
                }});
}

// Every case, in the order printed.
std::vector<Case> cases(Backend& be) {
  std::vector<Case> cs;
  add_gemm_cases(be, cs);
  add_cnn_cases(be, cs);
  add_transformer_cases(be, cs);
  add_pointwise_cases(be, cs);
  add_softmax_loss_embedding_cases(be, cs);
  add_optimizer_cases(be, cs);
  return cs;
}

// `remat bench link`: the host link's bandwidth each way, as activation offload uses it
// (pinned host memory from the backend's pool, copies on its copy stream, the compute
// stream waiting for each): the best of N timed rounds of one copy of SIZE each way.
struct LinkOptions {
  std::string device = "cuda", size = "256MiB";
  int repeat = 5;
};

int run_bench_link(const LinkOptions& o) {
  const Device dev = Device::parse(o.device);
  require_available(dev);
  Backend& be = backend_for(dev);
  const std::string why = be.offload_unsupported();
  REMAT_CHECK(why.empty(), "bench link on ", dev.str(), ": ", why, " (a GPU's link: --device cuda, or cuda-emu)");
  const int64_t bytes = parse_size(o.size);
  REMAT_CHECK(bytes >= 4, "bench link --size ", o.size, ": at least 4 bytes");
  CachingAllocator pool(Device::cpu(), be.make_pinned_allocator(static_cast<size_t>(bytes)));
  const AllocTag tag{MemoryCategory::temporary, "bench", Phase::setup};
  const Shape shape{bytes / 4};
  Tensor host = Tensor::empty_in(pool, shape, DType::f32, tag);
  Tensor device = Tensor::empty(shape, dev, DType::f32, tag);
  device.zero_();
  auto best_gbps = [&](bool out) {
    double best = 0.0;
    for (int r = 0; r <= o.repeat; ++r) {  // round 0 warms up
      be.synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      be.wait_copy(out ? be.copy_async(host, device) : be.copy_async(device, host));
      be.synchronize();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) best = std::max(best, static_cast<double>(host.nbytes()) / s / 1e9);
    }
    return best;
  };
  const double d2h = best_gbps(true), h2d = best_gbps(false);
  std::printf("remat bench link: %s, %s each way, best of %d\n", dev.str().c_str(),
              format_bytes(static_cast<int64_t>(host.nbytes())).c_str(), o.repeat);
  std::printf("device to host %8.2f GB/s\nhost to device %8.2f GB/s\n", d2h, h2d);
  std::printf("plan with it: remat plan CONFIG --offload --link-gbps %.1f\n", std::min(d2h, h2d));
  return 0;
}

}  // namespace

Runner add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench",
                                 "Benchmarks: `remat bench ops` times every op forward+backward, "
                                 "`remat bench kernels` the memory-bound ops of a device in GB/s, "
                                 "`remat bench link` the host link each way");
  auto* ops_cmd = cmd->add_subcommand("ops", "Time each CPU op forward + backward at realistic sizes");
  Runner kernels = add_bench_kernels_command(*cmd);  // bench_kernels.cpp
  auto* link_cmd = cmd->add_subcommand(
      "link", "The host link's bandwidth each way, as activation offload copies (pinned memory, copy stream)");
  auto link = std::make_shared<LinkOptions>();
  link_cmd->add_option("--device", link->device, "cuda[:N] or cuda-emu")->default_val("cuda");
  link_cmd->add_option("--size", link->size, "Bytes per copy, e.g. 256MiB")->default_val("256MiB");
  link_cmd->add_option("--repeat", link->repeat, "Timed rounds each way (the best is reported)")->check(positive());
  cmd->require_subcommand(1);
  auto filter = std::make_shared<std::string>();
  auto repeat = std::make_shared<int>(5);
  auto json = std::make_shared<std::string>();
  ops_cmd->add_option("--filter", *filter, "Only cases whose name contains this");
  ops_cmd->add_option("--repeat", *repeat, "Timed runs per case (the median is reported)")->check(CLI::PositiveNumber);
  ops_cmd->add_option("--json", *json, "Also write the results as JSON");
  return [ops_cmd, link_cmd, link, kernels, filter, repeat, json]() -> int {
    if (link_cmd->parsed()) return run_bench_link(*link);
    if (!ops_cmd->parsed()) return kernels();
    Backend& be = backend_for(Device::cpu());
    nlohmann::json out = {{"threads", omp_get_max_threads()}, {"cases", nlohmann::json::object()}};
    std::printf("remat bench ops: cpu backend, %d thread(s), median of %d\n", omp_get_max_threads(), *repeat);
    std::printf("%-32s %12s %12s\n", "case", "ms", "GFLOP/s");
    for (auto& c : cases(be)) {
      if (!filter->empty() && c.name.find(*filter) == std::string::npos) continue;
      auto body = c.setup();
      body();  // warm-up (and the allocator's cache)
      std::vector<double> ms;
      for (int r = 0; r < *repeat; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        body();
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(ms.begin(), ms.end());
      const double med = ms[ms.size() / 2];
      if (c.flops > 0)
        std::printf("%-32s %12.3f %12.1f\n", c.name.c_str(), med, c.flops / med / 1e6);
      else
        std::printf("%-32s %12.3f %12s\n", c.name.c_str(), med, "-");
      std::fflush(stdout);
      out["cases"][c.name] = med;
    }
    if (!json->empty()) write_file_atomic(*json, out.dump(2) + "\n");
    return 0;
  };
}

}  // namespace remat::cli
