#include "kernels/softmax_loss.cuh"

#include <math.h>

#include "kernels/launch.cuh"
#include "kernels/reduce.cuh"
#include "kernels/rows.cuh"

namespace remat::kernels {

namespace {

using rows::Group;
using rows::Pack;

// ---- kernels -----------------------------------------------------------------------------

// The softmax normaliser of a set of values, built in one pass: their maximum m and
// s = sum of exp(x - m). s = 0 means no values yet (or only -inf ones).
//
// Special values give what the CPU's two passes (maximum, then sum of exp(x - max)) give:
// a NaN makes s NaN; a +inf maximum makes s NaN (exp(inf - inf)); -inf values add
// exp(-inf - m) = 0, and a row of only -inf has s = 0, whose log_normaliser is NaN.
struct MaxSum {
  float m;
  float s;
};

__device__ REMAT_INLINE MaxSum empty_max_sum() { return {-INFINITY, 0.0f}; }

__device__ REMAT_INLINE MaxSum push(MaxSum a, float x) {
  // A new maximum rescales the sum; its own term exp(x - x) is 1 (NaN for x = +inf).
  if (x > a.m) return {x, a.s * expf(a.m - x) + expf(x - x)};
  if (x == -INFINITY) return a;  // its term exp(-inf - m) is 0 (and -inf - m is NaN while m = -inf)
  return {a.m, a.s + expf(x - a.m)};
}

__device__ REMAT_INLINE MaxSum merge(MaxSum a, MaxSum b) {
  if (a.s == 0.0f) return b;
  if (b.s == 0.0f) return a;
  const float m = a.m > b.m ? a.m : b.m;
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

// log(sum of exp(x)) = m + log(s); NaN for a row of only -inf, as on the CPU.
__device__ REMAT_INLINE float log_normaliser(MaxSum ms) {
  return ms.s == 0.0f ? __int_as_float(0x7fc00000) : ms.m + logf(ms.s);
}

__device__ REMAT_INLINE MaxSum shfl_xor(MaxSum v, int lane_mask) {
  return {__shfl_xor_sync(kFullMask, v.m, lane_mask), __shfl_xor_sync(kFullMask, v.s, lane_mask)};
}

// MaxSum of row xr of length n over the row's threads; every thread gets the whole row's.
template <int kThreads, bool kVec, typename PX>
__device__ REMAT_INLINE MaxSum row_max_sum(PX xr, int64_t n, MaxSum* shared) {
  using P = Pack<kVec>;
  using G = Group<kThreads>;
  const int64_t first = int64_t{G::lane()} * P::kWidth, step = int64_t{kThreads} * P::kWidth;
  MaxSum ms = empty_max_sum();
  for (int64_t j = first; j < n; j += step) {
    const P x = P::load(xr + j);
    for (int k = 0; k < P::kWidth; ++k) ms = push(ms, x.v[k]);
  }
  return G::reduce(ms, shared, [](MaxSum a, MaxSum b) { return merge(a, b); });
}

template <int kThreads, bool kVec, typename PX, typename PY>
__global__ void softmax_forward_kernel(PX x, int64_t rows, int64_t n, bool log, PY y) {
  using P = Pack<kVec>;
  using G = Group<kThreads>;
  const int64_t first = int64_t{G::lane()} * P::kWidth, step = int64_t{kThreads} * P::kWidth;
  __shared__ MaxSum shared[G::kWarps];
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    const auto xr = x + r * n;
    const auto yr = y + r * n;
    const MaxSum ms = row_max_sum<kThreads, kVec>(xr, n, shared);
    const float lse = log_normaliser(ms), inv = 1.0f / ms.s;
    for (int64_t j = first; j < n; j += step) {
      P v = P::load(xr + j);
      for (int k = 0; k < P::kWidth; ++k) v.v[k] = log ? v.v[k] - lse : expf(v.v[k] - ms.m) * inv;
      v.store(yr + j);
    }
  }
}

template <int kThreads, bool kVec, typename PDY, typename PY, typename PDX>
__global__ void softmax_backward_kernel(PDY dy, PY y, int64_t rows, int64_t n, bool log, PDX dx) {
  using P = Pack<kVec>;
  using G = Group<kThreads>;
  const int64_t first = int64_t{G::lane()} * P::kWidth, step = int64_t{kThreads} * P::kWidth;
  __shared__ float shared[G::kWarps];
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    const auto dyr = dy + r * n;
    const auto yr = y + r * n;
    const auto dxr = dx + r * n;
    float s = 0.0f;  // sum(dy) for log-softmax, sum(dy * y) for softmax
    for (int64_t j = first; j < n; j += step) {
      const P g = P::load(dyr + j), v = P::load(yr + j);
      for (int k = 0; k < P::kWidth; ++k) s += log ? g.v[k] : g.v[k] * v.v[k];
    }
    s = G::sum(s, shared);
    for (int64_t j = first; j < n; j += step) {
      P g = P::load(dyr + j);
      const P v = P::load(yr + j);
      for (int k = 0; k < P::kWidth; ++k) g.v[k] = log ? g.v[k] - expf(v.v[k]) * s : v.v[k] * (g.v[k] - s);
      g.store(dxr + j);
    }
  }
}

// lse[r] = logsumexp(x[r, :]); with row_mean (label smoothing), also the row's mean.
template <int kThreads, bool kVec, typename PX>
__global__ void logsumexp_kernel(PX x, int64_t rows, int64_t n, float* lse, float* row_mean) {
  using P = Pack<kVec>;
  using G = Group<kThreads>;
  const int64_t first = int64_t{G::lane()} * P::kWidth, step = int64_t{kThreads} * P::kWidth;
  __shared__ MaxSum shared[G::kWarps];
  __shared__ float fshared[G::kWarps];
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    const MaxSum ms = row_max_sum<kThreads, kVec>(x + r * n, n, shared);
    if (G::lane() == 0) lse[r] = log_normaliser(ms);
    if (row_mean) {
      float s = 0.0f;
      for (int64_t j = first; j < n; j += step) {
        const P v = P::load(x + r * n + j);
        for (int k = 0; k < P::kWidth; ++k) s += v.v[k];
      }
      s = G::sum(s, fshared);
      if (G::lane() == 0) row_mean[r] = s / static_cast<float>(n);
    }
  }
}

constexpr int kRowsReduceThreads = 256;  // one block reduces over all rows

// loss[0] = mean of lse[r] - x[r, t[r]] over the rows not ignored, in double: each
// thread sums rows tid, tid + 256, ... in order, then the block sums the threads. With
// label smoothing e: lse[r] - (1 - e) x[r, t[r]] - e row_mean[r].
template <typename PX>
__global__ void cross_entropy_loss_kernel(PX x, const int32_t* targets, const float* lse, const float* row_mean,
                                          float smoothing, int64_t rows, int64_t n, int ignore_index, float* loss,
                                          CrossEntropyCheck* check) {
  __shared__ double dshared[kRowsReduceThreads / 32];
  __shared__ long long ishared[kRowsReduceThreads / 32];
  constexpr long long kNone = 0x7fffffffffffffffLL;
  double total = 0.0;
  long long count = 0, first_bad = kNone;
  for (int64_t r = threadIdx.x; r < rows; r += kRowsReduceThreads) {
    const int32_t t = targets[r];
    if (t == ignore_index) continue;
    if (t < 0 || t >= n) {
      if (first_bad == kNone) first_bad = r;
      continue;
    }
    if (row_mean)
      total += static_cast<double>(lse[r]) -
               (1.0 - static_cast<double>(smoothing)) * static_cast<double>(ld(x, r * n + t)) -
               static_cast<double>(smoothing) * static_cast<double>(row_mean[r]);
    else
      total += static_cast<double>(lse[r]) - static_cast<double>(ld(x, r * n + t));
    ++count;
  }
  total = block_sum<kRowsReduceThreads>(total, dshared);
  count = block_sum<kRowsReduceThreads>(count, ishared);
  first_bad = -block_max<kRowsReduceThreads>(-first_bad, ishared);  // the smallest bad row
  if (threadIdx.x == 0) {
    loss[0] = count == 0 ? __int_as_float(0x7fc00000) : static_cast<float>(total / static_cast<double>(count));
    check->bad_row = first_bad == kNone ? -1 : first_bad;
    check->bad_target = first_bad == kNone ? 0 : targets[first_bad];
  }
}

// *scale = dloss / (rows not ignored), or 0 when every row is ignored.
__global__ void cross_entropy_scale_kernel(const int32_t* targets, int64_t rows, int ignore_index, float dloss,
                                           float* scale) {
  __shared__ long long shared[kRowsReduceThreads / 32];
  long long count = 0;
  for (int64_t r = threadIdx.x; r < rows; r += kRowsReduceThreads) count += targets[r] != ignore_index;
  count = block_sum<kRowsReduceThreads>(count, shared);
  if (threadIdx.x == 0) *scale = count == 0 ? 0.0f : dloss / static_cast<float>(count);
}

template <int kThreads, bool kVec, typename PX, typename PDX>
__global__ void cross_entropy_backward_kernel(PX x, const int32_t* targets, const float* lse, const float* scale,
                                              float smoothing, int64_t rows, int64_t n, int ignore_index, PDX dx) {
  using P = Pack<kVec>;
  using G = Group<kThreads>;
  const int64_t first = int64_t{G::lane()} * P::kWidth, step = int64_t{kThreads} * P::kWidth;
  const float s = *scale;
  // Label smoothing: every column's target share e / n, the target's 1 - e on top.
  const float s_all = s * (smoothing / static_cast<float>(n)), s_target = s * (1.0f - smoothing);
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    const auto xr = x + r * n;
    const auto dxr = dx + r * n;
    const int32_t t = targets[r];
    const bool ignored = t == ignore_index;
    const float l = lse[r];
    for (int64_t j = first; j < n; j += step) {
      P v;
      if (ignored) {
        for (float& e : v.v) e = 0.0f;
      } else {
        v = P::load(xr + j);
        for (int k = 0; k < P::kWidth; ++k) v.v[k] = s * expf(v.v[k] - l) - s_all - (j + k == t ? s_target : 0.0f);
      }
      v.store(dxr + j);
    }
  }
}

// A candidate maximum: value and column (kNoColumn: none yet).
struct ArgMax {
  float v;
  long long i;
};
constexpr long long kNoColumn = 0x7fffffffffffffffLL;

__device__ REMAT_INLINE ArgMax shfl_xor(ArgMax a, int lane_mask) {
  return {__shfl_xor_sync(kFullMask, a.v, lane_mask), __shfl_xor_sync(kFullMask, a.i, lane_mask)};
}

// The larger value; of equal values the first column.
__device__ REMAT_INLINE ArgMax first_max(ArgMax a, ArgMax b) { return b.v > a.v || (b.v == a.v && b.i < a.i) ? b : a; }

template <int kThreads, bool kVec, typename PX>
__global__ void accuracy_kernel(PX x, const int32_t* targets, int64_t rows, int64_t n, int ignore_index,
                                unsigned long long* counts) {
  using P = Pack<kVec>;
  using G = Group<kThreads>;
  const int64_t first = int64_t{G::lane()} * P::kWidth, step = int64_t{kThreads} * P::kWidth;
  __shared__ ArgMax shared[G::kWarps];
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    const int32_t t = targets[r];
    if (t == ignore_index) continue;  // the same for the whole row group
    const auto xr = x + r * n;
    ArgMax best{-INFINITY, kNoColumn};
    for (int64_t j = first; j < n; j += step) {
      const P v = P::load(xr + j);
      for (int k = 0; k < P::kWidth; ++k)
        if (v.v[k] > best.v) best = {v.v[k], j + k};  // NaN never wins
    }
    best = G::reduce(best, shared, [](ArgMax a, ArgMax b) { return first_max(a, b); });
    if (G::lane() == 0) {
      // The CPU scans from column 0 keeping the first strictly larger value: it ends at
      // 0 when nothing beats x[0] (all -inf) or x[0] is NaN (nothing compares larger).
      const long long col = best.i == kNoColumn || isnan(ld(xr, 0)) ? 0 : best.i;
      atomicAdd(&counts[0], 1ull);
      if (col == t) atomicAdd(&counts[1], 1ull);
    }
  }
}

}  // namespace

// ---- launchers ---------------------------------------------------------------------------

void softmax_forward(FloatBuf x, int64_t rows, int64_t n, bool log, FloatBuf y, cudaStream_t stream) {
  if (rows == 0 || n == 0) return;
  const bool vec = rows::can_vectorise_bufs(n, x, y);
  with_types(
      [&](auto px, auto py) {
        REMAT_LAUNCH_ROWS_T(softmax_forward_kernel, (decltype(px), decltype(py)), rows, n, vec, stream, px, rows, n,
                            log, py);
      },
      x, y);
}

void softmax_backward(FloatBuf dy, FloatBuf y, int64_t rows, int64_t n, bool log, FloatBuf dx, cudaStream_t stream) {
  if (rows == 0 || n == 0) return;
  const bool vec = rows::can_vectorise_bufs(n, dy, y, dx);
  with_types(
      [&](auto pdy, auto py, auto pdx) {
        REMAT_LAUNCH_ROWS_T(softmax_backward_kernel, (decltype(pdy), decltype(py), decltype(pdx)), rows, n, vec, stream,
                            pdy, py, rows, n, log, pdx);
      },
      dy, y, dx);
}

void cross_entropy_forward(FloatBuf x, const int32_t* targets, int64_t rows, int64_t n, int ignore_index,
                           float smoothing, float* loss, float* lse, float* row_mean, CrossEntropyCheck* check,
                           cudaStream_t stream) {
  const bool vec = rows::can_vectorise_bufs(n, x);
  float* mean = smoothing > 0.0f ? row_mean : nullptr;
  with_types(
      [&](auto px) {
        using PX = decltype(px);
        if (rows > 0) REMAT_LAUNCH_ROWS_T(logsumexp_kernel, (PX), rows, n, vec, stream, px, rows, n, lse, mean);
        REMAT_LAUNCH(cross_entropy_loss_kernel<PX>, dim3(1), dim3(kRowsReduceThreads), 0, stream, px, targets, lse,
                     mean, smoothing, rows, n, ignore_index, loss, check);
      },
      x);
}

void cross_entropy_backward(float dloss, FloatBuf x, const int32_t* targets, const float* lse, int64_t rows, int64_t n,
                            int ignore_index, float smoothing, FloatBuf dx, float* scale, cudaStream_t stream) {
  if (rows == 0 || n == 0) return;
  REMAT_LAUNCH(cross_entropy_scale_kernel, dim3(1), dim3(kRowsReduceThreads), 0, stream, targets, rows, ignore_index,
               dloss, scale);
  const bool vec = rows::can_vectorise_bufs(n, x, dx);
  with_types(
      [&](auto px, auto pdx) {
        REMAT_LAUNCH_ROWS_T(cross_entropy_backward_kernel, (decltype(px), decltype(pdx)), rows, n, vec, stream, px,
                            targets, lse, scale, smoothing, rows, n, ignore_index, pdx);
      },
      x, dx);
}

void accuracy(FloatBuf x, const int32_t* targets, int64_t rows, int64_t n, int ignore_index, unsigned long long* counts,
              cudaStream_t stream) {
  if (rows == 0) return;
  const bool vec = rows::can_vectorise_bufs(n, x);
  with_types(
      [&](auto px) {
        REMAT_LAUNCH_ROWS_T(accuracy_kernel, (decltype(px)), rows, n, vec, stream, px, targets, rows, n, ignore_index,
                            counts);
      },
      x);
}

}  // namespace remat::kernels
