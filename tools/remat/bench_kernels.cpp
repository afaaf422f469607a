// `remat bench kernels`: the memory-bound ops of a backend at a size far beyond the L2
// cache (64 Mi elements by default), each as the bytes it must move over its median time
// in GB/s and as a share of the device's peak memory bandwidth; and a GEMM line in
// TFLOP/s (fp32, TF32 on a GPU, bf16 with fp32 accumulation: square and GPT-2 124M's
// shapes, as a share of the datasheet's dense bf16 peak).
//
// On a GPU (device cuda) each timed run is bracketed by CUDA events on the backend's
// stream, after a write of twice the L2 size so that no run finds its inputs in the L2.
// The peak is read from the device: 2 (double data rate) x memory clock x bus width.
// Elsewhere (cuda-emu, cpu) ops are synchronous and host clocks time them; there is no
// L2 flush and no peak.
//
// On cuda-emu, one more run of each op is counted by the emulator (Backend::take_traffic):
// per kernel, its warp accesses' requested bytes and 32-byte sectors, so the table shows
// each op's coalescing efficiency (requested / sector bytes) and the time an H200 would
// take to move those sector bytes at 4.8 TB/s (docs/kernels.md, "Coalescing").
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "remat/backend.h"
#include "remat/bf16.h"
#include "remat/error.h"
#include "remat/io.h"

namespace remat::cli {

namespace {

// Uniform values in [lo, hi) from a fixed LCG: the same data every run.
Tensor uniform(const Shape& s, uint32_t seed, float lo, float hi, Device dev) {
  Tensor host = Tensor::empty(s);
  float* p = host.f32();
  uint32_t x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < host.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    p[i] = lo + (hi - lo) * static_cast<float>(x >> 8) / 16777216.0f;
  }
  return dev.is_cpu() ? host : host.to(dev);
}

// What the device can move, for the "% of peak" column.
struct Peak {
  double gbps = 0;       // 0: unknown
  std::string source;    // where the figure came from
  int64_t l2_bytes = 0;  // 0: no L2 flush
  std::string device_name;
};

// Times a body on the backend's device (Backend::time_ms: CUDA events on a GPU, host
// clocks elsewhere), evicting the device's caches before each run.
class Timer {
 public:
  explicit Timer(Backend& be) : be_(be), props_(be.properties()) {}

  bool gpu() const { return props_.device_clock; }
  int64_t l2_bytes() const { return props_.cache_bytes; }
  const Backend::Properties& properties() const { return props_; }

  // Milliseconds of one run of `body`.
  double time_ms(const std::function<void()>& body) {
    be_.flush_caches();
    return be_.time_ms(body);
  }

  // TF32 GEMMs on a GPU; false (nothing changed) elsewhere.
  bool set_tf32(bool on) { return be_.set_tf32(on); }
  bool tf32() const { return be_.tf32(); }

 private:
  Backend& be_;
  Backend::Properties props_;
};

Peak device_peak(Device d, double override_gbps, const Timer& timer) {
  Peak p;
  p.l2_bytes = timer.l2_bytes();
  const Backend::Properties& props = timer.properties();
  p.device_name = props.name.empty() ? d.str() : props.name;
  if (props.memory_gbps > 0) {
    p.gbps = props.memory_gbps;
    p.source = props.gbps_source;
  } else if (props.device_clock) {
    p.source = props.gbps_source + " (give --peak-gbps)";
  }
  if (override_gbps > 0) {
    p.gbps = override_gbps;
    p.source = "--peak-gbps";
  }
  if (p.gbps == 0 && p.source.empty()) p.source = "none on " + d.str() + " (give --peak-gbps)";
  return p;
}

// The H200's memory bandwidth (HBM3e, 4.8 TB/s), for the projected time of counted bytes.
constexpr double kH200BytesPerSecond = 4.8e12;

// Global-memory traffic of one run of `body`, per kernel (empty where it cannot be counted).
std::vector<Backend::KernelTraffic> count_traffic(Backend& be, const std::function<void()>& body) {
  be.take_traffic();  // nothing left over
  if (!be.count_traffic(true)) return {};
  try {
    body();
    be.synchronize();
  } catch (...) {
    be.count_traffic(false);
    throw;
  }
  be.count_traffic(false);
  return be.take_traffic();
}

double h200_us(int64_t sectors) { return 32.0 * static_cast<double>(sectors) / kH200BytesPerSecond * 1e6; }

// One benchmark: the tensors it needs are made by setup(), which returns the timed body.
struct KernelCase {
  std::string name;
  std::string shape;
  int64_t elements = 0;  // of the main tensor
  double bytes = 0;      // moved by one run: reads + writes
  std::string formula;   // how `bytes` is counted
  std::function<std::function<void()>()> setup;
};

// The memory-bound ops at about n elements (rows of a realistic width where the op has
// rows). Byte counts are what each op must read and write at least, in 4-byte elements;
// dropout's mask is regenerated from its Philox state, never stored.
std::vector<KernelCase> kernel_cases(Backend& be, int64_t n) {
  const Device d = be.device();
  std::vector<KernelCase> cs;
  auto flat = [&](const char* name, int reads, int writes, std::function<std::function<void()>(Shape)> make) {
    cs.push_back({name, "[" + std::to_string(n) + "]", n, 4.0 * (reads + writes) * static_cast<double>(n),
                  "4 B x (" + std::to_string(reads) + " reads + " + std::to_string(writes) + " writes) x N",
                  [make, n] { return make(Shape{n}); }});
  };
  flat("add", 2, 1, [&be, d](Shape s) {
    auto a = std::make_shared<Tensor>(uniform(s, 1, -1, 1, d));
    auto b = std::make_shared<Tensor>(uniform(s, 2, -1, 1, d));
    auto y = std::make_shared<Tensor>(Tensor::empty(s, d));
    return [&be, a, b, y] { be.add(*a, *b, *y); };
  });
  flat("accumulate", 2, 1, [&be, d](Shape s) {  // dst += src: reads dst and src, writes dst
    auto dst = std::make_shared<Tensor>(uniform(s, 1, -1, 1, d));
    auto src = std::make_shared<Tensor>(uniform(s, 2, -1e-3f, 1e-3f, d));
    return [&be, dst, src] { be.accumulate(*dst, *src); };
  });
  flat("scale", 1, 1, [&be, d](Shape s) {
    auto x = std::make_shared<Tensor>(uniform(s, 1, -1, 1, d));
    auto y = std::make_shared<Tensor>(Tensor::empty(s, d));
    return [&be, x, y] { be.scale(*x, 0.5f, *y); };
  });
  flat("relu_fwd", 1, 1, [&be, d](Shape s) {
    auto x = std::make_shared<Tensor>(uniform(s, 1, -1, 1, d));
    auto y = std::make_shared<Tensor>(Tensor::empty(s, d));
    return [&be, x, y] { be.relu_forward(*x, *y); };
  });
  flat("gelu_fwd_tanh", 1, 1, [&be, d](Shape s) {
    auto x = std::make_shared<Tensor>(uniform(s, 1, -3, 3, d));
    auto y = std::make_shared<Tensor>(Tensor::empty(s, d));
    return [&be, x, y] { be.gelu_forward(*x, GeluApprox::tanh, *y); };
  });
  flat("dropout_fwd_p0.1", 1, 1, [&be, d](Shape s) {
    auto x = std::make_shared<Tensor>(uniform(s, 1, -1, 1, d));
    auto y = std::make_shared<Tensor>(Tensor::empty(s, d));
    return [&be, x, y] { be.dropout_forward(*x, 0.1f, RngState{1, 0}, *y); };
  });
  {
    // rows of GPT-2 small's width: x [R, C]; reads x, gamma, beta; writes y, mean, rstd.
    const int64_t c = 768, r = std::max<int64_t>(n / c, 1);
    cs.push_back({"layernorm_fwd", "[" + std::to_string(r) + ", " + std::to_string(c) + "]", r * c,
                  4.0 * (2.0 * r * c + 2.0 * c + 2.0 * r), "4 B x (2 R C + 2 C + 2 R): x, y; gamma, beta; mean, rstd",
                  [&be, d, r, c] {
                    auto x = std::make_shared<Tensor>(uniform(Shape{r, c}, 1, -1, 1, d));
                    auto g = std::make_shared<Tensor>(uniform(Shape{c}, 2, 0.5f, 1.5f, d));
                    auto b = std::make_shared<Tensor>(uniform(Shape{c}, 3, -0.1f, 0.1f, d));
                    auto y = std::make_shared<Tensor>(Tensor::empty(Shape{r, c}, d));
                    auto mean = std::make_shared<Tensor>(Tensor::empty(Shape{r}, d));
                    auto rstd = std::make_shared<Tensor>(Tensor::empty(Shape{r}, d));
                    return [&be, x, g, b, y, mean, rstd] {
                      be.layernorm_forward(*x, *g, *b, LayerNormParams{1e-5f}, *y, *mean, *rstd);
                    };
                  }});
  }
  {
    // rows of attention scores at context 1024: reads x, writes y.
    const int64_t c = 1024, r = std::max<int64_t>(n / c, 1);
    cs.push_back({"softmax_fwd", "[" + std::to_string(r) + ", " + std::to_string(c) + "]", r * c, 4.0 * 2.0 * r * c,
                  "4 B x 2 R C: x, y", [&be, d, r, c] {
                    auto x = std::make_shared<Tensor>(uniform(Shape{r, c}, 1, -4, 4, d));
                    auto y = std::make_shared<Tensor>(Tensor::empty(Shape{r, c}, d));
                    return [&be, x, y] { be.softmax_forward(*x, false, *y); };
                  }});
  }
  {
    // GPT-2's vocabulary: logits [R, V] are read once (a logsumexp per row); the row's
    // target in, its lse and the mean loss out. Memory-bound like softmax.
    const int64_t v = 50257, r = std::max<int64_t>(n / v, 1);
    cs.push_back({"cross_entropy_fwd", "[" + std::to_string(r) + ", " + std::to_string(v) + "]", r * v,
                  4.0 * (static_cast<double>(r) * v + 2.0 * r + 1.0),
                  "4 B x (R V + 2 R + 1): logits; targets, lse; loss", [&be, d, r, v] {
                    auto x = std::make_shared<Tensor>(uniform(Shape{r, v}, 1, -4, 4, d));
                    std::vector<int32_t> t(static_cast<size_t>(r));
                    for (size_t i = 0; i < t.size(); ++i)
                      t[i] = static_cast<int32_t>((i * 7919) % static_cast<size_t>(v));
                    auto tg = std::make_shared<Tensor>(Tensor::from_ints(t, Shape{r}, d));
                    auto loss = std::make_shared<Tensor>(Tensor::empty(Shape{1}, d));
                    auto lse = std::make_shared<Tensor>(Tensor::empty(Shape{r}, d));
                    return [&be, x, tg, loss, lse] { be.cross_entropy_forward(*x, *tg, -100, *loss, *lse); };
                  }});
  }
  {
    // the bias gradient of a GPT-2-wide linear layer: db [C] += column sums of dy [R, C]
    // (linear_backward with only db); reads dy, reads and writes db.
    const int64_t c = 768, r = std::max<int64_t>(n / c, 1);
    cs.push_back({"bias_grad", "[" + std::to_string(r) + ", " + std::to_string(c) + "]", r * c,
                  4.0 * (static_cast<double>(r) * c + 2.0 * c), "4 B x (R C + 2 C): dy; db read and written",
                  [&be, d, r, c] {
                    auto dy = std::make_shared<Tensor>(uniform(Shape{r, c}, 1, -1, 1, d));
                    auto x = std::make_shared<Tensor>(Tensor::empty(Shape{r, c}, d));
                    auto w = std::make_shared<Tensor>(Tensor::empty(Shape{c, c}, d));
                    auto db = std::make_shared<Tensor>(Tensor::zeros(Shape{c}, d));
                    return [&be, dy, x, w, db] { be.linear_backward(*dy, *x, *w, Tensor(), Tensor(), *db); };
                  }});
  }
  flat("adamw_step", 4, 3, [&be, d](Shape s) {  // reads param, grad, m, v; writes param, m, v
    auto p = std::make_shared<Tensor>(uniform(s, 1, -1, 1, d));
    auto g = std::make_shared<Tensor>(uniform(s, 2, -1e-2f, 1e-2f, d));
    auto m = std::make_shared<Tensor>(uniform(s, 3, -1e-3f, 1e-3f, d));
    auto v = std::make_shared<Tensor>(uniform(s, 4, 0, 1e-4f, d));
    auto step = std::make_shared<int64_t>(0);
    return [&be, p, g, m, v, step] { be.adamw_step(*p, *g, *m, *v, AdamWParams{}, ++*step); };
  });
  return cs;
}

struct Options {
  std::string device = "cuda";
  int64_t elements = int64_t{1} << 26;  // 64 Mi
  int64_t gemm = 8192;
  int iters = 20;
  int warmup = 2;
  double peak_gbps = 0;
  double peak_bf16_tflops = 0;
  std::string filter;
  std::string json;
};

// The median of `iters` timed runs after `warmup` untimed ones.
std::vector<double> time_runs(Timer& timer, const std::function<void()>& body, const Options& o) {
  for (int i = 0; i < o.warmup; ++i) timer.time_ms(body);
  std::vector<double> ms;
  for (int i = 0; i < o.iters; ++i) ms.push_back(timer.time_ms(body));
  std::sort(ms.begin(), ms.end());
  return ms;
}

double median(const std::vector<double>& sorted) {
  const size_t n = sorted.size();
  return n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

// The GEMM lines: a square fp32 and TF32 GEMM of side `size` (A B, both row-major: the
// layout of the earlier figures), the same in bf16, and the bf16 GEMMs of a GPT-2 124M step
// at `size` tokens (8192: batch 8 of 1024) as a linear layer runs them, y = x wᵀ (weights
// [out, in]): the attention input projection, the MLP's two, the LM head (vocabulary
// padded to 50304, as llm.c does).
struct GemmCase {
  std::string name;
  int64_t m, n, k;
  bool bf16, tf32, trans_b;
};

std::vector<GemmCase> gemm_cases(int64_t size) {
  return {{"gemm_fp32", size, size, size, false, false, false},
          {"gemm_tf32", size, size, size, false, true, false},
          {"gemm_bf16", size, size, size, true, false, false},
          {"gpt2_qkv_bf16", size, 3 * 768, 768, true, false, true},
          {"gpt2_fc_bf16", size, 4 * 768, 768, true, false, true},
          {"gpt2_proj_bf16", size, 768, 4 * 768, true, false, true},
          {"gpt2_lm_head_bf16", size, 50304, 768, true, false, true}};
}

// A GEMM operand: uniform(-1, 1) values, rounded to bf16 where asked.
Tensor operand(const Shape& s, uint32_t seed, bool bf16, Device dev) {
  Tensor f = uniform(s, seed, -1, 1, Device::cpu());
  if (!bf16) return dev.is_cpu() ? f : f.to(dev);
  Tensor h = Tensor::empty(s, Device::cpu(), DType::bf16);
  const float* src = f.f32();
  uint16_t* dst = h.bf16();
  for (int64_t i = 0; i < h.numel(); ++i) dst[i] = bf16_from_float(src[i]);
  return dev.is_cpu() ? h : h.to(dev);
}

// Dense (no sparsity) bf16 tensor-core peak of the GPUs we meet, from NVIDIA's datasheets;
// 0 for the others (give --peak-bf16-tflops).
double datasheet_bf16_tflops(const std::string& name) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if ((has("H100") || has("H200")) && has("NVL")) return 835.0;  // before the SXM parts' figure
  if (has("H100") && has("PCIe")) return 756.0;
  if (has("H100") || has("H200")) return 989.4;
  if (has("A100")) return 312.0;
  return 0;
}

int run_kernels(const Options& o) {
  const Device dev = Device::parse(o.device);
  REMAT_CHECK(!dev.is_meta(), "bench kernels: meta holds no data; use cuda, cuda-emu or cpu");
  Backend& be = backend_for(dev);
  Timer timer(be);
  const Peak peak = device_peak(dev, o.peak_gbps, timer);

  std::printf("remat bench kernels: %s backend on %s, median of %d runs after %d warm-up(s), %s\n", be.name().c_str(),
              peak.device_name.c_str(), o.iters, o.warmup,
              timer.gpu() ? "timed with CUDA events" : "timed with host clocks");
  if (peak.l2_bytes > 0)
    std::printf("L2 %.1f MiB, flushed before every timed run (a %.1f MiB write)\n", peak.l2_bytes / 1048576.0,
                2.0 * peak.l2_bytes / 1048576.0);
  else
    std::printf("no L2 flush between runs\n");
  if (peak.gbps > 0)
    std::printf("peak bandwidth %.1f GB/s, from %s\n", peak.gbps, peak.source.c_str());
  else
    std::printf("peak bandwidth unknown: %s\n", peak.source.c_str());
  if (dev.is_cuda_emu() && o.elements > (int64_t{1} << 20))
    std::printf("note: the emulator runs every CUDA thread on the host; use --elements <= 1M for a smoke test\n");
  const bool traffic = be.count_traffic(false);
  if (traffic)
    std::printf(
        "coalescing: one more run of each op counted by the emulator (requested / 32-byte sector bytes of every "
        "warp access); H200 us: its sector bytes at 4.8 TB/s; a line per kernel where an op has several\n");
  std::printf("\n%-20s %-18s %10s %10s %10s %8s %9s %9s\n", "kernel", "shape", "MB moved", "ms", "GB/s", "% peak",
              "coalesced", "H200 us");

  nlohmann::json out = {{"device", dev.str()},
                        {"device_name", peak.device_name},
                        {"backend", be.name()},
                        {"timing", timer.gpu() ? "cudaEvent" : "host clock"},
                        {"iters", o.iters},
                        {"warmup", o.warmup},
                        {"elements", o.elements},
                        {"l2_bytes", peak.l2_bytes},
                        {"l2_flush", peak.l2_bytes > 0},
                        {"peak_gbps", peak.gbps},
                        {"peak_source", peak.source},
                        {"traffic_counted", traffic},
                        {"h200_bytes_per_second", kH200BytesPerSecond},
                        {"kernels", nlohmann::json::array()},
                        {"gemm", nlohmann::json::array()}};
  int failed = 0, skipped = 0;
  // Failures print their reason under the row; skips (a case the device cannot run) only count.
  auto report_error = [&](nlohmann::json& rec, const char* status, const std::string& what) {
    rec["status"] = status;
    rec["reason"] = what;
    if (rec["status"] == "failed")
      std::printf("  failed: %s\n", what.c_str());
    else
      ++skipped;
  };

  for (const auto& c : kernel_cases(be, o.elements)) {
    if (!o.filter.empty() && c.name.find(o.filter) == std::string::npos) continue;
    nlohmann::json rec = {{"name", c.name},
                          {"shape", c.shape},
                          {"elements", c.elements},
                          {"bytes", c.bytes},
                          {"bytes_formula", c.formula}};
    std::printf("%-20s %-18s %10.1f ", c.name.c_str(), c.shape.c_str(), c.bytes / 1e6);
    std::fflush(stdout);
    try {
      auto body = c.setup();
      const auto ms = time_runs(timer, body, o);
      const double med = median(ms), gbps = c.bytes / (med * 1e-3) / 1e9;
      rec.update({{"status", "ok"}, {"median_ms", med}, {"min_ms", ms.front()}, {"gbps", gbps}});
      if (peak.gbps > 0) rec["pct_peak"] = 100.0 * gbps / peak.gbps;
      std::printf("%10.4f %10.1f ", med, gbps);
      if (peak.gbps > 0)
        std::printf("%7.1f%%", 100.0 * gbps / peak.gbps);
      else
        std::printf("%8s", "-");
      const std::vector<Backend::KernelTraffic> ts =
          traffic ? count_traffic(be, body) : std::vector<Backend::KernelTraffic>{};
      int64_t requested = 0, sectors = 0;
      nlohmann::json kernels = nlohmann::json::array();
      for (const auto& t : ts) {
        requested += t.requested_bytes;
        sectors += t.sectors;
        kernels.push_back({{"kernel", t.kernel},
                           {"launches", t.launches},
                           {"warp_accesses", t.warp_accesses},
                           {"requested_bytes", t.requested_bytes},
                           {"sector_bytes", 32 * t.sectors},
                           {"efficiency", t.efficiency()},
                           {"h200_us", h200_us(t.sectors)},
                           {"worst_site", t.worst_site},
                           {"worst_site_efficiency", t.worst_site_efficiency}});
      }
      if (sectors > 0) {
        const double eff = static_cast<double>(requested) / (32.0 * static_cast<double>(sectors));
        rec.update({{"traffic", kernels},
                    {"coalescing_efficiency", eff},
                    {"sector_bytes", 32 * sectors},
                    {"h200_us", h200_us(sectors)}});
        std::printf(" %8.1f%% %9.2f\n", 100.0 * eff, h200_us(sectors));
        if (ts.size() > 1) {
          for (const auto& t : ts)
            std::printf("  . %-77s %8.1f%% %9.2f\n", t.kernel.c_str(), 100.0 * t.efficiency(), h200_us(t.sectors));
        }
      } else {
        std::printf(" %9s %9s\n", "-", "-");
      }
    } catch (const Error& e) {
      std::printf("%10s %10s %8s\n", "FAILED", "-", "-");
      report_error(rec, "failed", e.what());
      ++failed;
    }
    std::fflush(stdout);
    out["kernels"].push_back(rec);
  }

  if (o.gemm > 0 && (o.filter.empty() || std::string("gemm").find(o.filter) != std::string::npos)) {
    const double bf16_peak = o.peak_bf16_tflops > 0 ? o.peak_bf16_tflops : datasheet_bf16_tflops(peak.device_name);
    const std::string bf16_peak_source = o.peak_bf16_tflops > 0 ? "--peak-bf16-tflops"
                                         : bf16_peak > 0        ? "datasheet of " + peak.device_name
                                                                : "unknown (give --peak-bf16-tflops)";
    out["peak_bf16_tflops"] = bf16_peak;
    out["peak_bf16_source"] = bf16_peak_source;
    std::printf("\n%-20s %-18s %10s %10s %10s %8s\n", "gemm", "m x n x k", "GFLOP", "ms", "TFLOP/s", "% bf16");
    if (bf16_peak > 0)
      std::printf("(%% bf16: of the dense bf16 peak, %.0f TFLOP/s, %s)\n", bf16_peak, bf16_peak_source.c_str());
    const bool tf32_before = timer.tf32();
    for (const GemmCase& g : gemm_cases(o.gemm)) {
      const double flops = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
      const std::string shape = std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k);
      nlohmann::json rec = {{"name", g.name},
                            {"m", g.m},
                            {"n", g.n},
                            {"k", g.k},
                            {"dtype", g.bf16 ? "bf16" : "f32"},
                            {"layout", g.trans_b ? "A B^T" : "A B"},
                            {"flops", flops}};
      std::printf("%-20s %-18s %10.1f ", g.name.c_str(), shape.c_str(), flops / 1e9);
      std::fflush(stdout);
      if (g.tf32 && !timer.gpu()) {
        std::printf("%10s %10s\n", "skipped", "-");
        report_error(rec, "skipped", "TF32 needs the CUDA backend on a GPU");
        out["gemm"].push_back(rec);
        continue;
      }
      timer.set_tf32(g.tf32);
      std::optional<ActivationDTypeScope> bf16_scope;  // the ops take bf16 inside it (training.precision bf16)
      if (g.bf16) bf16_scope.emplace(DType::bf16);
      try {
        auto a = std::make_shared<Tensor>(operand(Shape{g.m, g.k}, 1, g.bf16, dev));
        auto b = std::make_shared<Tensor>(operand(g.trans_b ? Shape{g.n, g.k} : Shape{g.k, g.n}, 2, g.bf16, dev));
        auto cc = std::make_shared<Tensor>(Tensor::empty(Shape{g.m, g.n}, dev, a->dtype()));
        GemmParams gp;
        gp.trans_b = g.trans_b;
        const auto ms = time_runs(
            timer, [&] { be.gemm(*a, *b, *cc, gp); }, o);
        const double med = median(ms), tflops = flops / (med * 1e-3) / 1e12;
        rec.update({{"status", "ok"}, {"median_ms", med}, {"min_ms", ms.front()}, {"tflops", tflops}});
        std::printf("%10.3f %10.2f", med, tflops);
        if (g.bf16 && bf16_peak > 0) {
          rec["pct_bf16_peak"] = 100.0 * tflops / bf16_peak;
          std::printf(" %7.1f%%", 100.0 * tflops / bf16_peak);
        }
        std::printf("\n");
      } catch (const Error& e) {
        std::printf("%10s %10s\n", "FAILED", "-");
        report_error(rec, "failed", e.what());
        ++failed;
      }
      std::fflush(stdout);
      out["gemm"].push_back(rec);
    }
    timer.set_tf32(tf32_before);
  }

  if (!o.json.empty()) write_file_atomic(o.json, out.dump(2) + "\n");
  if (skipped)
    std::printf("\n%d benchmark(s) skipped: not supported by the %s backend (reasons in --json)\n", skipped,
                be.name().c_str());
  if (failed) std::printf("\n%d benchmark(s) failed\n", failed);
  return failed ? 1 : 0;
}

}  // namespace

Runner add_bench_kernels_command(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("kernels",
                                   "Memory-bound ops at 64 Mi elements: GB/s and % of the device's peak bandwidth; "
                                   "GEMM TFLOP/s");
  auto o = std::make_shared<Options>();
  cmd->add_option("--device", o->device, "cuda, cuda:N, cuda-emu (small --elements) or cpu")->default_val("cuda");
  cmd->add_option("--elements", o->elements,
                  "Elements of each op's main tensor (rows of a fixed width for "
                  "layernorm, softmax, cross-entropy)")
      ->default_val(o->elements)
      ->check(CLI::PositiveNumber);
  cmd->add_option("--gemm-size", o->gemm,
                  "Side of the square GEMMs (fp32, TF32, bf16) and tokens (m) of the GPT-2 bf16 GEMMs (0: no GEMM)")
      ->default_val(o->gemm)
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--iters", o->iters, "Timed runs per op (the median is reported)")
      ->default_val(o->iters)
      ->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", o->warmup, "Untimed runs before them")
      ->default_val(o->warmup)
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--peak-gbps", o->peak_gbps, "Peak memory bandwidth in GB/s (default: read from the device)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--peak-bf16-tflops", o->peak_bf16_tflops,
                  "Dense bf16 peak in TFLOP/s for the % column (default: the datasheet of an H100/H200/A100)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--filter", o->filter, "Only benchmarks whose name contains this");
  cmd->add_option("--json", o->json, "Also write the results as JSON");
  return [cmd, o]() -> int {
    if (!cmd->parsed()) return -1;
    return run_kernels(*o);
  };
}

}  // namespace remat::cli
