// Softmax and log-softmax over the last dimension, cross-entropy, accuracy.
#include <cmath>
#include <limits>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/mixed.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/vmath.h"
#include "remat/error.h"

namespace remat {

namespace {

int64_t last_dim(const Tensor& t) { return t.size(-1); }
int64_t rows(const Tensor& t) { return last_dim(t) == 0 ? 0 : t.numel() / last_dim(t); }
constexpr int64_t kRowGrain = 16;

// Row reductions with 8 independent lanes combined in a fixed order: they vectorise,
// and the result depends only on the row (never on threads).
constexpr int kLanes = 8;

float row_max(const float* x, int64_t n) {
  float m[kLanes];
  for (float& v : m) v = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
  for (; j < n; ++j) m[0] = x[j] > m[0] ? x[j] : m[0];
  float r = m[0];
  for (int l = 1; l < kLanes; ++l) r = m[l] > r ? m[l] : r;
  return r;
}

// sum of exp(x[j] - m), writing the exponentials to e (two loops: no branch inside).
float row_sum_exp(const float* x, int64_t n, float m, float* e) {
  float s[kLanes] = {};
  int64_t j = 0;
  if (e) {
    for (; j + kLanes <= n; j += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const float v = cpu::vexp(x[j + l] - m);
        e[j + l] = v;
        s[l] += v;
      }
  } else {
    for (; j + kLanes <= n; j += kLanes)
      for (int l = 0; l < kLanes; ++l) s[l] += cpu::vexp(x[j + l] - m);
  }
  for (; j < n; ++j) {
    const float v = cpu::vexp(x[j] - m);
    if (e) e[j] = v;
    s[0] += v;
  }
  float r = 0.0f;
  for (int l = 0; l < kLanes; ++l) r += s[l];
  return r;
}

float row_dot(const float* a, const float* b, int64_t n) {
  float s[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) s[l] += a[j + l] * b[j + l];
  for (; j < n; ++j) s[0] += a[j] * b[j];
  float r = 0.0f;
  for (int l = 0; l < kLanes; ++l) r += s[l];
  return r;
}

float row_sum(const float* a, int64_t n) {
  float s[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) s[l] += a[j + l];
  for (; j < n; ++j) s[0] += a[j];
  float r = 0.0f;
  for (int l = 0; l < kLanes; ++l) r += s[l];
  return r;
}

}  // namespace

void CpuBackend::softmax_forward_impl(const Tensor& x, bool log, const Tensor& y) {
  const int64_t n = last_dim(x);
  // x and y may be bf16 here and below: rows staged in fp32 (mixed.h); lse and the loss are f32.
  cpu::parallel_for(rows(x), kRowGrain, [&](int64_t r0, int64_t r1) {
    cpu::F32Reader rx(x, 0);
    cpu::F32Writer wy(y, 2);
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = rx.row(r, n);
      float* yr = wy.row(r, n);
      const float m = row_max(xr, n);
      const float sum = row_sum_exp(xr, n, m, log ? nullptr : yr);
      if (log) {
        const float lse = m + std::log(sum);
        for (int64_t j = 0; j < n; ++j) yr[j] = xr[j] - lse;
      } else {
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < n; ++j) yr[j] *= inv;
      }
      wy.put();
    }
  });
}

void CpuBackend::softmax_backward_impl(const Tensor& dy, const Tensor& y, bool log, const Tensor& dx) {
  const int64_t n = last_dim(y);
  cpu::parallel_for(rows(y), kRowGrain, [&](int64_t r0, int64_t r1) {
    cpu::F32Reader rdy(dy, 0), ry(y, 1);
    cpu::F32Writer wdx(dx, 2);
    for (int64_t r = r0; r < r1; ++r) {
      const float *dyr = rdy.row(r, n), *yr = ry.row(r, n);
      float* dxr = wdx.row(r, n);
      if (log) {
        const float s = row_sum(dyr, n);
        for (int64_t j = 0; j < n; ++j) dxr[j] = dyr[j] - cpu::vexp(yr[j]) * s;
      } else {
        const float s = row_dot(dyr, yr, n);
        for (int64_t j = 0; j < n; ++j) dxr[j] = yr[j] * (dyr[j] - s);
      }
      wdx.put();
    }
  });
}

size_t cpu::cross_entropy_forward_workspace(const Shape& logits, float smoothing) {
  return smoothing > 0.0f ? static_cast<size_t>(logits[0]) * sizeof(float) : 0;
}

size_t CpuBackend::cross_entropy_forward_workspace_impl(const Shape& logits, float smoothing) {
  return cpu::cross_entropy_forward_workspace(logits, smoothing);
}

void CpuBackend::cross_entropy_forward_impl(const Tensor& logits, const Tensor& targets, int ignore_index,
                                            float smoothing, const Tensor& loss, const Tensor& lse,
                                            const Tensor& workspace) {
  const int64_t n = logits.size(0), v = logits.size(1);
  const int32_t* pt = targets.i32();
  float* plse = lse.f32();
  float* mean = smoothing > 0.0f ? workspace.f32() : nullptr;  // label smoothing: the row means
  for (int64_t r = 0; r < n; ++r) {
    if (pt[r] != ignore_index && (pt[r] < 0 || pt[r] >= v))
      REMAT_THROW("cross_entropy_forward: target ", pt[r], " at row ", r, " is outside [0, ", v, ") for logits ",
                  logits.str());
  }
  cpu::parallel_for(n, kRowGrain, [&](int64_t r0, int64_t r1) {
    cpu::F32Reader rx(logits, 0);
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = rx.row(r, v);
      const float m = row_max(xr, v);
      plse[r] = m + std::log(row_sum_exp(xr, v, m, nullptr));
      if (mean) mean[r] = row_sum(xr, v) / static_cast<float>(v);
    }
  });
  double total = 0.0;
  int64_t count = 0;
  cpu::F32Reader rx(logits, 0);
  const double keep = 1.0 - static_cast<double>(smoothing);
  for (int64_t r = 0; r < n; ++r) {
    if (pt[r] == ignore_index) continue;
    const double xt = static_cast<double>(*rx.get(r * v + pt[r], 1));
    if (mean)
      total += static_cast<double>(plse[r]) - keep * xt - static_cast<double>(smoothing) * static_cast<double>(mean[r]);
    else
      total += static_cast<double>(plse[r]) - xt;
    ++count;
  }
  loss.f32()[0] = count == 0 ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(total / count);
}

void CpuBackend::cross_entropy_backward_impl(float dloss, const Tensor& logits, const Tensor& targets,
                                             const Tensor& lse, int ignore_index, float smoothing,
                                             const Tensor& dlogits) {
  const int64_t n = logits.size(0), v = logits.size(1);
  const float* plse = lse.f32();
  const int32_t* pt = targets.i32();
  int64_t count = 0;
  for (int64_t r = 0; r < n; ++r) count += pt[r] != ignore_index;
  const float scale = count == 0 ? 0.0f : dloss / static_cast<float>(count);
  // Label smoothing: every column's target share e / V, the target's 1 - e on top (with
  // e = 0, s_all is 0 and s_target the scale: the plain cross-entropy's bits).
  const float s_all = scale * (smoothing / static_cast<float>(v)), s_target = scale * (1.0f - smoothing);
  cpu::parallel_for(n, kRowGrain, [&](int64_t r0, int64_t r1) {
    cpu::F32Reader rx(logits, 0);
    cpu::F32Writer wd(dlogits, 2);
    for (int64_t r = r0; r < r1; ++r) {
      float* dr = wd.row(r, v);
      if (pt[r] == ignore_index) {
        for (int64_t j = 0; j < v; ++j) dr[j] = 0.0f;
      } else {
        const float* xr = rx.row(r, v);
        const float l = plse[r];
        for (int64_t j = 0; j < v; ++j) dr[j] = scale * cpu::vexp(xr[j] - l) - s_all;
        dr[pt[r]] -= s_target;
      }
      wd.put();
    }
  });
}

int64_t CpuBackend::accuracy_impl(const Tensor& logits, const Tensor& targets, int ignore_index, int64_t* counted) {
  const int64_t n = logits.size(0), v = logits.size(1);
  const int32_t* pt = targets.i32();
  int64_t correct = 0, total = 0;
  cpu::F32Reader rx(logits, 0);
  for (int64_t r = 0; r < n; ++r) {
    if (pt[r] == ignore_index) continue;
    ++total;
    const float* xr = rx.row(r, v);
    int64_t best = 0;
    for (int64_t j = 1; j < v; ++j)
      if (xr[j] > xr[best]) best = j;
    correct += best == pt[r];
  }
  if (counted) *counted = total;
  return correct;
}

}  // namespace remat
