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
// The cases are remat/bench_cases.h's, which the op tests also check against the cpu and
// time in their perf mode (tests/backend_ops/cases_bench.cpp).
//
// On cuda-emu, one more run of each op is counted by the emulator (BackendTuning::take_traffic):
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
#include "remat/backend_tuning.h"
#include "remat/bench_cases.h"
#include "remat/error.h"
#include "remat/io.h"

namespace remat::cli {

namespace {

// What the device can move, for the "% of peak" column.
struct Peak {
  double gbps = 0;       // 0: unknown
  std::string source;    // where the figure came from
  int64_t l2_bytes = 0;  // 0: no L2 flush
  std::string device_name;
};

// Times a body on the backend's device (BackendTuning::time_ms: CUDA events on a GPU, host
// clocks elsewhere), evicting the device's caches before each run.
class Timer {
 public:
  explicit Timer(Backend& be) : tuning_(be.tuning()), props_(tuning_.properties()) {}

  bool gpu() const { return props_.device_clock; }
  int64_t l2_bytes() const { return props_.cache_bytes; }
  const BackendTuning::Properties& properties() const { return props_; }

  // Milliseconds of one run of `body`.
  double time_ms(const std::function<void()>& body) {
    tuning_.flush_caches();
    return tuning_.time_ms(body);
  }

  // TF32 GEMMs on a GPU; false (nothing changed) elsewhere.
  bool set_tf32(bool on) { return tuning_.set_tf32(on); }
  bool tf32() const { return tuning_.tf32(); }

 private:
  BackendTuning& tuning_;
  BackendTuning::Properties props_;
};

Peak device_peak(Device d, double override_gbps, const Timer& timer) {
  Peak p;
  p.l2_bytes = timer.l2_bytes();
  const BackendTuning::Properties& props = timer.properties();
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
std::vector<BackendTuning::KernelTraffic> count_traffic(Backend& be, const std::function<void()>& body) {
  BackendTuning& tuning = be.tuning();
  tuning.take_traffic();  // nothing left over
  if (!tuning.count_traffic(true)) return {};
  try {
    body();
    be.synchronize();
  } catch (...) {
    tuning.count_traffic(false);
    throw;
  }
  tuning.count_traffic(false);
  return tuning.take_traffic();
}

double h200_us(int64_t sectors) { return 32.0 * static_cast<double>(sectors) / kH200BytesPerSecond * 1e6; }

// The tensors of a case on the backend's device, and the timed body over them.
std::function<void()> bench_body(Backend& be, const BenchCase& c) {
  std::vector<Tensor> tensors;
  for (const BenchTensor& t : c.tensors) tensors.push_back(make_bench_tensor(t, be.device()));
  return [&be, tensors, run = c.run] { run(be, tensors); };
}

struct Options {
  std::string device = "cuda";
  int64_t elements = int64_t{1} << 26;  // 64 Mi
  int64_t gemm = 8192;
  int64_t attention_tokens = 16384;  // per fused attention run (0: none)
  std::vector<int64_t> attention_seqs{1024, 4096};
  int64_t attention_width = 2048;  // heads x head dim
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

// What the runs came to: a failure prints its reason under its row; a skip (a case the
// device cannot run) only counts. Both go into the row's JSON record.
struct Tally {
  int failed = 0, skipped = 0;
  void fail(nlohmann::json& rec, const std::string& what) {
    rec["status"] = "failed";
    rec["reason"] = what;
    std::printf("  failed: %s\n", what.c_str());
    ++failed;
  }
  void skip(nlohmann::json& rec, const std::string& what) {
    rec["status"] = "skipped";
    rec["reason"] = what;
    ++skipped;
  }
};

// The lines above the kernel table: the backend and device, the timer, the L2 flush, the
// peak and where it came from.
void print_preamble(const Backend& be, const Device& dev, const Options& o, const Timer& timer, const Peak& peak,
                    bool traffic) {
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
  if (traffic)
    std::printf(
        "coalescing: one more run of each op counted by the emulator (requested / 32-byte sector bytes of every "
        "warp access); H200 us: its sector bytes at 4.8 TB/s; a line per kernel where an op has several\n");
}

// The --json report's header fields (its "kernels" and "gemm" rows come later).
nlohmann::json report_header(const Backend& be, const Device& dev, const Options& o, const Timer& timer,
                             const Peak& peak, bool traffic) {
  return {{"device", dev.str()},
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
}

// The coalescing columns of a kernel row from the kernels one run launched: the op's
// efficiency and H200 time, and a line per kernel where it launched several.
void report_traffic(const std::vector<BackendTuning::KernelTraffic>& ts, nlohmann::json& rec) {
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
  if (sectors == 0) {
    std::printf(" %9s %9s\n", "-", "-");
    return;
  }
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
}

// One memory-bound case: its row of the table and its JSON record.
nlohmann::json run_kernel_case(Backend& be, Timer& timer, const BenchCase& c, const Options& o, const Peak& peak,
                               bool traffic, Tally& tally) {
  nlohmann::json rec = {
      {"name", c.name}, {"shape", c.shape}, {"elements", c.elements}, {"bytes", c.bytes}, {"bytes_formula", c.formula}};
  std::printf("%-20s %-18s %10.1f ", c.name.c_str(), c.shape.c_str(), c.bytes / 1e6);
  std::fflush(stdout);
  try {
    const std::function<void()> body = bench_body(be, c);
    const auto ms = time_runs(timer, body, o);
    const double med = median(ms), gbps = c.bytes / (med * 1e-3) / 1e9;
    rec.update({{"status", "ok"}, {"median_ms", med}, {"min_ms", ms.front()}, {"gbps", gbps}});
    if (peak.gbps > 0) rec["pct_peak"] = 100.0 * gbps / peak.gbps;
    std::printf("%10.4f %10.1f ", med, gbps);
    if (peak.gbps > 0)
      std::printf("%7.1f%%", 100.0 * gbps / peak.gbps);
    else
      std::printf("%8s", "-");
    report_traffic(traffic ? count_traffic(be, body) : std::vector<BackendTuning::KernelTraffic>{}, rec);
  } catch (const Error& e) {
    std::printf("%10s %10s %8s\n", "FAILED", "-", "-");
    tally.fail(rec, e.what());
  }
  std::fflush(stdout);
  return rec;
}

// One GEMM case: its row of the GEMM table and its JSON record (bf16_peak: TFLOP/s, 0:
// unknown).
nlohmann::json run_gemm_case(Backend& be, Timer& timer, const GemmBenchCase& g, const Options& o, double bf16_peak,
                             Tally& tally) {
  const Device dev = be.device();
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
    tally.skip(rec, "TF32 needs the CUDA backend on a GPU");
    return rec;
  }
  timer.set_tf32(g.tf32);
  std::optional<ActivationDTypeScope> bf16_scope;  // the ops take bf16 inside it (training.precision bf16)
  if (g.bf16) bf16_scope.emplace(DType::bf16);
  try {
    auto a = std::make_shared<Tensor>(gemm_bench_operand(Shape{g.m, g.k}, 1, g.bf16, dev));
    auto b =
        std::make_shared<Tensor>(gemm_bench_operand(g.trans_b ? Shape{g.n, g.k} : Shape{g.k, g.n}, 2, g.bf16, dev));
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
    tally.fail(rec, e.what());
  }
  std::fflush(stdout);
  return rec;
}

// The GEMM table, against the dense bf16 peak (--peak-bf16-tflops, else the datasheet's);
// TF32 as it was afterwards.
void run_gemm_cases(Backend& be, Timer& timer, const Options& o, const Peak& peak, nlohmann::json& out, Tally& tally) {
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
  for (const GemmBenchCase& g : gemm_bench_cases(o.gemm))
    out["gemm"].push_back(run_gemm_case(be, timer, g, o, bf16_peak, tally));
  timer.set_tf32(tf32_before);
}

// One fused attention case: forward, then forward + backward, in TFLOP/s.
nlohmann::json run_attention_case(Backend& be, Timer& timer, const AttentionBenchCase& c, const Options& o,
                                  double bf16_peak, Tally& tally) {
  const Device dev = be.device();
  const std::string shape =
      std::to_string(c.b) + "x" + std::to_string(c.t) + "x" + std::to_string(c.h) + "x" + std::to_string(c.d);
  nlohmann::json rec = {{"name", c.name}, {"b", c.b},
                        {"t", c.t},       {"h", c.h},
                        {"d", c.d},       {"dtype", c.bf16 ? "bf16" : "f32"},
                        {"causal", true}, {"forward_flops", c.forward_flops()}};
  std::printf("%-20s %-18s ", c.name.c_str(), shape.c_str());
  std::fflush(stdout);
  std::optional<ActivationDTypeScope> bf16_scope;
  if (c.bf16) bf16_scope.emplace(DType::bf16);
  try {
    const FlashAttentionParams p = FlashAttentionParams::packed(static_cast<int>(c.h), 0, c.d, true, 0.0f);
    const Shape qkv_shape{c.b, c.t, 3 * c.h * c.d}, out_shape{c.b, c.t, c.h * c.d};
    Tensor qkv = gemm_bench_operand(qkv_shape, 1, c.bf16, dev), dout = gemm_bench_operand(out_shape, 2, c.bf16, dev);
    Tensor out = Tensor::empty(out_shape, dev, qkv.dtype()), lse = Tensor::empty(Shape{c.b, c.h, c.t}, dev);
    Tensor dqkv = Tensor::empty(qkv_shape, dev, qkv.dtype());
    const size_t ws_bytes = be.flash_attention_backward_workspace(qkv_shape, qkv_shape, p);
    Tensor ws = Tensor::empty(Shape{static_cast<int64_t>((ws_bytes + 3) / 4)}, dev);
    auto forward = [&] { be.flash_attention_forward(qkv, qkv, Tensor(), p, RngState{}, out, lse); };
    const double fwd = median(time_runs(timer, forward, o));
    const double both = median(time_runs(
        timer,
        [&] {
          forward();
          be.flash_attention_backward(dout, qkv, qkv, Tensor(), out, lse, p, RngState{}, dqkv, dqkv, ws);
        },
        o));
    const double f_tflops = c.forward_flops() / (fwd * 1e-3) / 1e12;
    const double b_tflops = 3.5 * c.forward_flops() / (both * 1e-3) / 1e12;
    rec.update({{"status", "ok"},
                {"forward_ms", fwd},
                {"forward_backward_ms", both},
                {"forward_tflops", f_tflops},
                {"forward_backward_tflops", b_tflops}});
    std::printf("%10.3f %10.2f %10.3f %10.2f", fwd, f_tflops, both, b_tflops);
    if (c.bf16 && bf16_peak > 0) std::printf(" %7.1f%%", 100.0 * b_tflops / bf16_peak);
    std::printf("\n");
  } catch (const Error& e) {
    std::printf("%10s\n", "FAILED");
    tally.fail(rec, e.what());
  }
  std::fflush(stdout);
  return rec;
}

void run_attention_cases(Backend& be, Timer& timer, const Options& o, const Peak& peak, nlohmann::json& out,
                         Tally& tally) {
  const double bf16_peak = o.peak_bf16_tflops > 0 ? o.peak_bf16_tflops : datasheet_bf16_tflops(peak.device_name);
  std::printf("\n%-20s %-18s %10s %10s %10s %10s %8s\n", "fused attention", "b x t x h x d", "fwd ms", "TFLOP/s",
              "f+b ms", "TFLOP/s", "% bf16");
  std::printf("(causal; forward 4 b h t^2 d / 2 FLOPs, backward 2.5 times that)\n");
  out["attention"] = nlohmann::json::array();
  for (const AttentionBenchCase& c : attention_bench_cases(o.attention_tokens, o.attention_seqs, o.attention_width))
    out["attention"].push_back(run_attention_case(be, timer, c, o, bf16_peak, tally));
}

int run_kernels(const Options& o) {
  const Device dev = Device::parse(o.device);
  REMAT_CHECK(!dev.is_meta(), "bench kernels: meta holds no data; use cuda, cuda-emu or cpu");
  Backend& be = backend_for(dev);
  Timer timer(be);
  const Peak peak = device_peak(dev, o.peak_gbps, timer);
  const bool traffic = be.tuning().count_traffic(false);
  print_preamble(be, dev, o, timer, peak, traffic);
  std::printf("\n%-20s %-18s %10s %10s %10s %8s %9s %9s\n", "kernel", "shape", "MB moved", "ms", "GB/s", "% peak",
              "coalesced", "H200 us");
  nlohmann::json out = report_header(be, dev, o, timer, peak, traffic);
  Tally tally;
  for (const BenchCase& c : memory_bound_bench_cases(o.elements)) {
    if (!o.filter.empty() && c.name.find(o.filter) == std::string::npos) continue;
    out["kernels"].push_back(run_kernel_case(be, timer, c, o, peak, traffic, tally));
  }
  if (o.gemm > 0 && (o.filter.empty() || std::string("gemm").find(o.filter) != std::string::npos))
    run_gemm_cases(be, timer, o, peak, out, tally);
  if (o.attention_tokens > 0 && (o.filter.empty() || std::string("flash").find(o.filter) != std::string::npos))
    run_attention_cases(be, timer, o, peak, out, tally);

  if (!o.json.empty()) write_file_atomic(o.json, out.dump(2) + "\n");
  if (tally.skipped)
    std::printf("\n%d benchmark(s) skipped: not supported by the %s backend (reasons in --json)\n", tally.skipped,
                be.name().c_str());
  if (tally.failed) std::printf("\n%d benchmark(s) failed\n", tally.failed);
  return tally.failed ? 1 : 0;
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
  cmd->add_option("--attention-tokens", o->attention_tokens,
                  "Tokens (batch x sequence) of each fused attention case (0: none)")
      ->default_val(o->attention_tokens)
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--attention-seq", o->attention_seqs, "Sequence lengths of the fused attention cases")
      ->default_str("1024 4096")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--attention-width", o->attention_width, "Heads x head dim of the fused attention cases")
      ->default_val(o->attention_width)
      ->check(CLI::PositiveNumber);
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
