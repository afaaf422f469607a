#include "kernels/elementwise.cuh"

#include "kernels/bf16.cuh"
#include "kernels/launch.cuh"
#include "kernels/vec4.cuh"
#include "remat/gelu.h"

namespace remat::kernels {

namespace {

constexpr int kBlock = 256;

// GELU's constants (remat/gelu.h).
using gelu::kInvSqrt2Pi;
using gelu::kKappa;
using gelu::kSqrt1_2;
using gelu::kSqrt2OverPi;

// ---- The per-element functions --------------------------------------------------------

struct Add {
  __device__ float operator()(float u, float v) const { return u + v; }
};

struct Scale {
  float alpha;
  __device__ float operator()(float v) const { return alpha * v; }
};

struct Identity {
  __device__ float operator()(float v) const { return v; }
};

struct Relu {
  __device__ float operator()(float v) const { return v > 0.0f ? v : 0.0f; }
};

struct ReluBackward {
  __device__ float operator()(float g, float v) const { return v > 0.0f ? g : 0.0f; }
};

struct GeluErf {
  __device__ float operator()(float v) const { return 0.5f * v * (1.0f + erff(v * kSqrt1_2)); }
};

struct GeluTanh {
  __device__ float operator()(float v) const {
    return 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + kKappa * v * v * v)));
  }
};

struct GeluErfBackward {
  __device__ float operator()(float g, float v) const {
    const float cdf = 0.5f * (1.0f + erff(v * kSqrt1_2));
    const float pdf = kInvSqrt2Pi * expf(-0.5f * v * v);
    return g * (cdf + v * pdf);
  }
};

struct GeluTanhBackward {
  __device__ float operator()(float g, float v) const {
    const float t = tanhf(kSqrt2OverPi * (v + kKappa * v * v * v));
    const float dinner = kSqrt2OverPi * (1.0f + 3.0f * kKappa * v * v);
    return g * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dinner);
  }
};

// expf (not __expf): the CPU's exp is within 2 ulp of the exact one, and so is expf; an x
// far below -88 makes expf(-x) inf and s 0.
struct Silu {
  __device__ float operator()(float v) const { return v * (1.0f / (1.0f + expf(-v))); }
};

struct SiluBackward {
  __device__ float operator()(float g, float v) const {
    const float s = 1.0f / (1.0f + expf(-v));
    return g * (s * (1.0f + v * (1.0f - s)));
  }
};

struct Mul {
  __device__ float operator()(float u, float v) const { return u * v; }
};

struct Zero {
  __device__ float operator()(float) const { return 0.0f; }
};

// ---- Kernels: y[i] = op(a[i]) and y[i] = op(a[i], b[i]) ---------------------------------
// Grid-stride loops over typed pointers (bf16.cuh: float*, bf16* or DynPtr), fp32 math.
// With vec (every pointer 16-byte aligned) the first elements go as vectors: float4 (four
// floats) when all are f32, eight bf16 (16 bytes) when all are bf16; the rest (fewer than
// the threads of one block), and every element of a launch mixing dtypes, one by one.
// Every element is its own computation, so the vector width changes no result: a bf16
// output is the fp32 result rounded once.
// No __restrict__: y may be a or b.

template <typename P>
constexpr int kVecWidth = is_f32_ptr<P>    ? 4
                          : is_bf16_ptr<P> ? 8
                                           : 1;

template <typename Op, typename PA, typename PY>
__global__ void map1_kernel(PA a, PY y, int64_t n, bool vec, Op op) {
  const int64_t start = grid_start(), stride = grid_stride();
  int64_t done = 0;
  if constexpr (is_f32_ptr<PA>) {
    if (vec) {
      const int64_t n4 = n / 4;
      for (int64_t q = start; q < n4; q += stride) {
        const float4 u = load4(a, q);
        store4(y, q, make_float4(op(u.x), op(u.y), op(u.z), op(u.w)));
      }
      done = n4 * 4;
    }
  } else if constexpr (is_bf16_ptr<PA>) {
    if (vec) {
      const int64_t n8 = n / 8;
      for (int64_t q = start; q < n8; q += stride) {
        float v[8];
        load8(a, q, v);
        for (int k = 0; k < 8; ++k) v[k] = op(v[k]);
        store8(y, q, v);
      }
      done = n8 * 8;
    }
  }
  for (int64_t i = done + start; i < n; i += stride) st(y, i, op(ld(a, i)));
}

template <typename Op, typename PA, typename PB, typename PY>
__global__ void map2_kernel(PA a, PB b, PY y, int64_t n, bool vec, Op op) {
  const int64_t start = grid_start(), stride = grid_stride();
  int64_t done = 0;
  if constexpr (is_f32_ptr<PA>) {
    if (vec) {
      const int64_t n4 = n / 4;
      for (int64_t q = start; q < n4; q += stride) {
        const float4 u = load4(a, q), v = load4(b, q);
        store4(y, q, make_float4(op(u.x, v.x), op(u.y, v.y), op(u.z, v.z), op(u.w, v.w)));
      }
      done = n4 * 4;
    }
  } else if constexpr (is_bf16_ptr<PA>) {
    if (vec) {
      const int64_t n8 = n / 8;
      for (int64_t q = start; q < n8; q += stride) {
        float u[8], v[8];
        load8(a, q, u);
        load8(b, q, v);
        for (int k = 0; k < 8; ++k) u[k] = op(u[k], v[k]);
        store8(y, q, u);
      }
      done = n8 * 8;
    }
  }
  for (int64_t i = done + start; i < n; i += stride) st(y, i, op(ld(a, i), ld(b, i)));
}

// One thread per vector (per element without vec), at most kMaxGridStrideBlocks blocks.
unsigned blocks_for(int64_t n, bool vec, int width) {
  return grid_stride_blocks(vec ? ceil_div<int64_t>(n, width) : n, kBlock);
}

template <typename Op>
void map1(FloatBuf a, FloatBuf y, int64_t n, Op op, cudaStream_t stream) {
  if (n == 0) return;
  with_types(
      [&](auto pa, auto py) {
        using PA = decltype(pa);
        using PY = decltype(py);
        const bool vec = kVecWidth<PA> > 1 && aligned16(a.p) && aligned16(y.p);
        REMAT_LAUNCH((map1_kernel<Op, PA, PY>), dim3(blocks_for(n, vec, kVecWidth<PA>)), dim3(kBlock), 0, stream, pa,
                     py, n, vec, op);
      },
      a, y);
}

template <typename Op>
void map2(FloatBuf a, FloatBuf b, FloatBuf y, int64_t n, Op op, cudaStream_t stream) {
  if (n == 0) return;
  with_types(
      [&](auto pa, auto pb, auto py) {
        using PA = decltype(pa);
        using PB = decltype(pb);
        using PY = decltype(py);
        const bool vec = kVecWidth<PA> > 1 && aligned16(a.p) && aligned16(b.p) && aligned16(y.p);
        REMAT_LAUNCH((map2_kernel<Op, PA, PB, PY>), dim3(blocks_for(n, vec, kVecWidth<PA>)), dim3(kBlock), 0, stream,
                     pa, pb, py, n, vec, op);
      },
      a, b, y);
}

}  // namespace

void add(FloatBuf a, FloatBuf b, FloatBuf y, int64_t n, cudaStream_t stream) { map2(a, b, y, n, Add{}, stream); }

void scale(FloatBuf x, float alpha, FloatBuf y, int64_t n, cudaStream_t stream) { map1(x, y, n, Scale{alpha}, stream); }

void copy(FloatBuf x, FloatBuf y, int64_t n, cudaStream_t stream) {
  if (x.p != y.p) map1(x, y, n, Identity{}, stream);
}

void zero(FloatBuf y, int64_t n, cudaStream_t stream) { map1(y, y, n, Zero{}, stream); }

void relu_forward(FloatBuf x, FloatBuf y, int64_t n, cudaStream_t stream) { map1(x, y, n, Relu{}, stream); }

void relu_backward(FloatBuf dy, FloatBuf x, FloatBuf dx, int64_t n, cudaStream_t stream) {
  map2(dy, x, dx, n, ReluBackward{}, stream);
}

void gelu_forward(FloatBuf x, Gelu form, FloatBuf y, int64_t n, cudaStream_t stream) {
  if (form == Gelu::erf)
    map1(x, y, n, GeluErf{}, stream);
  else
    map1(x, y, n, GeluTanh{}, stream);
}

void gelu_backward(FloatBuf dy, FloatBuf x, Gelu form, FloatBuf dx, int64_t n, cudaStream_t stream) {
  if (form == Gelu::erf)
    map2(dy, x, dx, n, GeluErfBackward{}, stream);
  else
    map2(dy, x, dx, n, GeluTanhBackward{}, stream);
}

void silu_forward(FloatBuf x, FloatBuf y, int64_t n, cudaStream_t stream) { map1(x, y, n, Silu{}, stream); }

void silu_backward(FloatBuf dy, FloatBuf x, FloatBuf dx, int64_t n, cudaStream_t stream) {
  map2(dy, x, dx, n, SiluBackward{}, stream);
}

void mul(FloatBuf a, FloatBuf b, FloatBuf y, int64_t n, cudaStream_t stream) { map2(a, b, y, n, Mul{}, stream); }

namespace {

struct CastMultiArgs {
  const float* src[kCastMultiMax];
  bf16* dst[kCastMultiMax];
  int64_t n[kCastMultiMax];
  int first_block[kCastMultiMax + 1];  // entry i's chunks: blocks [first_block[i], first_block[i + 1])
  bool vec[kCastMultiMax];             // both pointers 16-byte aligned
  int count;
};
static_assert(sizeof(CastMultiArgs) <= 4000, "CastMultiArgs: over the 4 KiB kernel-argument limit");

__global__ void cast_f32_to_bf16_multi_kernel(CastMultiArgs a) {
  int lo = 0, hi = a.count - 1;  // the entry whose blocks hold this one
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.first_block[mid] <= static_cast<int>(blockIdx.x))
      lo = mid;
    else
      hi = mid - 1;
  }
  const int64_t begin = static_cast<int64_t>(blockIdx.x - a.first_block[lo]) * kCastMultiChunk;
  const int64_t end = begin + kCastMultiChunk < a.n[lo] ? begin + kCastMultiChunk : a.n[lo];
  const float* src = a.src[lo];
  bf16* dst = a.dst[lo];
  int64_t done = begin;
  if (a.vec[lo]) {  // begin is a multiple of 8: whole groups of eight from there
    const int64_t q0 = begin / 8, q1 = end / 8;
    for (int64_t q = q0 + threadIdx.x; q < q1; q += blockDim.x) {
      const float4 u = load4(src, 2 * q), w = load4(src, 2 * q + 1);
      const float v[8] = {u.x, u.y, u.z, u.w, w.x, w.y, w.z, w.w};
      store8(dst, q, v);
    }
    done = q1 * 8;
  }
  for (int64_t i = done + threadIdx.x; i < end; i += blockDim.x) dst[i] = __float2bfloat16_rn(src[i]);
}

}  // namespace

void cast_f32_to_bf16_multi(const CastMultiEntry* entries, int count, cudaStream_t stream) {
  CastMultiArgs a{};
  a.count = count;
  int blocks = 0;
  for (int i = 0; i < count; ++i) {
    a.src[i] = entries[i].src;
    a.dst[i] = entries[i].dst;
    a.n[i] = entries[i].n;
    a.vec[i] = aligned16(entries[i].src) && aligned16(entries[i].dst);
    a.first_block[i] = blocks;
    blocks += static_cast<int>(ceil_div<int64_t>(entries[i].n, kCastMultiChunk));
  }
  a.first_block[count] = blocks;
  if (blocks > 0)
    REMAT_LAUNCH(cast_f32_to_bf16_multi_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kBlock), 0, stream, a);
}

}  // namespace remat::kernels
