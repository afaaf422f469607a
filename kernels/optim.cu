#include "kernels/launch.cuh"
#include "kernels/optim.cuh"
#include "kernels/reduce.cuh"
#include "kernels/vec4.cuh"

namespace remat::kernels {

namespace {

constexpr int kBlock = 256;
static_assert(kBlock == kSumSquaresBlock, "sum_squares_blocks counts blocks of kBlock threads");

// ---- SGD and AdamW: one element -------------------------------------------------------
// The operations and their order are the CPU backend's, so results agree to the rounding
// of fused multiply-adds (which nvcc forms and the CPU build does not).

template <bool kMomentum>
__device__ REMAT_INLINE void sgd_update(float& w, float g, float& buf, const SgdCoefficients& c) {
  float d = g;
  if (c.weight_decay != 0.0f) d = d + c.weight_decay * w;
  if (kMomentum) {
    buf = c.first_step ? d : buf * c.momentum + c.one_minus_dampening * d;
    d = c.nesterov ? d + c.momentum * buf : buf;
  }
  w = w + c.neg_lr * d;
}

__device__ REMAT_INLINE void adamw_update(float& w, float g, float& m, float& v, const AdamWCoefficients& c) {
  w = w * c.decay;
  m = m * c.beta1 + g * c.one_minus_beta1;
  v = v * c.beta2 + c.one_minus_beta2 * g * g;
  const float denom = sqrtf(v) / c.bc2_sqrt + c.eps;
  w = w + (-c.step_size) * (m / denom);
}

// ---- Kernels: grid-stride over float4s when vec (every pointer 16-byte aligned), then
// the last n % 4 elements one by one; without vec, element by element. -------------------

template <bool kMomentum>
__global__ void sgd_kernel(float* w, const float* g, float* buf, int64_t n, SgdCoefficients c, bool vec) {
  const int64_t start = grid_start(), stride = grid_stride();
  int64_t done = 0;
  if (vec) {
    const int64_t n4 = n / 4;
    for (int64_t q = start; q < n4; q += stride) {
      float4 w4 = load4(w, q), b4 = kMomentum ? load4(buf, q) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const float4 g4 = load4(g, q);
      sgd_update<kMomentum>(w4.x, g4.x, b4.x, c);
      sgd_update<kMomentum>(w4.y, g4.y, b4.y, c);
      sgd_update<kMomentum>(w4.z, g4.z, b4.z, c);
      sgd_update<kMomentum>(w4.w, g4.w, b4.w, c);
      store4(w, q, w4);
      if (kMomentum) store4(buf, q, b4);
    }
    done = n4 * 4;
  }
  for (int64_t i = done + start; i < n; i += stride) {
    float b = kMomentum ? buf[i] : 0.0f;
    sgd_update<kMomentum>(w[i], g[i], b, c);
    if (kMomentum) buf[i] = b;
  }
}

__global__ void adamw_kernel(float* w, const float* g, float* m, float* v, int64_t n, AdamWCoefficients c, bool vec) {
  const int64_t start = grid_start(), stride = grid_stride();
  int64_t done = 0;
  if (vec) {
    const int64_t n4 = n / 4;
    for (int64_t q = start; q < n4; q += stride) {
      float4 w4 = load4(w, q), m4 = load4(m, q), v4 = load4(v, q);
      const float4 g4 = load4(g, q);
      adamw_update(w4.x, g4.x, m4.x, v4.x, c);
      adamw_update(w4.y, g4.y, m4.y, v4.y, c);
      adamw_update(w4.z, g4.z, m4.z, v4.z, c);
      adamw_update(w4.w, g4.w, m4.w, v4.w, c);
      store4(w, q, w4);
      store4(m, q, m4);
      store4(v, q, v4);
    }
    done = n4 * 4;
  }
  for (int64_t i = done + start; i < n; i += stride) adamw_update(w[i], g[i], m[i], v[i], c);
}

// ---- Multi-tensor AdamW ------------------------------------------------------------------

struct AdamWMultiArgs {
  AdamWMultiEntry e[kAdamWMultiMax];
  int first_block[kAdamWMultiMax];  // entry i's chunks are blocks first_block[i], ...
  int vec[kAdamWMultiMax];          // every pointer of entry i 16-byte aligned
  int count;
};
static_assert(sizeof(AdamWMultiArgs) <= 4000, "AdamWMultiArgs: over the 4 KiB kernel-argument limit");

__global__ void adamw_multi_kernel(AdamWMultiArgs a) {
  int at = 0;  // the last entry starting at or before this block (empty entries own no block)
  for (int i = 1; i < a.count; ++i)
    if (a.first_block[i] <= static_cast<int>(blockIdx.x)) at = i;
  const AdamWMultiEntry& e = a.e[at];
  const AdamWCoefficients c = e.c;
  const int64_t begin = static_cast<int64_t>(blockIdx.x - a.first_block[at]) * kAdamWMultiChunk;
  const int64_t end = begin + kAdamWMultiChunk < e.n ? begin + kAdamWMultiChunk : e.n;
  int64_t done = begin;
  if (a.vec[at]) {
    for (int64_t q = begin / 4 + threadIdx.x; q < end / 4; q += blockDim.x) {
      float4 w4 = load4(e.w, q), m4 = load4(e.m, q), v4 = load4(e.v, q);
      const float4 g4 = load4(e.g, q);
      adamw_update(w4.x, g4.x, m4.x, v4.x, c);
      adamw_update(w4.y, g4.y, m4.y, v4.y, c);
      adamw_update(w4.z, g4.z, m4.z, v4.z, c);
      adamw_update(w4.w, g4.w, m4.w, v4.w, c);
      store4(e.w, q, w4);
      store4(e.m, q, m4);
      store4(e.v, q, v4);
    }
    done = end / 4 * 4;
  }
  for (int64_t i = done + threadIdx.x; i < end; i += blockDim.x) adamw_update(e.w[i], e.g[i], e.m[i], e.v[i], c);
}

// ---- Multi-tensor SGD ----------------------------------------------------------------------

struct SgdMultiArgs {
  SgdMultiEntry e[kSgdMultiMax];
  int first_block[kSgdMultiMax];  // entry i's chunks are blocks first_block[i], ...
  int vec[kSgdMultiMax];          // every pointer of entry i 16-byte aligned
  int count;
};
static_assert(sizeof(SgdMultiArgs) <= 4000, "SgdMultiArgs: over the 4 KiB kernel-argument limit");

// Elements [begin, end) of one entry, as sgd_kernel<kMomentum> updates them: float4s when
// vec (begin is a multiple of 4), then the rest one by one.
template <bool kMomentum>
__device__ void sgd_multi_chunk(const SgdMultiEntry& e, int64_t begin, int64_t end, bool vec) {
  const SgdCoefficients c = e.c;
  int64_t done = begin;
  if (vec) {
    for (int64_t q = begin / 4 + threadIdx.x; q < end / 4; q += blockDim.x) {
      float4 w4 = load4(e.w, q), b4 = kMomentum ? load4(e.buf, q) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const float4 g4 = load4(e.g, q);
      sgd_update<kMomentum>(w4.x, g4.x, b4.x, c);
      sgd_update<kMomentum>(w4.y, g4.y, b4.y, c);
      sgd_update<kMomentum>(w4.z, g4.z, b4.z, c);
      sgd_update<kMomentum>(w4.w, g4.w, b4.w, c);
      store4(e.w, q, w4);
      if (kMomentum) store4(e.buf, q, b4);
    }
    done = end / 4 * 4;
  }
  for (int64_t i = done + threadIdx.x; i < end; i += blockDim.x) {
    float b = kMomentum ? e.buf[i] : 0.0f;
    sgd_update<kMomentum>(e.w[i], e.g[i], b, c);
    if (kMomentum) e.buf[i] = b;
  }
}

__global__ void sgd_multi_kernel(SgdMultiArgs a) {
  int at = 0;  // the last entry starting at or before this block (empty entries own no block)
  for (int i = 1; i < a.count; ++i)
    if (a.first_block[i] <= static_cast<int>(blockIdx.x)) at = i;
  const SgdMultiEntry& e = a.e[at];
  const int64_t begin = static_cast<int64_t>(blockIdx.x - a.first_block[at]) * kSgdMultiChunk;
  const int64_t end = begin + kSgdMultiChunk < e.n ? begin + kSgdMultiChunk : e.n;
  if (e.buf)
    sgd_multi_chunk<true>(e, begin, end, a.vec[at] != 0);
  else
    sgd_multi_chunk<false>(e, begin, end, a.vec[at] != 0);
}

unsigned blocks_for(int64_t n, bool vec) { return grid_stride_blocks(vec ? ceil_div<int64_t>(n, 4) : n, kBlock); }

// ---- Sum of squares ---------------------------------------------------------------------

__device__ REMAT_INLINE double square(float v) { return static_cast<double>(v) * v; }

// Thread t of the grid (block b of `blocks`) sums, in double, the squares of the groups
// of four elements q = t, t + stride, ... in index order (a float4 when vec, else up to
// four loads); returns the block's sum. The same grouping with or without vec, so
// alignment does not change the bits.
__device__ double sum_squares_block(const float* x, int64_t n, bool vec, int64_t b, int64_t blocks, double* warp_sums) {
  const int64_t groups = ceil_div<int64_t>(n, 4), stride = blocks * kBlock;
  double s = 0.0;
  for (int64_t q = b * kBlock + threadIdx.x; q < groups; q += stride) {
    if (vec && 4 * q + 3 < n) {
      const float4 v = load4(x, q);
      s += square(v.x);
      s += square(v.y);
      s += square(v.z);
      s += square(v.w);
    } else {
      for (int64_t i = 4 * q; i < 4 * q + 4 && i < n; ++i) s += square(x[i]);
    }
  }
  return block_sum<kBlock>(s, warp_sums);
}

// The block's sum of squares goes to partials[blockIdx.x].
__global__ void sum_squares_partial_kernel(const float* x, int64_t n, bool vec, double* partials) {
  __shared__ double warp_sums[kBlock / 32];
  const double s = sum_squares_block(x, n, vec, blockIdx.x, gridDim.x, warp_sums);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// Thread t adds partials t, t + kBlock, ... in order, then a block sum.
__device__ double sum_partials_block(const double* partials, int count, double* warp_sums) {
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += kBlock) s += partials[i];
  return block_sum<kBlock>(s, warp_sums);
}

// One block.
__global__ void sum_partials_kernel(const double* partials, int count, double* total, bool accumulate) {
  __shared__ double warp_sums[kBlock / 32];
  const double s = sum_partials_block(partials, count, warp_sums);
  if (threadIdx.x == 0) *total = accumulate ? *total + s : s;
}

// ---- Multi-tensor sum of squares -----------------------------------------------------------

struct NormMultiArgs {
  NormMultiEntry e[kNormMultiMax];
  int first_block[kNormMultiMax + 1];  // entry i's blocks: [first_block[i], first_block[i + 1])
  int vec[kNormMultiMax];
  int count;
};
static_assert(sizeof(NormMultiArgs) <= 4000, "NormMultiArgs: over the 4 KiB kernel-argument limit");

// Block blockIdx.x works for the entry whose blocks hold it, as block (blockIdx.x - first)
// of sum_squares_partial_kernel's grid over that entry alone: the same partial sums.
__global__ void sum_squares_multi_partial_kernel(NormMultiArgs a, double* partials) {
  __shared__ double warp_sums[kBlock / 32];
  int at = 0;
  while (at + 1 < a.count && a.first_block[at + 1] <= static_cast<int>(blockIdx.x)) ++at;
  const int first = a.first_block[at], blocks = a.first_block[at + 1] - first;
  const double s = sum_squares_block(a.e[at].x, a.e[at].n, a.vec[at] != 0, blockIdx.x - first, blocks, warp_sums);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// One block: each entry's partials summed as sum_partials_kernel sums them, and added to
// the total in entry order, as a sum_squares call per entry would.
__global__ void sum_partials_multi_kernel(NormMultiArgs a, const double* partials, double* total, bool accumulate) {
  __shared__ double warp_sums[kBlock / 32];
  double t = accumulate ? *total : 0.0;
  for (int i = 0; i < a.count; ++i) {
    const int first = a.first_block[i];
    const double s = sum_partials_block(partials + first, a.first_block[i + 1] - first, warp_sums);
    t = i == 0 && !accumulate ? s : t + s;
  }
  if (threadIdx.x == 0) *total = t;
}

// ---- Gradient clipping ------------------------------------------------------------------

__global__ void clip_coefficient_kernel(const double* total, double max_norm, ClipScale* scale) {
  const double coef = max_norm / (sqrt(*total) + 1e-6);  // IEEE double: the host's bits
  scale->apply = coef < 1.0;
  scale->value = coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

__global__ void scale_by_clip_kernel(float* x, int64_t n, const ClipScale* scale) {
  if (!scale->apply) return;
  const float a = scale->value;
  for (int64_t i = grid_start(); i < n; i += grid_stride()) x[i] = a * x[i];
}

struct ScaleMultiArgs {
  float* x[kNormMultiMax];
  int64_t n[kNormMultiMax];
  int first_block[kNormMultiMax + 1];  // entry i's chunks: blocks [first_block[i], first_block[i + 1])
  int count;
};
static_assert(sizeof(ScaleMultiArgs) <= 4000, "ScaleMultiArgs: over the 4 KiB kernel-argument limit");

// One chunk of kScaleMultiChunk elements of one entry per block; x[i] = scale * x[i] as
// scale_by_clip_kernel does it.
__global__ void scale_by_clip_multi_kernel(ScaleMultiArgs a, const ClipScale* scale) {
  if (!scale->apply) return;
  const float s = scale->value;
  int at = 0;
  while (at + 1 < a.count && a.first_block[at + 1] <= static_cast<int>(blockIdx.x)) ++at;
  const int64_t begin = static_cast<int64_t>(blockIdx.x - a.first_block[at]) * kScaleMultiChunk;
  const int64_t end = begin + kScaleMultiChunk < a.n[at] ? begin + kScaleMultiChunk : a.n[at];
  float* x = a.x[at];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) x[i] = s * x[i];
}

}  // namespace

void scale_by_clip_multi(float* const* xs, const int64_t* ns, int count, const ClipScale* scale, cudaStream_t stream) {
  ScaleMultiArgs a{};
  a.count = count;
  int blocks = 0;
  for (int i = 0; i < count; ++i) {
    a.x[i] = xs[i];
    a.n[i] = ns[i];
    a.first_block[i] = blocks;
    blocks += static_cast<int>(ceil_div<int64_t>(ns[i], kScaleMultiChunk));
  }
  a.first_block[count] = blocks;
  if (blocks > 0)
    REMAT_LAUNCH(scale_by_clip_multi_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kBlock), 0, stream, a, scale);
}

void sum_squares_multi(const NormMultiEntry* entries, int count, double* partials, double* total, bool accumulate,
                       cudaStream_t stream) {
  NormMultiArgs a{};
  a.count = count;
  int blocks = 0;
  for (int i = 0; i < count; ++i) {
    a.e[i] = entries[i];
    a.first_block[i] = blocks;
    a.vec[i] = aligned16(entries[i].x);
    blocks += static_cast<int>(sum_squares_blocks(entries[i].n));
  }
  a.first_block[count] = blocks;
  if (blocks > 0) REMAT_LAUNCH(sum_squares_multi_partial_kernel, dim3(blocks), dim3(kBlock), 0, stream, a, partials);
  REMAT_LAUNCH(sum_partials_multi_kernel, dim3(1), dim3(kBlock), 0, stream, a, partials, total, accumulate);
}

void clip_coefficient(const double* total, double max_norm, ClipScale* scale, cudaStream_t stream) {
  REMAT_LAUNCH(clip_coefficient_kernel, dim3(1), dim3(1), 0, stream, total, max_norm, scale);
}

void scale_by_clip(float* x, int64_t n, const ClipScale* scale, cudaStream_t stream) {
  REMAT_LAUNCH(scale_by_clip_kernel, dim3(grid_stride_blocks(n, kBlock)), dim3(kBlock), 0, stream, x, n, scale);
}

void sgd_step(float* param, const float* grad, float* momentum_buf, int64_t n, const SgdCoefficients& c,
              cudaStream_t stream) {
  const bool vec = aligned16(param) && aligned16(grad) && aligned16(momentum_buf);
  const dim3 grid(blocks_for(n, vec)), block(kBlock);
  if (momentum_buf)
    REMAT_LAUNCH(sgd_kernel<true>, grid, block, 0, stream, param, grad, momentum_buf, n, c, vec);
  else
    REMAT_LAUNCH(sgd_kernel<false>, grid, block, 0, stream, param, grad, momentum_buf, n, c, vec);
}

void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const AdamWCoefficients& c, cudaStream_t stream) {
  const bool vec = aligned16(param) && aligned16(grad) && aligned16(exp_avg) && aligned16(exp_avg_sq);
  REMAT_LAUNCH(adamw_kernel, dim3(blocks_for(n, vec)), dim3(kBlock), 0, stream, param, grad, exp_avg, exp_avg_sq, n, c,
               vec);
}

void adamw_step_multi(const AdamWMultiEntry* entries, int count, cudaStream_t stream) {
  AdamWMultiArgs a{};
  a.count = count;
  int64_t blocks = 0;
  for (int i = 0; i < count; ++i) {
    const AdamWMultiEntry& e = entries[i];
    a.e[i] = e;
    a.first_block[i] = static_cast<int>(blocks);
    a.vec[i] = aligned16(e.w) && aligned16(e.g) && aligned16(e.m) && aligned16(e.v);
    blocks += ceil_div<int64_t>(e.n, kAdamWMultiChunk);
  }
  REMAT_LAUNCH(adamw_multi_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kBlock), 0, stream, a);
}

void sgd_step_multi(const SgdMultiEntry* entries, int count, cudaStream_t stream) {
  SgdMultiArgs a{};
  a.count = count;
  int64_t blocks = 0;
  for (int i = 0; i < count; ++i) {
    const SgdMultiEntry& e = entries[i];
    a.e[i] = e;
    a.first_block[i] = static_cast<int>(blocks);
    a.vec[i] = aligned16(e.w) && aligned16(e.g) && aligned16(e.buf);
    blocks += ceil_div<int64_t>(e.n, kSgdMultiChunk);
  }
  REMAT_LAUNCH(sgd_multi_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kBlock), 0, stream, a);
}

void sum_squares(const float* x, int64_t n, double* partials, double* total, bool accumulate, cudaStream_t stream) {
  const int blocks = static_cast<int>(sum_squares_blocks(n));
  if (blocks == 0) {  // no elements: the sum is 0
    REMAT_LAUNCH(sum_partials_kernel, dim3(1), dim3(kBlock), 0, stream, partials, 0, total, accumulate);
    return;
  }
  const bool vec = aligned16(x);
  REMAT_LAUNCH(sum_squares_partial_kernel, dim3(blocks), dim3(kBlock), 0, stream, x, n, vec, partials);
  REMAT_LAUNCH(sum_partials_kernel, dim3(1), dim3(kBlock), 0, stream, partials, blocks, total, accumulate);
}

}  // namespace remat::kernels
