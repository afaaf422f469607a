#include "kernels/batchnorm.cuh"

#include <math.h>

#include <algorithm>
#include <cstdint>

#include "kernels/launch.cuh"
#include "kernels/reduce.cuh"
#include "kernels/vec4.cuh"
#include "remat/error.h"

namespace remat::kernels {

namespace {

constexpr int kWide = 256;               // threads per block,
constexpr int kNarrow = 32;              // or one warp where a segment has fewer than kWide * kMinUnitsPerThread units
constexpr int64_t kTargetBlocks = 1024;  // several waves of blocks on a 132-SM H200
constexpr int64_t kMinUnitsPerThread = 4;
constexpr int64_t kMaxSplits = 256;
constexpr int64_t kMaxGridY = 65535;

// V consecutive floats: a float4 (f32, 16-byte aligned) or four bf16 (8-byte aligned) when
// V == 4, else one element; from a DynPtr (a launch mixing dtypes) element by element. The
// same elements whatever the dtype, so a bf16 launch runs the f32 launch's arithmetic.
template <int V>
struct Pack {
  float v[V];
};

template <int V>
__device__ REMAT_INLINE Pack<V> load(const float* p, int64_t unit) {
  Pack<V> r;
  if constexpr (V == 4) {
    const float4 f = load_unit(reinterpret_cast<const float4*>(p) + unit);
    r.v[0] = f.x;
    r.v[1] = f.y;
    r.v[2] = f.z;
    r.v[3] = f.w;
  } else {
    r.v[0] = p[unit];
  }
  return r;
}
template <int V>
__device__ REMAT_INLINE Pack<V> load(const bf16* p, int64_t unit) {
  Pack<V> r;
  if constexpr (V == 4)
    load4(p, unit, r.v);
  else
    r.v[0] = __bfloat162float(p[unit]);
  return r;
}
template <int V>
__device__ REMAT_INLINE Pack<V> load(DynPtr p, int64_t unit) {
  Pack<V> r;
  for (int i = 0; i < V; ++i) r.v[i] = ld(p, unit * V + i);
  return r;
}

template <int V>
__device__ REMAT_INLINE void store(float* p, int64_t unit, const Pack<V>& r) {
  if constexpr (V == 4) {
    store_unit(reinterpret_cast<float4*>(p) + unit, make_float4(r.v[0], r.v[1], r.v[2], r.v[3]));
  } else {
    p[unit] = r.v[0];
  }
}
template <int V>
__device__ REMAT_INLINE void store(bf16* p, int64_t unit, const Pack<V>& r) {
  if constexpr (V == 4)
    store4(p, unit, r.v);
  else
    p[unit] = __float2bfloat16_rn(r.v[0]);
}
template <int V>
__device__ REMAT_INLINE void store(DynPtr p, int64_t unit, const Pack<V>& r) {
  for (int i = 0; i < V; ++i) st(p, unit * V + i, r.v[i]);
}

// This thread's units of one channel's segment [begin, end) of the flat (image, position)
// range, units of V floats: unit u is position j = u % hw of image n = u / hw (hw in units).
// Thread t visits begin + t, begin + t + blockDim.x, ... with one division up front.
struct ChannelWalk {
  int64_t u, end, n, j, hw, dn, dj;

  __device__ ChannelWalk(int64_t begin, int64_t end_, int64_t hw_) : u(begin + threadIdx.x), end(end_), hw(hw_) {
    n = u / hw;
    j = u - n * hw;
    dn = blockDim.x / hw;
    dj = blockDim.x - dn * hw;
  }
  __device__ bool more() const { return u < end; }
  // The unit's index in an NCHW tensor of `channels` channels.
  __device__ int64_t at(int64_t c, int64_t channels) const { return (n * channels + c) * hw + j; }
  __device__ void next() {
    u += blockDim.x;
    n += dn;
    j += dj;
    if (j >= hw) {
      j -= hw;
      ++n;
    }
  }
};

// The channels [c0, c0 + gridDim.y) of one launch: channel c0 + blockIdx.y, segment
// blockIdx.x of `splits`; their partial sums at partials[(blockIdx.y * splits + segment) * 2].
struct Round {
  int64_t c0, splits;
  double* partials;
};

// The arguments of a launch; the float arrays as typed pointers (bf16.cuh: float*, bf16*
// or DynPtr), the statistics, running buffers and parameter gradients f32.
template <typename PX, typename PG, typename PB, typename PY>
struct TrainArgs {
  PX x;
  PG gamma;
  PB beta;
  BatchNormShape g;
  float momentum, eps;
  float *running_mean, *running_var;  // null: not moved
  PY y;
  float *save_mean, *save_invstd;
  Round round;
};

template <typename PX, typename PG, typename PB, typename PY>
struct EvalArgs {
  PX x;
  PG gamma;
  PB beta;
  const float *running_mean, *running_var;
  BatchNormShape g;
  float eps;
  PY y;
  Round round;
};

template <typename PDY, typename PX, typename PG, typename PDX>
struct BackwardArgs {
  PDY dy;
  PX x;
  PG gamma;
  const float *save_mean, *save_invstd;
  BatchNormShape g;
  PDX dx;                 // null: not computed
  float *dgamma, *dbeta;  // each may be null
  Round round;
};

// The block's segment of its channel, in units of V floats (empty for an empty channel).
template <int V>
struct Segment {
  int64_t c, hw, units;
  __device__ Segment(const BatchNormShape& g, const Round& r) : c(r.c0 + blockIdx.y), hw(g.hw / V), units(g.n * hw) {}
  __device__ bool empty() const { return units == 0; }
  __device__ ChannelWalk walk(const Round& r) const {
    return ChannelWalk(units * blockIdx.x / r.splits, units * (blockIdx.x + 1) / r.splits, hw);
  }
};

// Writes the block's two sums (block-reduced) as its partials.
template <int kThreads>
__device__ REMAT_INLINE void write_partials(double s1, double s2, const Round& r) {
  __shared__ double shared[kThreads / 32];
  s1 = block_sum<kThreads>(s1, shared);
  s2 = block_sum<kThreads>(s2, shared);
  if (threadIdx.x == 0) {
    double* out = r.partials + (blockIdx.y * r.splits + blockIdx.x) * 2;
    out[0] = s1;
    out[1] = s2;
  }
}

// The channel's two sums: its partials added in segment order.
__device__ REMAT_INLINE void channel_sums(const Round& r, double* s1, double* s2) {
  const double* p = r.partials + blockIdx.y * r.splits * 2;
  *s1 = 0.0;
  *s2 = 0.0;
  for (int64_t s = 0; s < r.splits; ++s) {
    *s1 += p[2 * s];
    *s2 += p[2 * s + 1];
  }
}

// Partials sum(x - shift) and sum((x - shift)^2) in double, shift = the channel's first
// element: deviations of the order of the standard deviation keep the one-pass variance
// accurate when the mean is far from 0.
template <int kThreads, int V, typename A>
__global__ void stats_partials_kernel(A a) {
  const Segment<V> seg(a.g, a.round);
  double s1 = 0.0, s2 = 0.0;
  if (!seg.empty()) {
    const double shift = ld(a.x, seg.c * a.g.hw);
    for (ChannelWalk w = seg.walk(a.round); w.more(); w.next()) {
      const Pack<V> v = load<V>(a.x, w.at(seg.c, a.g.c));
      for (int i = 0; i < V; ++i) {
        const double d = v.v[i] - shift;
        s1 += d;
        s2 += d * d;
      }
    }
  }
  write_partials<kThreads>(s1, s2, a.round);
}

// y = x * scale + shift over the block's segment, rounded as the CPU's unfused multiply-add.
template <int V, typename PX, typename PY>
__device__ REMAT_INLINE void affine_segment(PX x, const BatchNormShape& g, const Round& r, float scale, float shift,
                                            PY y) {
  const Segment<V> seg(g, r);
  if (seg.empty()) return;
  for (ChannelWalk w = seg.walk(r); w.more(); w.next()) {
    const int64_t at = w.at(seg.c, g.c);
    Pack<V> v = load<V>(x, at);
    for (int i = 0; i < V; ++i) v.v[i] = __fadd_rn(__fmul_rn(v.v[i], scale), shift);
    store<V>(y, at, v);
  }
}

// The channel's statistics from its partials (segment 0 writes them and moves the running
// statistics), then y over the block's segment.
template <int kThreads, int V, typename A>
__global__ void train_apply_kernel(A a) {
  const int64_t c = a.round.c0 + blockIdx.y;
  __shared__ float coef[2];
  if (threadIdx.x == 0) {
    double s1, s2;
    channel_sums(a.round, &s1, &s2);
    const int64_t count = a.g.n * a.g.hw;
    double mean = 0.0, sq = 0.0;  // sq: the sum of squared deviations from the mean
    if (count > 0) {
      const double m1 = s1 / static_cast<double>(count);
      mean = ld(a.x, c * a.g.hw) + m1;
      sq = s2 - s1 * m1;
      sq = sq > 0.0 ? sq : 0.0;
    }
    const double var = count > 0 ? sq / static_cast<double>(count) : 0.0;  // biased, for normalising
    const double invstd = 1.0 / sqrt(var + static_cast<double>(a.eps));
    if (blockIdx.x == 0) {
      a.save_mean[c] = static_cast<float>(mean);
      a.save_invstd[c] = static_cast<float>(invstd);
      if (a.running_mean) {  // count >= 2 (validated)
        const double m = a.momentum, unbiased = sq / static_cast<double>(count - 1);
        a.running_mean[c] = static_cast<float>((1.0 - m) * a.running_mean[c] + m * mean);
        a.running_var[c] = static_cast<float>((1.0 - m) * a.running_var[c] + m * unbiased);
      }
    }
    const double scale = invstd * ld(a.gamma, c);
    coef[0] = static_cast<float>(scale);
    coef[1] = static_cast<float>(ld(a.beta, c) - mean * scale);
  }
  __syncthreads();
  affine_segment<V>(a.x, a.g, a.round, coef[0], coef[1], a.y);
}

template <int kThreads, int V, typename A>
__global__ void eval_kernel(A a) {
  const int64_t c = a.round.c0 + blockIdx.y;
  __shared__ float coef[2];
  if (threadIdx.x == 0) {
    const double scale = ld(a.gamma, c) / sqrt(static_cast<double>(a.running_var[c]) + static_cast<double>(a.eps));
    coef[0] = static_cast<float>(scale);
    coef[1] = static_cast<float>(ld(a.beta, c) - a.running_mean[c] * scale);
  }
  __syncthreads();
  affine_segment<V>(a.x, a.g, a.round, coef[0], coef[1], a.y);
}

// Partials sum(dy) and sum((x - mean) * dy) in double.
template <int kThreads, int V, typename A>
__global__ void grad_partials_kernel(A a) {
  const Segment<V> seg(a.g, a.round);
  double s1 = 0.0, s2 = 0.0;
  if (!seg.empty()) {
    const double mean = a.save_mean[seg.c];
    for (ChannelWalk w = seg.walk(a.round); w.more(); w.next()) {
      const int64_t at = w.at(seg.c, a.g.c);
      const Pack<V> vg = load<V>(a.dy, at), vx = load<V>(a.x, at);
      for (int i = 0; i < V; ++i) {
        s1 += vg.v[i];
        s2 += (vx.v[i] - mean) * vg.v[i];
      }
    }
  }
  write_partials<kThreads>(s1, s2, a.round);
}

// The channel's parameter gradients (segment 0), then dx over the block's segment.
template <int kThreads, int V, typename A>
__global__ void backward_apply_kernel(A a) {
  const int64_t c = a.round.c0 + blockIdx.y, count = a.g.n * a.g.hw;
  __shared__ float coef[4];
  if (threadIdx.x == 0) {
    double sum_dy, dot;
    channel_sums(a.round, &sum_dy, &dot);
    const double mean = a.save_mean[c], invstd = a.save_invstd[c];
    if (blockIdx.x == 0) {
      if (a.dbeta) a.dbeta[c] += static_cast<float>(sum_dy);
      if (a.dgamma) a.dgamma[c] += static_cast<float>(dot * invstd);
    }
    if (count > 0) {
      coef[0] = static_cast<float>(dot * invstd * invstd / static_cast<double>(count));  // k
      coef[1] = static_cast<float>(mean);
      coef[2] = static_cast<float>(sum_dy / static_cast<double>(count));  // mean of dy
      coef[3] = static_cast<float>(invstd * ld(a.gamma, c));
    }
  }
  __syncthreads();
  const Segment<V> seg(a.g, a.round);
  if (!a.dx || seg.empty()) return;
  const float k = coef[0], fmean = coef[1], mdy = coef[2], scale = coef[3];
  for (ChannelWalk w = seg.walk(a.round); w.more(); w.next()) {
    const int64_t at = w.at(c, a.g.c);
    const Pack<V> vg = load<V>(a.dy, at), vx = load<V>(a.x, at);
    Pack<V> out;
    for (int i = 0; i < V; ++i)
      out.v[i] = __fmul_rn(__fsub_rn(__fsub_rn(vg.v[i], mdy), __fmul_rn(__fsub_rn(vx.v[i], fmean), k)), scale);
    store<V>(a.dx, at, out);
  }
}

// ---- Launchers ------------------------------------------------------------------------------

// How a call is cut: units of V floats (float4s when every plane is a whole number of them
// and the tensors are aligned), segments per channel (enough blocks to fill the GPU, at
// least kMinUnitsPerThread units per thread, at most kMaxSplits), one warp per block where
// segments are small, and channels per round (grid.y, and their partials in scratch).
struct Plan {
  int vec;
  int64_t splits;
  bool narrow;
  int64_t per_round;
};

Plan plan_for(const BatchNormShape& g, bool aligned, size_t scratch_bytes) {
  Plan p{};
  p.vec = g.hw % 4 == 0 && aligned ? 4 : 1;
  const int64_t units = g.n * g.hw / p.vec;
  const int64_t by_work = std::max<int64_t>(1, units / (kWide * kMinUnitsPerThread));
  const int64_t by_fill = std::max<int64_t>(1, ceil_div<int64_t>(kTargetBlocks, std::max<int64_t>(g.c, 1)));
  p.splits = std::min({by_work, by_fill, kMaxSplits});
  p.narrow = units / p.splits < kWide * kMinUnitsPerThread;
  const int64_t fit = static_cast<int64_t>(scratch_bytes / (static_cast<size_t>(p.splits) * 2 * sizeof(double)));
  REMAT_CHECK(fit >= 1, "batchnorm: a scratch of ", scratch_bytes, " bytes holds no channel's partial sums");
  p.per_round = std::min(fit, kMaxGridY);
  return p;
}

template <int kThreads, int V, typename A>
void train_round(const A& a, dim3 grid, cudaStream_t stream) {
  REMAT_LAUNCH((stats_partials_kernel<kThreads, V, A>), grid, dim3(kThreads), 0, stream, a);
  REMAT_LAUNCH((train_apply_kernel<kThreads, V, A>), grid, dim3(kThreads), 0, stream, a);
}

template <int kThreads, int V, typename A>
void eval_round(const A& a, dim3 grid, cudaStream_t stream) {
  REMAT_LAUNCH((eval_kernel<kThreads, V, A>), grid, dim3(kThreads), 0, stream, a);
}

// No dx: the second kernel needs one block per channel.
template <int kThreads, int V, typename A>
void backward_round(const A& a, bool dx, dim3 grid, cudaStream_t stream) {
  REMAT_LAUNCH((grad_partials_kernel<kThreads, V, A>), grid, dim3(kThreads), 0, stream, a);
  REMAT_LAUNCH((backward_apply_kernel<kThreads, V, A>), dim3(dx ? grid.x : 1u, grid.y), dim3(kThreads), 0, stream, a);
}

// Calls round(Layout<kThreads, V>{}, grid) for each round of plan.per_round channels, with
// the plan's instantiation.
template <int kThreads, int V>
struct Layout {
  static constexpr int kT = kThreads;
  static constexpr int kV = V;
};

template <typename A, typename F>
void run_rounds(const Plan& plan, A a, int64_t channels, void* scratch, F&& round) {
  a.round.splits = plan.splits;
  a.round.partials = static_cast<double*>(scratch);
  for (int64_t c0 = 0; c0 < channels; c0 += plan.per_round) {
    a.round.c0 = c0;
    const dim3 grid(static_cast<unsigned>(plan.splits), static_cast<unsigned>(std::min(plan.per_round, channels - c0)));
    if (plan.narrow) {
      if (plan.vec == 4)
        round(Layout<kNarrow, 4>{}, a, grid);
      else
        round(Layout<kNarrow, 1>{}, a, grid);
    } else {
      if (plan.vec == 4)
        round(Layout<kWide, 4>{}, a, grid);
      else
        round(Layout<kWide, 1>{}, a, grid);
    }
  }
}

// Packs of four when every plane is a whole number of them and each array is aligned to
// its packs (16 bytes of f32, 8 bytes of bf16; absent arrays aside): then an f32 and a bf16
// launch on the same shapes cut the work the same way.
template <typename... Bufs>
bool aligned_packs(const Bufs&... bufs) {
  return ((!bufs.p || reinterpret_cast<uintptr_t>(bufs.p) % (bufs.bf16 ? 8 : 16) == 0) && ...);
}

}  // namespace

void batchnorm_forward_train(FloatBuf x, FloatBuf gamma, FloatBuf beta, const BatchNormShape& g, float momentum,
                             float eps, float* running_mean, float* running_var, FloatBuf y, float* save_mean,
                             float* save_invstd, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  const Plan plan = plan_for(g, aligned_packs(x, y), scratch_bytes);
  with_types(
      [&](auto px, auto pg, auto pb, auto py) {
        using A = TrainArgs<decltype(px), decltype(pg), decltype(pb), decltype(py)>;
        const A a{px, pg, pb, g, momentum, eps, running_mean, running_var, py, save_mean, save_invstd, {}};
        run_rounds(plan, a, g.c, scratch, [&](auto layout, const A& ar, dim3 grid) {
          using L = decltype(layout);
          train_round<L::kT, L::kV>(ar, grid, stream);
        });
      },
      x, gamma, beta, y);
}

void batchnorm_forward_eval(FloatBuf x, FloatBuf gamma, FloatBuf beta, const float* running_mean,
                            const float* running_var, const BatchNormShape& g, float eps, FloatBuf y,
                            cudaStream_t stream) {
  if (g.n * g.hw == 0) return;
  // No partials: the plan's rounds are only bounded by grid.y.
  const Plan plan = plan_for(g, aligned_packs(x, y), ~size_t{0} / 2);
  with_types(
      [&](auto px, auto pg, auto pb, auto py) {
        using A = EvalArgs<decltype(px), decltype(pg), decltype(pb), decltype(py)>;
        const A a{px, pg, pb, running_mean, running_var, g, eps, py, {}};
        run_rounds(plan, a, g.c, nullptr, [&](auto layout, const A& ar, dim3 grid) {
          using L = decltype(layout);
          eval_round<L::kT, L::kV>(ar, grid, stream);
        });
      },
      x, gamma, beta, y);
}

void batchnorm_backward(FloatBuf dy, FloatBuf x, FloatBuf gamma, const float* save_mean, const float* save_invstd,
                        const BatchNormShape& g, FloatBuf dx, float* dgamma, float* dbeta, void* scratch,
                        size_t scratch_bytes, cudaStream_t stream) {
  if (!dx.p && !dgamma && !dbeta) return;
  const Plan plan = plan_for(g, aligned_packs(dy, x, dx), scratch_bytes);
  const bool need_dx = dx.p != nullptr;
  with_types(
      [&](auto pdy, auto px, auto pg, auto pdx) {
        using A = BackwardArgs<decltype(pdy), decltype(px), decltype(pg), decltype(pdx)>;
        const A a{pdy, px, pg, save_mean, save_invstd, g, pdx, dgamma, dbeta, {}};
        run_rounds(plan, a, g.c, scratch, [&](auto layout, const A& ar, dim3 grid) {
          using L = decltype(layout);
          backward_round<L::kT, L::kV>(ar, need_dx, grid, stream);
        });
      },
      dy, x, gamma, dx);
}

}  // namespace remat::kernels
