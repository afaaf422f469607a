// Softmax and log-softmax over the last dimension, cross-entropy, accuracy.
#include <cmath>
#include <limits>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/parallel.h"
#include "remat/error.h"

namespace remat {

namespace {

int64_t last_dim(const Tensor& t) { return t.size(-1); }
int64_t rows(const Tensor& t) { return last_dim(t) == 0 ? 0 : t.numel() / last_dim(t); }
constexpr int64_t kRowGrain = 16;

float row_max(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

}  // namespace

void CpuBackend::softmax_forward_impl(const Tensor& x, bool log, const Tensor& y) {
  const int64_t n = last_dim(x);
  const float* px = x.f32();
  float* py = y.f32();
  cpu::parallel_for(rows(x), kRowGrain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = px + r * n;
      float* yr = py + r * n;
      const float m = row_max(xr, n);
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        const float e = std::exp(xr[j] - m);
        sum += e;
        if (!log) yr[j] = e;
      }
      if (log) {
        const float lse = m + std::log(sum);
        for (int64_t j = 0; j < n; ++j) yr[j] = xr[j] - lse;
      } else {
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < n; ++j) yr[j] *= inv;
      }
    }
  });
}

void CpuBackend::softmax_backward_impl(const Tensor& dy, const Tensor& y, bool log, const Tensor& dx) {
  const int64_t n = last_dim(y);
  const float *pdy = dy.f32(), *py = y.f32();
  float* pdx = dx.f32();
  cpu::parallel_for(rows(y), kRowGrain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *dyr = pdy + r * n, *yr = py + r * n;
      float* dxr = pdx + r * n;
      float s = 0.0f;
      if (log) {
        for (int64_t j = 0; j < n; ++j) s += dyr[j];
        for (int64_t j = 0; j < n; ++j) dxr[j] = dyr[j] - std::exp(yr[j]) * s;
      } else {
        for (int64_t j = 0; j < n; ++j) s += dyr[j] * yr[j];
        for (int64_t j = 0; j < n; ++j) dxr[j] = yr[j] * (dyr[j] - s);
      }
    }
  });
}

void CpuBackend::cross_entropy_forward_impl(const Tensor& logits, const Tensor& targets, int ignore_index,
                                            const Tensor& loss, const Tensor& lse) {
  const int64_t n = logits.size(0), v = logits.size(1);
  const float* px = logits.f32();
  const int32_t* pt = targets.i32();
  float* plse = lse.f32();
  for (int64_t r = 0; r < n; ++r) {
    if (pt[r] != ignore_index && (pt[r] < 0 || pt[r] >= v))
      REMAT_THROW("cross_entropy_forward: target ", pt[r], " at row ", r, " is outside [0, ", v, ") for logits ",
                  logits.str());
  }
  cpu::parallel_for(n, kRowGrain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = px + r * v;
      const float m = row_max(xr, v);
      float sum = 0.0f;
      for (int64_t j = 0; j < v; ++j) sum += std::exp(xr[j] - m);
      plse[r] = m + std::log(sum);
    }
  });
  double total = 0.0;
  int64_t count = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (pt[r] == ignore_index) continue;
    total += static_cast<double>(plse[r]) - static_cast<double>(px[r * v + pt[r]]);
    ++count;
  }
  loss.f32()[0] = count == 0 ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(total / count);
}

void CpuBackend::cross_entropy_backward_impl(float dloss, const Tensor& logits, const Tensor& targets,
                                             const Tensor& lse, int ignore_index, const Tensor& dlogits) {
  const int64_t n = logits.size(0), v = logits.size(1);
  const float *px = logits.f32(), *plse = lse.f32();
  const int32_t* pt = targets.i32();
  float* pd = dlogits.f32();
  int64_t count = 0;
  for (int64_t r = 0; r < n; ++r) count += pt[r] != ignore_index;
  const float scale = count == 0 ? 0.0f : dloss / static_cast<float>(count);
  cpu::parallel_for(n, kRowGrain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* dr = pd + r * v;
      if (pt[r] == ignore_index) {
        for (int64_t j = 0; j < v; ++j) dr[j] = 0.0f;
        continue;
      }
      const float* xr = px + r * v;
      for (int64_t j = 0; j < v; ++j) dr[j] = scale * std::exp(xr[j] - plse[r]);
      dr[pt[r]] -= scale;
    }
  });
}

int64_t CpuBackend::accuracy_impl(const Tensor& logits, const Tensor& targets, int ignore_index, int64_t* counted) {
  const int64_t n = logits.size(0), v = logits.size(1);
  const float* px = logits.f32();
  const int32_t* pt = targets.i32();
  int64_t correct = 0, total = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (pt[r] == ignore_index) continue;
    ++total;
    const float* xr = px + r * v;
    int64_t best = 0;
    for (int64_t j = 1; j < v; ++j)
      if (xr[j] > xr[best]) best = j;
    correct += best == pt[r];
  }
  if (counted) *counted = total;
  return correct;
}

}  // namespace remat
