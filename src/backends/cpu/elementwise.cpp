// Elementwise ops: add, accumulate, scale, ReLU, GELU, dropout.
#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/parallel.h"
#include "kernels/philox.cuh"

namespace remat {

namespace {

constexpr int64_t kGrain = 1 << 14;

template <typename F>
void for_each(int64_t n, const F& f) {
  cpu::parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) f(i);
  });
}

constexpr float kSqrt1_2 = 0.70710678118654752440f;      // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;   // 1 / sqrt(2 pi)
constexpr float kSqrt2OverPi = 0.79788456080286535588f;  // sqrt(2 / pi)
constexpr float kKappa = 0.044715f;

}  // namespace

void CpuBackend::add_impl(const Tensor& a, const Tensor& b, const Tensor& y) {
  const float *pa = a.f32(), *pb = b.f32();
  float* py = y.f32();
  for_each(y.numel(), [&](int64_t i) { py[i] = pa[i] + pb[i]; });
}

void CpuBackend::accumulate_impl(const Tensor& dst, const Tensor& src) {
  float* pd = dst.f32();
  const float* ps = src.f32();
  for_each(dst.numel(), [&](int64_t i) { pd[i] += ps[i]; });
}

void CpuBackend::scale_impl(const Tensor& x, float alpha, const Tensor& y) {
  const float* px = x.f32();
  float* py = y.f32();
  for_each(y.numel(), [&](int64_t i) { py[i] = alpha * px[i]; });
}

void CpuBackend::relu_forward_impl(const Tensor& x, const Tensor& y) {
  const float* px = x.f32();
  float* py = y.f32();
  for_each(y.numel(), [&](int64_t i) { py[i] = px[i] > 0.0f ? px[i] : 0.0f; });
}

void CpuBackend::relu_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  const float *pdy = dy.f32(), *px = x.f32();
  float* pdx = dx.f32();
  for_each(dx.numel(), [&](int64_t i) { pdx[i] = px[i] > 0.0f ? pdy[i] : 0.0f; });
}

void CpuBackend::gelu_forward_impl(const Tensor& x, GeluApprox approx, const Tensor& y) {
  const float* px = x.f32();
  float* py = y.f32();
  if (approx == GeluApprox::none) {
    for_each(y.numel(), [&](int64_t i) { py[i] = 0.5f * px[i] * (1.0f + std::erf(px[i] * kSqrt1_2)); });
  } else {
    for_each(y.numel(), [&](int64_t i) {
      const float v = px[i];
      py[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + kKappa * v * v * v)));
    });
  }
}

void CpuBackend::gelu_backward_impl(const Tensor& dy, const Tensor& x, GeluApprox approx, const Tensor& dx) {
  const float *pdy = dy.f32(), *px = x.f32();
  float* pdx = dx.f32();
  if (approx == GeluApprox::none) {
    for_each(dx.numel(), [&](int64_t i) {
      const float v = px[i];
      const float cdf = 0.5f * (1.0f + std::erf(v * kSqrt1_2));
      const float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
      pdx[i] = pdy[i] * (cdf + v * pdf);
    });
  } else {
    for_each(dx.numel(), [&](int64_t i) {
      const float v = px[i];
      const float t = std::tanh(kSqrt2OverPi * (v + kKappa * v * v * v));
      const float dinner = kSqrt2OverPi * (1.0f + 3.0f * kKappa * v * v);
      pdx[i] = pdy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dinner);
    });
  }
}

namespace {

// y[i] = x[i] * scale where element i is kept, else 0 (the same rule forward and backward).
void apply_dropout(const float* x, float* y, int64_t n, float p, RngState rng) {
  if (p == 0.0f) {
    for_each(n, [&](int64_t i) { y[i] = x[i]; });
    return;
  }
  if (p >= 1.0f) {
    for_each(n, [&](int64_t i) { y[i] = 0.0f; });
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
    for_each(n, [&](int64_t i) {
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
