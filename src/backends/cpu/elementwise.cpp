// Elementwise ops: add, accumulate, scale, ReLU, GELU, dropout.
#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/vmath.h"
#include "kernels/philox.cuh"

namespace remat {

namespace {

constexpr int64_t kGrain = 1 << 14;

// y[i] = f(a[i]) and y[i] = f(a[i], b[i]) over chunks in parallel, in tight loops that
// vectorise. y may be a or b (in-place backward): each element is read before it is
// written, so no restrict (GCC adds a run-time overlap check and still vectorises).
template <typename F>
void map1(const float* a, float* y, int64_t n, F f) {
  cpu::parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    const float* pa = a;
    float* py = y;
    for (int64_t i = b; i < e; ++i) py[i] = f(pa[i]);
  });
}

template <typename F>
void map2(const float* a, const float* b2, float* y, int64_t n, F f) {
  cpu::parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    const float* pa = a;
    const float* pb = b2;
    float* py = y;
    for (int64_t i = b; i < e; ++i) py[i] = f(pa[i], pb[i]);
  });
}

constexpr float kSqrt1_2 = 0.70710678118654752440f;      // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;   // 1 / sqrt(2 pi)
constexpr float kSqrt2OverPi = 0.79788456080286535588f;  // sqrt(2 / pi)
constexpr float kKappa = 0.044715f;

}  // namespace

void CpuBackend::add_impl(const Tensor& a, const Tensor& b, const Tensor& y) {
  map2(a.f32(), b.f32(), y.f32(), y.numel(), [](float u, float v) { return u + v; });
}

void CpuBackend::accumulate_impl(const Tensor& dst, const Tensor& src) {
  map2(dst.f32(), src.f32(), dst.f32(), dst.numel(), [](float u, float v) { return u + v; });
}

void CpuBackend::scale_impl(const Tensor& x, float alpha, const Tensor& y) {
  map1(x.f32(), y.f32(), y.numel(), [alpha](float v) { return alpha * v; });
}

void CpuBackend::relu_forward_impl(const Tensor& x, const Tensor& y) {
  map1(x.f32(), y.f32(), y.numel(), [](float v) { return v > 0.0f ? v : 0.0f; });
}

void CpuBackend::relu_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  map2(dy.f32(), x.f32(), dx.f32(), dx.numel(), [](float g, float v) { return v > 0.0f ? g : 0.0f; });
}

void CpuBackend::gelu_forward_impl(const Tensor& x, GeluApprox approx, const Tensor& y) {
  if (approx == GeluApprox::none) {
    map1(x.f32(), y.f32(), y.numel(), [](float v) { return 0.5f * v * (1.0f + cpu::verf(v * kSqrt1_2)); });
  } else {
    map1(x.f32(), y.f32(), y.numel(),
         [](float v) { return 0.5f * v * (1.0f + cpu::vtanh(kSqrt2OverPi * (v + kKappa * v * v * v))); });
  }
}

void CpuBackend::gelu_backward_impl(const Tensor& dy, const Tensor& x, GeluApprox approx, const Tensor& dx) {
  if (approx == GeluApprox::none) {
    map2(dy.f32(), x.f32(), dx.f32(), dx.numel(), [](float g, float v) {
      const float cdf = 0.5f * (1.0f + cpu::verf(v * kSqrt1_2));
      const float pdf = kInvSqrt2Pi * cpu::vexp(-0.5f * v * v);
      return g * (cdf + v * pdf);
    });
  } else {
    map2(dy.f32(), x.f32(), dx.f32(), dx.numel(), [](float g, float v) {
      const float t = cpu::vtanh(kSqrt2OverPi * (v + kKappa * v * v * v));
      const float dinner = kSqrt2OverPi * (1.0f + 3.0f * kKappa * v * v);
      return g * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dinner);
    });
  }
}

namespace {

// y[i] = x[i] * scale where element i is kept, else 0 (the same rule forward and backward).
void apply_dropout(const float* x, float* y, int64_t n, float p, RngState rng) {
  if (p == 0.0f) {
    map1(x, y, n, [](float v) { return v; });
    return;
  }
  if (p >= 1.0f) {
    map1(x, y, n, [](float) { return 0.0f; });
    return;
  }
  const float keep_prob = 1.0f - p, scale = 1.0f / keep_prob;
  if (rng.offset % 4 == 0) {
    // One Philox block serves four consecutive elements.
    const int64_t blocks = (n + 3) / 4;
    cpu::parallel_for(blocks, kGrain / 4, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const philox::Bits4 r = philox::block(rng.seed, rng.offset / 4 + static_cast<uint64_t>(b));
        const uint32_t w[4] = {r.x, r.y, r.z, r.w};
        for (int64_t j = 0; j < 4 && 4 * b + j < n; ++j) {
          const int64_t i = 4 * b + j;
          y[i] = philox::uniform(w[j]) < keep_prob ? x[i] * scale : 0.0f;
        }
      }
    });
  } else {
    cpu::parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        y[i] = philox::keep(rng.seed, rng.offset, static_cast<uint64_t>(i), keep_prob) ? x[i] * scale : 0.0f;
    });
  }
}

}  // namespace

void CpuBackend::dropout_forward_impl(const Tensor& x, float p, RngState rng, const Tensor& y) {
  apply_dropout(x.f32(), y.f32(), y.numel(), p, rng);
}

void CpuBackend::dropout_backward_impl(const Tensor& dy, float p, RngState rng, const Tensor& dx) {
  apply_dropout(dy.f32(), dx.f32(), dx.numel(), p, rng);
}

}  // namespace remat
