// What the op tests of tests/ops share: one file per op family (test_<family>.cpp, the
// family of the op's validator src/backends/validate/<family>.cpp), each testing its ops on
// the CPU backend against PyTorch goldens (fp32 and bf16), finite differences, independent
// references where PyTorch cannot give one, determinism and bad arguments.
//
// bf16 (training.precision bf16: bf16 storage, fp32 math, src/backends/cpu/mixed.h) is
// checked two ways, each family in its own file:
// - against PyTorch 1.13 (tests/golden/bf16_ops, tools/reference/golden/bf16_ops.py) by
//   expect_bf16_golden: `<name>_f32` is PyTorch's fp32 op on the same bf16 values, stored
//   results rounded to bf16 and parameter gradients kept in fp32 (remat's contract); `<name>`
//   is PyTorch's own bf16 kernel, several of which round intermediates to bf16, so remat is
//   checked within the error those roundings make, stated per op. err = max_i |remat_i -
//   ref_i| / (|ref_i| + 2^-6 max_j |ref_j|), in units of bf16's relative step 2^-8 ("ulp").
// - against the same op in fp32 on the bf16 inputs widened to float (Bf16Pair), its outputs
//   rounded to bf16: elementwise and row ops stage the very values the fp32 op reads, so they
//   give exactly those bits (expect_rounded); the GEMMs sum k in 512-wide panels (another
//   order than one sgemm) and attention rounds its probabilities to bf16 before P V, so their
//   outputs are compared within a tolerance (expect_close_to_fp32).
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/bf16.h"
#include "remat/backend.h"
#include "remat/bf16.h"
#include "remat/dtype.h"
#include "remat/error.h"
#include "remat/tensor.h"
#include "support/golden.h"

namespace remat::test {

inline Backend& cpu() { return backend_for(Device::cpu()); }
inline Backend& meta() { return backend_for(Device::meta()); }

// a + b elementwise in float (the expected value of an accumulated gradient).
inline Tensor plus(const Tensor& a, const Tensor& b) {
  auto x = a.to_vector();
  const auto y = b.to_vector();
  for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  return Tensor::from_vector(x, a.shape());
}

// Token ids uniform in [0, vocab) from a fixed seed.
inline Tensor random_ids(const Shape& s, int32_t vocab, uint32_t seed) {
  const Tensor u = random_tensor(s, seed, 0.0f, static_cast<float>(vocab));
  std::vector<int32_t> ids;
  for (float x : u.to_vector()) ids.push_back(std::min(vocab - 1, static_cast<int32_t>(x)));
  return Tensor::from_ints(ids, s);
}

// The golden cases of tools/reference/golden/transformer.py whose metadata "op" is `op`.
inline std::vector<std::string> transformer_cases(const std::string& op) {
  std::vector<std::string> out;
  for (const auto& name : golden_cases("transformer"))
    if (meta_str(load_golden(name), "op") == op) out.push_back(name);
  return out;
}

// The golden cases of tools/reference/golden/cnn.py whose name starts with `prefix` ("conv_", "bn_train").
inline std::vector<std::string> cnn_cases(const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& c : golden_cases("cnn"))
    if (c.rfind("cnn/" + prefix, 0) == 0) out.push_back(c);
  return out;
}

// Restores the OpenMP thread count when it goes out of scope.
class ThreadCount {
 public:
  ThreadCount() : saved_(omp_get_max_threads()) {}
  ~ThreadCount() { omp_set_num_threads(saved_); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

 private:
  int saved_;
};

// run() gives the same bits run to run and with 1, 2 and 3 threads (run: every op of a family,
// forward and backward, on shapes large enough that the CPU loops run in parallel).
inline void expect_bitwise_across_runs_and_thread_counts(const std::function<std::vector<Tensor>()>& run) {
  ThreadCount restore;
  omp_set_num_threads(2);
  const auto a = run();
  const auto b = run();
  omp_set_num_threads(1);
  const auto c = run();
  omp_set_num_threads(3);
  const auto d = run();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE("result " + std::to_string(i));
    EXPECT_TRUE(bitwise_equal(a[i], b[i])) << "run to run";
    EXPECT_TRUE(bitwise_equal(a[i], c[i])) << "2 threads vs 1";
    EXPECT_TRUE(bitwise_equal(a[i], d[i])) << "2 threads vs 3";
  }
}

// The message of the error f throws (empty when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

// ---- bf16 against PyTorch (tests/golden/bf16_ops) -------------------------------------------

constexpr double kBf16Ulp = 1.0 / 256;  // bf16's relative step (8 significant bits)

// A golden tensor (f32 holding bf16 values) as a bf16 tensor.
inline Tensor bf16_of(const Tensor& f) {
  Tensor h = Tensor::empty(f.shape(), Device::cpu(), DType::bf16);
  ::remat::cpu::f32_to_bf16(f.f32(), h.bf16(), f.numel());
  return h;
}
inline Tensor bf16_empty(const Shape& s) { return Tensor::empty(s, Device::cpu(), DType::bf16); }
// Golden input `name` of case f as a bf16 tensor.
inline Tensor bf16_in(const SafetensorsFile& f, const char* name) { return bf16_of(f.tensor(name)); }

// err (above), in ulps.
inline double err_ulps(const Tensor& actual, const Tensor& expected) {
  const std::vector<float> a = actual.to_vector(), e = expected.to_vector();
  EXPECT_EQ(a.size(), e.size());
  double mx = 0;
  for (float v : e) mx = std::max(mx, std::fabs(static_cast<double>(v)));
  const double floor = std::ldexp(mx, -6);
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < e.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(e[i])) return a[i] == e[i] ? 0.0 : HUGE_VAL;
    const double d = std::fabs(static_cast<double>(a[i]) - e[i]);
    worst = std::max(worst, d / (std::fabs(static_cast<double>(e[i])) + floor));
  }
  return worst / kBf16Ulp;
}

// Checks remat's `actual` for golden result `name` of case f: within `f32_ulps` of the fp32
// reference and `torch_ulps` of PyTorch's bf16 kernel.
inline void expect_bf16_golden(const SafetensorsFile& f, const std::string& name, const Tensor& actual, double f32_ulps,
                               double torch_ulps) {
  const double e32 = err_ulps(actual, f.tensor(name + "_f32")), e16 = err_ulps(actual, f.tensor(name));
  std::printf("    %-8s %6.2f ulp from fp32 (allowed %g), %6.2f from torch bf16 (allowed %g)\n", name.c_str(), e32,
              f32_ulps, e16, torch_ulps);
  EXPECT_LE(e32, f32_ulps) << name << " against PyTorch's fp32 op on the same values";
  EXPECT_LE(e16, torch_ulps) << name << " against PyTorch's bf16 kernel";
}

// ---- bf16 against the fp32 op on the same values ----------------------------------------------

inline std::vector<float> random_bf16_values(int64_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = round_to_bf16(u(g));
  return v;
}

// The same values as f32 (f) and as bf16 (h).
struct Bf16Pair {
  Tensor f, h;
};
inline Bf16Pair bf16_pair(const std::vector<float>& v, const Shape& s) {
  Bf16Pair p{Tensor::from_vector(v, s), Tensor::empty(s, Device::cpu(), DType::bf16)};
  ::remat::cpu::f32_to_bf16(v.data(), p.h.bf16(), s.numel());
  return p;
}
inline Bf16Pair random_pair(const Shape& s, uint32_t seed) { return bf16_pair(random_bf16_values(s.numel(), seed), s); }
inline Bf16Pair empty_pair(const Shape& s) {
  return Bf16Pair{Tensor::empty(s), Tensor::empty(s, Device::cpu(), DType::bf16)};
}

// The bf16 bits of a tensor's values (an f32 tensor's rounded).
inline std::vector<uint16_t> bits(const Tensor& t) {
  if (t.dtype() == DType::bf16) return std::vector<uint16_t>(t.bf16(), t.bf16() + t.numel());
  std::vector<uint16_t> out(static_cast<size_t>(t.numel()));
  ::remat::cpu::f32_to_bf16(t.f32(), out.data(), t.numel());
  return out;
}
inline std::vector<float> widen(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  ::remat::cpu::bf16_to_f32(t.bf16(), out.data(), t.numel());
  return out;
}

// The bf16 result is the rounded fp32 result, bit for bit.
inline void expect_rounded(const Bf16Pair& p, const char* what) {
  const auto a = bits(p.h), b = bits(p.f);
  ASSERT_EQ(a.size(), b.size());
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += a[i] != b[i];
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << a.size() << " elements differ from the rounded fp32 result";
}

// Within `rel` of the fp32 result, relative to the largest magnitude of the fp32 result.
inline void expect_close_to_fp32(const Bf16Pair& p, double rel, const char* what) {
  const auto h = widen(p.h);
  const auto f = p.f.to_vector();
  double mx = 0, worst = 0;
  for (float v : f) mx = std::max(mx, std::fabs(static_cast<double>(v)));
  for (size_t i = 0; i < f.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(h[i]) - f[i]));
  EXPECT_LE(worst, rel * std::max(mx, 1e-30)) << what << ": worst error " << worst << " against max |x| " << mx;
  EXPECT_GT(mx, 0.0) << what << ": the reference is all zero";
}

// A bf16 error about statistics: names the op and the tensor, and says they stay f32.
inline void expect_statistics_error(const std::string& msg, const std::string& op, const std::string& tensor) {
  EXPECT_NE(msg.find(op + ": " + tensor + " bf16["), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected dtype f32 (statistics stay f32 under bf16 activations)"), std::string::npos) << msg;
}

}  // namespace remat::test
