// Elementwise ops: add, accumulate, scale, cast_multi, ReLU, GELU, SiLU, mul, dropout.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/bf16.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/mixed.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/philox_cpu.h"
#include "backends/cpu/simd.h"
#include "backends/cpu/vmath.h"
#include "remat/gelu.h"

namespace remat {

namespace {

// y[i] = f(a[i]) and y[i] = f(a[i], b[i]) over chunks in parallel, in tight loops that
// vectorise. y may be a or b (in-place backward): each element is read before it is
// written, so no restrict (GCC adds a run-time overlap check and still vectorises).
//
// Each loop is compiled for the baseline (SSE2), AVX2 and AVX-512, with f inlined into
// each, and cpu::simd() picks one: GCC vectorises the same float operations at each width
// (no contraction in this file), so the three give the same bits.
template <typename F>
inline void loop1(const float* a, float* y, int64_t b, int64_t e, F& f) {
  for (int64_t i = b; i < e; ++i) y[i] = f(a[i]);
}
template <typename F>
inline void loop2(const float* a, const float* a2, float* y, int64_t b, int64_t e, F& f) {
  for (int64_t i = b; i < e; ++i) y[i] = f(a[i], a2[i]);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define REMAT_ELEMENTWISE_X86 1
template <typename F>
__attribute__((target("avx2"))) void loop1_avx2(const float* a, float* y, int64_t b, int64_t e, F& f) {
  for (int64_t i = b; i < e; ++i) y[i] = f(a[i]);
}
template <typename F>
__attribute__((target("avx512f"))) void loop1_avx512(const float* a, float* y, int64_t b, int64_t e, F& f) {
  for (int64_t i = b; i < e; ++i) y[i] = f(a[i]);
}
template <typename F>
__attribute__((target("avx2"))) void loop2_avx2(const float* a, const float* a2, float* y, int64_t b, int64_t e, F& f) {
  for (int64_t i = b; i < e; ++i) y[i] = f(a[i], a2[i]);
}
template <typename F>
__attribute__((target("avx512f"))) void loop2_avx512(const float* a, const float* a2, float* y, int64_t b, int64_t e,
                                                     F& f) {
  for (int64_t i = b; i < e; ++i) y[i] = f(a[i], a2[i]);
}
#endif

template <typename F>
void map1(const float* a, float* y, int64_t n, F f) {
  const cpu::Simd level = cpu::simd();
  cpu::parallel_for(n, cpu::kParallelMinWork, [&](int64_t b, int64_t e) {
#ifdef REMAT_ELEMENTWISE_X86
    if (level == cpu::Simd::avx512) return loop1_avx512(a, y, b, e, f);
    if (level == cpu::Simd::avx2) return loop1_avx2(a, y, b, e, f);
#endif
    loop1(a, y, b, e, f);
  });
}

template <typename F>
void map2(const float* a, const float* a2, float* y, int64_t n, F f) {
  const cpu::Simd level = cpu::simd();
  cpu::parallel_for(n, cpu::kParallelMinWork, [&](int64_t b, int64_t e) {
#ifdef REMAT_ELEMENTWISE_X86
    if (level == cpu::Simd::avx512) return loop2_avx512(a, a2, y, b, e, f);
    if (level == cpu::Simd::avx2) return loop2_avx2(a, a2, y, b, e, f);
#endif
    loop2(a, a2, y, b, e, f);
  });
}

// The same over tensors that may be bf16: fp32 tensors take map1/map2 as they are; with a
// bf16 operand each parallel chunk goes through kPiece-element fp32 pieces (mixed.h),
// computed by the same loops. y may be a or b: a piece is read before it is written.
template <typename F>
void map1(const Tensor& a, const Tensor& y, F f) {
  const int64_t n = y.numel();
  if (cpu::all_f32({&a, &y})) return map1(a.f32(), y.f32(), n, f);
  const cpu::Simd level = cpu::simd();
  cpu::parallel_for(n, cpu::kParallelMinWork, [&](int64_t b, int64_t e) {
    cpu::F32Reader ra(a, 0);
    cpu::F32Writer wy(y, 2);
    for (int64_t s = b; s < e; s += cpu::kPiece) {
      const int64_t m = std::min(cpu::kPiece, e - s);
      const float* pa = ra.get(s, m);
      float* py = wy.get(s, m);
#ifdef REMAT_ELEMENTWISE_X86
      if (level == cpu::Simd::avx512)
        loop1_avx512(pa, py, 0, m, f);
      else if (level == cpu::Simd::avx2)
        loop1_avx2(pa, py, 0, m, f);
      else
#endif
        loop1(pa, py, 0, m, f);
      wy.put();
    }
  });
}

template <typename F>
void map2(const Tensor& a, const Tensor& a2, const Tensor& y, F f) {
  const int64_t n = y.numel();
  if (cpu::all_f32({&a, &a2, &y})) return map2(a.f32(), a2.f32(), y.f32(), n, f);
  const cpu::Simd level = cpu::simd();
  cpu::parallel_for(n, cpu::kParallelMinWork, [&](int64_t b, int64_t e) {
    cpu::F32Reader ra(a, 0), ra2(a2, 1);
    cpu::F32Writer wy(y, 2);
    for (int64_t s = b; s < e; s += cpu::kPiece) {
      const int64_t m = std::min(cpu::kPiece, e - s);
      const float* pa = ra.get(s, m);
      const float* pa2 = ra2.get(s, m);
      float* py = wy.get(s, m);
#ifdef REMAT_ELEMENTWISE_X86
      if (level == cpu::Simd::avx512)
        loop2_avx512(pa, pa2, py, 0, m, f);
      else if (level == cpu::Simd::avx2)
        loop2_avx2(pa, pa2, py, 0, m, f);
      else
#endif
        loop2(pa, pa2, py, 0, m, f);
      wy.put();
    }
  });
}

// GELU's constants (remat/gelu.h).
using gelu::kInvSqrt2Pi;
using gelu::kKappa;
using gelu::kSqrt1_2;
using gelu::kSqrt2OverPi;

}  // namespace

void CpuBackend::add_impl(const Tensor& a, const Tensor& b, const Tensor& y) {
  map2(a, b, y, [](float u, float v) { return u + v; });
}

void CpuBackend::accumulate_impl(const Tensor& dst, const Tensor& src) {
  map2(dst, src, dst, [](float u, float v) { return u + v; });
}

void CpuBackend::scale_impl(const Tensor& x, float alpha, const Tensor& y) {
  map1(x, y, [alpha](float v) { return alpha * v; });
}

// Each tensor converted in chunks in parallel: f32 -> bf16 by cpu::f32_to_bf16, the rounding
// every bf16 store of this backend uses (so the values of scale(src, 1, dst)); bf16 -> f32
// exactly; one dtype copies.
void CpuBackend::cast_multi_impl(const std::vector<Tensor>& src, const std::vector<Tensor>& dst) {
  for (size_t t = 0; t < src.size(); ++t) {
    const Tensor &x = src[t], &y = dst[t];
    cpu::parallel_for(x.numel(), cpu::kPiece, [&](int64_t b, int64_t e) {
      if (x.dtype() == y.dtype())
        std::memcpy(static_cast<char*>(y.raw_data()) + b * static_cast<int64_t>(dtype_size(y.dtype())),
                    static_cast<const char*>(x.raw_data()) + b * static_cast<int64_t>(dtype_size(x.dtype())),
                    static_cast<size_t>(e - b) * dtype_size(x.dtype()));
      else if (y.dtype() == DType::bf16)
        cpu::f32_to_bf16(x.f32() + b, y.bf16() + b, e - b);
      else
        cpu::bf16_to_f32(x.bf16() + b, y.f32() + b, e - b);
    });
  }
}

void CpuBackend::relu_forward_impl(const Tensor& x, const Tensor& y) {
  map1(x, y, [](float v) { return v > 0.0f ? v : 0.0f; });
}

void CpuBackend::relu_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  map2(dy, x, dx, [](float g, float v) { return v > 0.0f ? g : 0.0f; });
}

void CpuBackend::gelu_forward_impl(const Tensor& x, GeluApprox approx, const Tensor& y) {
  if (approx == GeluApprox::none) {
    map1(x, y, [](float v) { return 0.5f * v * (1.0f + cpu::verf(v * kSqrt1_2)); });
  } else {
    map1(x, y, [](float v) { return 0.5f * v * (1.0f + cpu::vtanh(kSqrt2OverPi * (v + kKappa * v * v * v))); });
  }
}

void CpuBackend::gelu_backward_impl(const Tensor& dy, const Tensor& x, GeluApprox approx, const Tensor& dx) {
  if (approx == GeluApprox::none) {
    map2(dy, x, dx, [](float g, float v) {
      const float cdf = 0.5f * (1.0f + cpu::verf(v * kSqrt1_2));
      const float pdf = kInvSqrt2Pi * cpu::vexp(-0.5f * v * v);
      return g * (cdf + v * pdf);
    });
  } else {
    map2(dy, x, dx, [](float g, float v) {
      const float t = cpu::vtanh(kSqrt2OverPi * (v + kKappa * v * v * v));
      const float dinner = kSqrt2OverPi * (1.0f + 3.0f * kKappa * v * v);
      return g * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dinner);
    });
  }
}

// SiLU: s = 1 / (1 + exp(-x)) with the branch-free exp of vmath.h, which clamps its argument at
// 88.3: below x = -88.3, s stays about 4.5e-39 where sigmoid(x) is smaller still (y and dx
// within 1e-36 of PyTorch's there).
void CpuBackend::silu_forward_impl(const Tensor& x, const Tensor& y) {
  map1(x, y, [](float v) { return v * (1.0f / (1.0f + cpu::vexp(-v))); });
}

void CpuBackend::silu_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  map2(dy, x, dx, [](float g, float v) {
    const float s = 1.0f / (1.0f + cpu::vexp(-v));
    return g * (s * (1.0f + v * (1.0f - s)));
  });
}

void CpuBackend::mul_forward_impl(const Tensor& a, const Tensor& b, const Tensor& y) {
  map2(a, b, y, [](float u, float v) { return u * v; });
}

// Two passes, da then db: neither output shares storage with an input (the validator).
void CpuBackend::mul_backward_impl(const Tensor& dy, const Tensor& a, const Tensor& b, const Tensor& da,
                                   const Tensor& db) {
  if (da.defined()) map2(dy, b, da, [](float g, float v) { return g * v; });
  if (db.defined()) map2(dy, a, db, [](float g, float v) { return g * v; });
}

namespace {

// y[i] = x[i] * scale where element i is kept, else 0 (the same rule forward and backward).
// x and y may be bf16: each Philox chunk's piece is staged in fp32 (mixed.h); the mask
// depends on the element index only, so it is the fp32 mask whatever the dtypes.
void apply_dropout(const Tensor& xt, const Tensor& yt, float p, RngState rng) {
  const int64_t n = yt.numel();
  if (p == 0.0f) {
    map1(xt, yt, [](float v) { return v; });
    return;
  }
  if (p >= 1.0f) {
    map1(xt, yt, [](float) { return 0.0f; });
    return;
  }
  const float keep_prob = 1.0f - p, scale = 1.0f / keep_prob;
  // factor is scale (kept) or 0 (dropped): kept elements become x * scale, dropped ones 0
  // whatever x holds (a NaN or inf included).
  cpu::parallel_for(n, cpu::kParallelMinWork, [&](int64_t b, int64_t e) {
    cpu::F32Reader rx(xt, 0);
    cpu::F32Writer wy(yt, 2);
    cpu::for_each_dropout_chunk(rng, static_cast<uint64_t>(b), e - b, keep_prob, scale,
                                [&](int64_t j0, const float* factor, int64_t m) {
                                  const float* px = rx.get(b + j0, m);
                                  float* py = wy.get(b + j0, m);
                                  for (int64_t k = 0; k < m; ++k) {
                                    const float v = px[k] * factor[k];  // read unconditionally: the loop vectorises
                                    py[k] = factor[k] != 0.0f ? v : 0.0f;
                                  }
                                  wy.put();
                                });
  });
}

}  // namespace

void CpuBackend::dropout_forward_impl(const Tensor& x, float p, RngState rng, const Tensor& y) {
  apply_dropout(x, y, p, rng);
}

void CpuBackend::dropout_backward_impl(const Tensor& dy, float p, RngState rng, const Tensor& dx) {
  apply_dropout(dy, dx, p, rng);
}

}  // namespace remat
