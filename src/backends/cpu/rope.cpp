// Rotary position embeddings (RoPE, Su et al. 2021), in the halves form of Hugging Face's
// Llama: in each of a token's first `rotated` heads of d channels, the pair (i, i + d/2)
// turns by t * theta^(-2i/d) at position t (scaled as remat/rope.h says); the other heads are copied. Backward turns
// the gradient back by the same angles.
//
// The cosines and sines are computed once per call for every (position, pair), in double
// from the angle in double, and rounded to float only as the product is; each output is
// (float)(a cos -+ b sin) computed in double, so the CUDA kernels (kernels/rope.cu), which
// do the same, agree with these to the rounding of double math. Rows (tokens) are
// independent: parallel over rows; no result depends on the thread count.
//
// bf16 storage: rows are staged in fp32 (mixed.h). y may be x (each pair is read before
// it is written).
#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/mixed.h"
#include "backends/cpu/parallel.h"
#include "remat/rope.h"

namespace remat {

namespace {

constexpr int64_t kRowsPerTask = 8;

// cos and sin of every (position, pair): [T][d/2] each.
struct Angles {
  std::vector<double> cos, sin;
};

Angles angles(int64_t t_len, int64_t d, double theta, const RopeScaling& scaling) {
  const int64_t half = d / 2;
  Angles a;
  a.cos.resize(static_cast<size_t>(t_len * half));
  a.sin.resize(a.cos.size());
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = rope_inv_freq(theta, i, d, scaling);
    for (int64_t t = 0; t < t_len; ++t) {
      const double angle = static_cast<double>(t) * inv_freq;
      a.cos[static_cast<size_t>(t * half + i)] = std::cos(angle);
      a.sin[static_cast<size_t>(t * half + i)] = std::sin(angle);
    }
  }
  return a;
}

// sign +1: forward; -1: backward (the transpose: the angles negated).
void rope(const Tensor& x, const RopeParams& p, const Tensor& y, double sign) {
  const int64_t t_len = x.size(1), c = x.size(2), d = c / p.heads, half = d / 2, rows = x.size(0) * t_len;
  const Angles a = angles(t_len, d, p.theta, p.scaling);
  cpu::parallel_for(rows, kRowsPerTask, [&](int64_t r0, int64_t r1) {
    cpu::F32Reader rx(x, 0);
    cpu::F32Writer wy(y, 2);
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = rx.row(r, c);
      float* yr = wy.row(r, c);  // may be x's own row (f32): each element read before written
      const double* cs = a.cos.data() + (r % t_len) * half;
      const double* sn = a.sin.data() + (r % t_len) * half;
      for (int64_t h = 0; h < p.rotated; ++h) {
        const float* xh = xr + h * d;
        float* yh = yr + h * d;
        for (int64_t i = 0; i < half; ++i) {
          const double u = xh[i], v = xh[i + half], s = sign * sn[i];
          yh[i] = static_cast<float>(u * cs[i] - v * s);
          yh[i + half] = static_cast<float>(v * cs[i] + u * s);
        }
      }
      if (yr != xr)
        for (int64_t j = p.rotated * d; j < c; ++j) yr[j] = xr[j];
      wy.put();
    }
  });
}

}  // namespace

void CpuBackend::rope_forward_impl(const Tensor& x, const RopeParams& p, const Tensor& y) { rope(x, p, y, 1.0); }

void CpuBackend::rope_backward_impl(const Tensor& dy, const RopeParams& p, const Tensor& dx) { rope(dy, p, dx, -1.0); }

}  // namespace remat
