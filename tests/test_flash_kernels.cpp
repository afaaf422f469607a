// The fused attention's CUDA kernels (kernels/flash_attention.cu) on the emulated device
// against the CPU backend's kernels of the same algorithm (src/backends/cpu/flash_attention.h),
// on raw device pointers, before any op wraps them. Built twice (tests/CMakeLists.txt): over
// the plain emulated kernels (also run with REMAT_EMU_SHUFFLE_LANES) and over the
// race-instrumented ones under REMAT_EMU_RACECHECK=1.
//
// Per case: random q, k, v, dout as column ranges of [B, T, W] tensors (separate tensors at
// odd column offsets whose other columns hold NaN, or one packed [B, T, (h + 2 hkv) d]
// tensor), out and the gradients written into column ranges of tensors whose other
// columns hold a sentinel (they must keep it). The device's out and lse are compared with
// the CPU forward's; its dq, dk, dv (from the CPU forward's out and lse, so that backward
// is measured alone) with the CPU backward's. Errors are measured as the largest absolute
// difference over the largest absolute CPU value of the tensor. Forward and backward run
// twice and must give the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/flash_attention.h"
#include "kernels/emu/emu.h"
#include "kernels/flash_attention.cuh"
#include "remat/backend.h"
#include "remat/bf16.h"
#include "remat/device.h"
#include "remat/error.h"
#include "remat/tensor.h"

using remat::Device;
using remat::DType;
using remat::Shape;
using remat::Tensor;

namespace {

const bool kRegistered = (remat::register_cuda_emu_backend(), true);

Device dut() { return Device::parse(REMAT_TEST_DEVICE); }

// Tolerances, relative to the largest absolute value of the CPU's tensor.
// fp32: both sides compute in fp32; they differ in exp (the CPU's polynomial, 2.5e-7
// relative, against expf), in the tile sizes (where the online softmax rescales) and in
// the order of the row sums, so a few float roundings of the result.
constexpr double kTolF32 = 1e-5;
// bf16 (bf16 operands and outputs on both sides, fp32 arithmetic): the device rounds P,
// P o Z and dS to bf16 for their tensor-core products (2^-9 relative each, as every
// FlashAttention does), and each side rounds its outputs once (one bf16 step, 2^-8 of an
// element, may separate two roundings of nearly equal values). 1/64 of the scale, the
// tolerance of the materialised attention's bf16 cases, is several times what is measured
// (printed per case).
constexpr double kTolBf16 = 1.0 / 64;

constexpr uint32_t kSentinelF32 = 0x7fa5a5a5u;  // a NaN payload no kernel writes
constexpr uint16_t kSentinelBf16 = 0x7fa5u;

// A [B, T, W] tensor of f32 or bf16 elements on the host, as raw bits (f32: 32, bf16: 16).
struct HostTensor {
  int64_t b = 0, t = 0, w = 0;
  bool bf16 = false;
  std::vector<uint32_t> f;  // f32 bits
  std::vector<uint16_t> h;  // bf16 bits
  HostTensor(int64_t b_, int64_t t_, int64_t w_, bool bf16_, uint32_t fill_f32, uint16_t fill_bf16)
      : b(b_), t(t_), w(w_), bf16(bf16_) {
    if (bf16)
      h.assign(static_cast<size_t>(b * t * w), fill_bf16);
    else
      f.assign(static_cast<size_t>(b * t * w), fill_f32);
  }
  size_t size() const { return static_cast<size_t>(b * t * w); }
  int64_t at(int64_t bi, int64_t ti, int64_t c) const { return (bi * t + ti) * w + c; }
  float get(int64_t i) const { return bf16 ? remat::bf16_to_float(h[i]) : remat::bits_float(f[i]); }
  uint32_t bits(int64_t i) const { return bf16 ? h[i] : f[i]; }
  void set(int64_t i, float v) {
    if (bf16)
      h[i] = remat::bf16_from_float(v);
    else
      f[i] = remat::float_bits(v);
  }
  void* data() { return bf16 ? static_cast<void*>(h.data()) : static_cast<void*>(f.data()); }
  const void* data() const { return bf16 ? static_cast<const void*>(h.data()) : static_cast<const void*>(f.data()); }
};

HostTensor nan_tensor(int64_t b, int64_t t, int64_t w, bool bf16) {
  return HostTensor(b, t, w, bf16, 0x7fc00000u, 0x7fc0u);
}
HostTensor sentinel_tensor(int64_t b, int64_t t, int64_t w, bool bf16) {
  return HostTensor(b, t, w, bf16, kSentinelF32, kSentinelBf16);
}

Tensor upload(const HostTensor& x) {
  const Shape s({x.b, x.t, x.w});
  Tensor h = Tensor::empty(s, Device::cpu(), x.bf16 ? DType::bf16 : DType::f32);
  std::memcpy(h.raw_data(), x.data(), h.nbytes());
  return h.to(dut());
}
void download(const Tensor& t, HostTensor& x) {
  const Tensor h = t.to(Device::cpu());
  std::memcpy(x.data(), h.raw_data(), h.nbytes());
}
Tensor upload_f32(const std::vector<float>& v) {
  return Tensor::from_vector(v, Shape({static_cast<int64_t>(v.size())}), dut());
}

struct Case {
  std::string name;
  int64_t b, tq, tk, h, hkv, d;
  bool causal = false;
  float dropout = 0.0f;
  bool kv_lens = false;
  bool packed = false;  // q, k, v one [B, T, (h + 2 hkv) d] tensor; dq, dk, dv one likewise
  bool bf16 = false;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// The column ranges and tensors of one problem.
struct Layout {
  HostTensor q, kv, out, dout, dq, dkv;  // with packed, q is the packed tensor and kv unused (dq likewise)
  int64_t q_col, k_col, v_col, out_col, dout_col, dq_col, dk_col, dv_col;
};

Layout make_layout(const Case& c, std::mt19937& rng) {
  const int64_t qw = c.h * c.d, kw = c.hkv * c.d;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random_cols = [&](HostTensor& x, int64_t col, int64_t width) {
    for (int64_t bi = 0; bi < x.b; ++bi)
      for (int64_t ti = 0; ti < x.t; ++ti)
        for (int64_t cc = 0; cc < width; ++cc) x.set(x.at(bi, ti, col + cc), normal(rng));
  };
  if (c.packed) {
    const int64_t w = qw + 2 * kw;
    Layout l{nan_tensor(c.b, c.tq, w, c.bf16),
             nan_tensor(0, 0, 0, c.bf16),
             sentinel_tensor(c.b, c.tq, qw, c.bf16),
             nan_tensor(c.b, c.tq, qw, c.bf16),
             sentinel_tensor(c.b, c.tq, w, c.bf16),
             sentinel_tensor(0, 0, 0, c.bf16),
             0,
             qw,
             qw + kw,
             0,
             0,
             0,
             qw,
             qw + kw};
    random_cols(l.q, 0, w);
    random_cols(l.dout, 0, qw);
    return l;
  }
  // Odd widths and offsets: nothing may be assumed aligned.
  Layout l{nan_tensor(c.b, c.tq, qw + 7, c.bf16),
           nan_tensor(c.b, c.tk, 2 * kw + 5, c.bf16),
           sentinel_tensor(c.b, c.tq, qw + 2, c.bf16),
           nan_tensor(c.b, c.tq, qw + 3, c.bf16),
           sentinel_tensor(c.b, c.tq, qw + 3, c.bf16),
           sentinel_tensor(c.b, c.tk, 2 * kw + 2, c.bf16),
           3,
           1,
           2 + kw,
           1,
           2,
           2,
           1,
           1 + kw};
  random_cols(l.q, l.q_col, qw);
  random_cols(l.kv, l.k_col, kw);
  random_cols(l.kv, l.v_col, kw);
  random_cols(l.dout, l.dout_col, qw);
  return l;
}

struct Err {
  double rel = 0;  // largest |got - want| over the largest |want|
};

// Compares columns [col, col + width) of got and want, every row.
Err compare(const char* what, const HostTensor& got, const HostTensor& want, int64_t col, int64_t width, double tol) {
  double scale = 0, err = 0;
  int64_t bad = 0;
  for (int64_t bi = 0; bi < got.b; ++bi)
    for (int64_t ti = 0; ti < got.t; ++ti)
      for (int64_t cc = col; cc < col + width; ++cc) {
        const int64_t i = got.at(bi, ti, cc);
        const double g = got.get(i), w = want.get(i);
        if (!std::isfinite(g) || !std::isfinite(w)) {
          ++bad;
          continue;
        }
        scale = std::max(scale, std::abs(w));
        err = std::max(err, std::abs(g - w));
      }
  EXPECT_EQ(bad, 0) << what << ": non-finite values";
  const double rel = scale > 0 ? err / scale : err;
  EXPECT_LE(rel, tol) << what << ": largest difference " << err << " for a largest value " << scale;
  return Err{rel};
}

// Every column of got outside the ranges [col, col + width) still holds the sentinel.
void expect_untouched(const char* what, const HostTensor& got, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  int64_t touched = 0;
  for (int64_t bi = 0; bi < got.b; ++bi)
    for (int64_t ti = 0; ti < got.t; ++ti)
      for (int64_t cc = 0; cc < got.w; ++cc) {
        bool inside = false;
        for (const auto& [col, width] : ranges) inside = inside || (cc >= col && cc < col + width);
        if (!inside && got.bits(got.at(bi, ti, cc)) != (got.bf16 ? kSentinelBf16 : kSentinelF32)) ++touched;
      }
  EXPECT_EQ(touched, 0) << what << ": elements outside its columns were written";
}

bool same_bits(const HostTensor& a, const HostTensor& b) { return a.bf16 ? a.h == b.h : a.f == b.f; }

remat::kernels::FlashOperand operand(const Tensor& t, int64_t col) {
  return remat::kernels::FlashOperand{t.raw_data(), t.size(2), col};
}
remat::kernels::FlashOutput output(const Tensor& t, int64_t col) {
  return remat::kernels::FlashOutput{t.raw_data(), t.size(2), col};
}
remat::cpu::flash::Operand cpu_operand(const HostTensor& t, int64_t col) {
  return remat::cpu::flash::Operand{t.data(), t.bf16, t.w, col};
}
remat::cpu::flash::Output cpu_output(HostTensor& t, int64_t col) {
  return remat::cpu::flash::Output{t.data(), t.bf16, t.w, col};
}

// What one device run gives.
struct DeviceRun {
  HostTensor out, dq, dkv;
  std::vector<float> lse;
};

class FlashKernels : public ::testing::TestWithParam<Case> {};

TEST_P(FlashKernels, MatchTheCpuKernels) {
  const Case c = GetParam();
  ASSERT_TRUE(kRegistered);
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>{}(c.name)));
  Layout l = make_layout(c, rng);
  std::vector<int32_t> kv_lens;
  if (c.kv_lens) {
    // The first batch element sees every key, the others fewer (the last one key only when
    // there are three).
    for (int64_t bi = 0; bi < c.b; ++bi)
      kv_lens.push_back(static_cast<int32_t>(bi == 0 ? c.tk : bi == 2 ? 1 : c.tk - 23 - 7 * bi));
  }
  const remat::RngState rng_state{0x5eed1234abcdull + c.d, 4096};
  const float keep = 1.0f - c.dropout;

  // ---- The CPU kernels ----
  remat::cpu::flash::Problem cp;
  cp.b = c.b, cp.tq = c.tq, cp.tk = c.tk, cp.h = c.h, cp.hkv = c.hkv, cp.d = c.d, cp.causal = c.causal;
  cp.dropout = c.dropout, cp.rng = rng_state, cp.kv_lens = c.kv_lens ? kv_lens.data() : nullptr;
  cp.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  const HostTensor& kv_src = c.packed ? l.q : l.kv;
  HostTensor cpu_out = sentinel_tensor(c.b, c.tq, l.out.w, c.bf16);
  std::vector<float> cpu_lse(static_cast<size_t>(c.b * c.h * c.tq));
  const auto t_cpu = std::chrono::steady_clock::now();
  remat::cpu::flash::forward(cp, cpu_operand(l.q, l.q_col), cpu_operand(kv_src, l.k_col), cpu_operand(kv_src, l.v_col),
                             cpu_output(cpu_out, l.out_col), cpu_lse.data());
  HostTensor cpu_dq = sentinel_tensor(c.b, c.tq, l.dq.w, c.bf16);
  HostTensor cpu_dkv = c.packed ? sentinel_tensor(0, 0, 0, c.bf16) : sentinel_tensor(c.b, c.tk, l.dkv.w, c.bf16);
  HostTensor& cpu_dkv_dst = c.packed ? cpu_dq : cpu_dkv;
  std::vector<float> cpu_ws(static_cast<size_t>(remat::cpu::flash::backward_workspace_floats(cp)));
  remat::cpu::flash::backward(cp, cpu_operand(l.q, l.q_col), cpu_operand(kv_src, l.k_col), cpu_operand(kv_src, l.v_col),
                              cpu_operand(cpu_out, l.out_col), cpu_operand(l.dout, l.dout_col), cpu_lse.data(),
                              cpu_ws.data(), cpu_output(cpu_dq, l.dq_col), cpu_output(cpu_dkv_dst, l.dk_col),
                              cpu_output(cpu_dkv_dst, l.dv_col));
  const double cpu_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_cpu).count();

  // ---- The device kernels ----
  remat::kernels::FlashProblem p;
  p.b = c.b, p.tq = c.tq, p.tk = c.tk, p.h = c.h, p.hkv = c.hkv, p.d = c.d, p.causal = c.causal, p.bf16 = c.bf16;
  p.drop.on = keep < 1.0f;
  p.drop.keep_prob = keep, p.drop.scale = 1.0f / keep, p.drop.seed = rng_state.seed, p.drop.offset = rng_state.offset;
  p.scale = cp.scale;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const Tensor q = upload(l.q), kv = c.packed ? q : upload(l.kv), dout = upload(l.dout);
  const Tensor cpu_out_dev = upload(cpu_out), cpu_lse_dev = upload_f32(cpu_lse);
  Tensor lens;
  if (c.kv_lens) {
    lens = Tensor::from_ints(kv_lens, Shape({c.b}), dut());
    p.kv_lens = lens.i32();
  }
  const size_t ws_bytes = remat::kernels::flash_attention_backward_workspace(p);
  EXPECT_GE(ws_bytes, static_cast<size_t>(c.b * c.h * c.tq) * sizeof(float));
  const Tensor ws = Tensor::empty(Shape({static_cast<int64_t>(ws_bytes / 4)}), dut());

  auto run = [&]() {
    DeviceRun r{sentinel_tensor(c.b, c.tq, l.out.w, c.bf16),
                sentinel_tensor(c.b, c.tq, l.dq.w, c.bf16),
                c.packed ? sentinel_tensor(0, 0, 0, c.bf16) : sentinel_tensor(c.b, c.tk, l.dkv.w, c.bf16),
                {}};
    const Tensor out = upload(r.out), lse = upload_f32(std::vector<float>(cpu_lse.size(), -1.0f));
    const Tensor dq = upload(r.dq), dkv = c.packed ? dq : upload(r.dkv);
    remat::kernels::flash_attention_forward(p, operand(q, l.q_col), operand(kv, l.k_col), operand(kv, l.v_col),
                                            output(out, l.out_col), lse.f32(), stream);
    remat::kernels::flash_attention_backward(p, operand(q, l.q_col), operand(kv, l.k_col), operand(kv, l.v_col),
                                             operand(cpu_out_dev, l.out_col), operand(dout, l.dout_col),
                                             cpu_lse_dev.f32(), ws.raw_data(), output(dq, l.dq_col),
                                             output(dkv, l.dk_col), output(dkv, l.dv_col), stream);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    download(out, r.out);
    download(dq, r.dq);
    if (!c.packed) download(dkv, r.dkv);
    r.lse = lse.to_vector();
    return r;
  };
  const auto t_dev = std::chrono::steady_clock::now();
  const DeviceRun first = run();
  const double dev_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_dev).count();
  const DeviceRun second = run();
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);

  const double tol = c.bf16 ? kTolBf16 : kTolF32;
  const int64_t qw = c.h * c.d, kw = c.hkv * c.d;
  const Err e_out = compare("out", first.out, cpu_out, l.out_col, qw, tol);
  expect_untouched("out", first.out, {{l.out_col, qw}});
  double lse_err = 0, lse_scale = 0;
  for (size_t i = 0; i < cpu_lse.size(); ++i) {
    lse_scale = std::max(lse_scale, static_cast<double>(std::abs(cpu_lse[i])));
    lse_err = std::max(lse_err, static_cast<double>(std::abs(first.lse[i] - cpu_lse[i])));
  }
  // lse is f32 in both precisions, from the same fp32 scores: the fp32 tolerance.
  EXPECT_LE(lse_err, kTolF32 * std::max(1.0, lse_scale)) << "lse: largest difference " << lse_err;
  const HostTensor& dkv_got = c.packed ? first.dq : first.dkv;
  const HostTensor& dkv_want = c.packed ? cpu_dq : cpu_dkv;
  const Err e_dq = compare("dq", first.dq, cpu_dq, l.dq_col, qw, tol);
  const Err e_dk = compare("dk", dkv_got, dkv_want, l.dk_col, kw, tol);
  const Err e_dv = compare("dv", dkv_got, dkv_want, l.dv_col, kw, tol);
  if (c.packed) {
    expect_untouched("dq, dk, dv", first.dq, {{l.dq_col, qw}, {l.dk_col, kw}, {l.dv_col, kw}});
  } else {
    expect_untouched("dq", first.dq, {{l.dq_col, qw}});
    expect_untouched("dk, dv", first.dkv, {{l.dk_col, kw}, {l.dv_col, kw}});
  }
  EXPECT_TRUE(same_bits(first.out, second.out)) << "out differs between two runs";
  EXPECT_TRUE(first.lse == second.lse) << "lse differs between two runs";
  EXPECT_TRUE(same_bits(first.dq, second.dq)) << "dq differs between two runs";
  EXPECT_TRUE(same_bits(first.dkv, second.dkv)) << "dk, dv differ between two runs";
  std::printf(
      "[ flash    ] %-34s out %.2e lse %.2e dq %.2e dk %.2e dv %.2e of the scale; device %.0f ms, cpu %.1f ms\n",
      c.name.c_str(), e_out.rel, lse_err / std::max(1.0, lse_scale), e_dq.rel, e_dk.rel, e_dv.rel, dev_ms, cpu_ms);
}

// Dropout really drops: the device's out at p = 0.5 is far from the CPU's out without
// dropout and equal (within tolerance, checked above) to the CPU's with it, so the kept
// elements are the CPU's: a different mask would move out by O(1).
TEST(FlashKernelsDropout, TheMaskIsTheCpus) {
  ASSERT_TRUE(kRegistered);
  const int64_t b = 1, t = 40, h = 2, d = 32, w = h * d;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(b * t * w)), k(q.size()), v(q.size());
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = normal(rng);
  remat::cpu::flash::Problem cp;
  cp.b = b, cp.tq = t, cp.tk = t, cp.h = h, cp.hkv = h, cp.d = d, cp.scale = 1.0f / std::sqrt(float(d));
  cp.rng = remat::RngState{99, 8};
  auto cpu_out = [&](float dropout) {
    cp.dropout = dropout;
    std::vector<float> out(q.size()), lse(static_cast<size_t>(b * h * t));
    remat::cpu::flash::forward(cp, {q.data(), false, w, 0}, {k.data(), false, w, 0}, {v.data(), false, w, 0},
                               {out.data(), false, w, 0}, lse.data());
    return out;
  };
  const std::vector<float> plain = cpu_out(0.0f), dropped = cpu_out(0.5f);

  remat::kernels::FlashProblem p;
  p.b = b, p.tq = t, p.tk = t, p.h = h, p.hkv = h, p.d = d, p.scale = cp.scale;
  p.drop = remat::kernels::AttentionDropout{true, 0.5f, 2.0f, 99, 8};
  const Tensor qd = upload_f32(q), kd = upload_f32(k), vd = upload_f32(v);
  const Tensor out = Tensor::empty(Shape({b * t * w}), dut()), lse = Tensor::empty(Shape({b * h * t}), dut());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  remat::kernels::flash_attention_forward(p, {qd.raw_data(), w, 0}, {kd.raw_data(), w, 0}, {vd.raw_data(), w, 0},
                                          {out.raw_data(), w, 0}, lse.f32(), stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  const std::vector<float> got = out.to_vector();
  double to_dropped = 0, to_plain = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    to_dropped = std::max(to_dropped, static_cast<double>(std::abs(got[i] - dropped[i])));
    to_plain = std::max(to_plain, static_cast<double>(std::abs(got[i] - plain[i])));
    scale = std::max(scale, static_cast<double>(std::abs(dropped[i])));
  }
  EXPECT_LE(to_dropped, kTolF32 * scale);
  EXPECT_GE(to_plain, 0.1 * scale) << "dropout at p = 0.5 changed out by less than a tenth of its scale";
}

// Problems the kernels cannot run are refused by name before anything is launched.
TEST(FlashKernelsErrors, BadProblemsAreRefused) {
  ASSERT_TRUE(kRegistered);
  remat::kernels::FlashProblem p;
  p.b = 1, p.tq = 8, p.tk = 8, p.h = 2, p.hkv = 2, p.d = 300, p.scale = 0.1f;
  const remat::kernels::FlashOperand x{nullptr, 600, 0};
  const remat::kernels::FlashOutput y{nullptr, 600, 0};
  auto message = [&]() -> std::string {
    try {
      remat::kernels::flash_attention_forward(p, x, x, x, y, nullptr, nullptr);
    } catch (const remat::Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message().find("head dimension 300"), std::string::npos) << message();
  p.d = 64, p.hkv = 3;
  EXPECT_NE(message().find("not a multiple of 3 key/value heads"), std::string::npos) << message();
  p.hkv = 2, p.causal = true, p.tk = 9;
  EXPECT_NE(message().find("causal needs tq == tk"), std::string::npos) << message();
}

// Shapes: every head dimension tiles use (32, 64, 80 padded to 96, 128, 256), causal and
// not, dropout 0 and 0.2, grouped heads (4 over 2 and over 1), tq != tk with kv lengths
// (one batch element seeing a single key), packed qkv, lengths that are no multiple of a
// tile; fp32 and bf16.
std::vector<Case> cases() {
  std::vector<Case> v;
  for (bool bf16 : {false, true}) {
    const std::string tag = bf16 ? "bf16_" : "f32_";
    v.push_back({tag + "d32_plain", 2, 70, 70, 2, 2, 32, false, 0.0f, false, false, bf16});
    v.push_back({tag + "d32_causal_drop_packed", 1, 100, 100, 2, 2, 32, true, 0.2f, false, true, bf16});
    v.push_back({tag + "d64_causal_drop_gqa4x2", 1, 100, 100, 4, 2, 64, true, 0.2f, false, false, bf16});
    v.push_back({tag + "d64_kvlens_tq_ne_tk", 3, 45, 130, 2, 2, 64, false, 0.0f, true, false, bf16});
    v.push_back({tag + "d80_gqa4x1_kvlens_drop", 2, 70, 90, 4, 1, 80, false, 0.2f, true, false, bf16});
    v.push_back({tag + "d128_causal_packed", 1, 90, 90, 2, 2, 128, true, 0.0f, false, true, bf16});
    v.push_back({tag + "d128_drop_kvlens", 2, 70, 75, 2, 1, 128, false, 0.2f, true, false, bf16});
    v.push_back({tag + "d256_causal_drop", 1, 70, 70, 2, 2, 256, true, 0.2f, false, false, bf16});
    v.push_back({tag + "d256_gqa_packed_kvlens", 2, 50, 50, 2, 1, 256, false, 0.0f, true, true, bf16});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashKernels, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
