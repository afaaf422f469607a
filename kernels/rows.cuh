// Row-wise kernels (softmax, cross-entropy, layer norm): a group of threads per row of a
// row-major matrix. A row of up to kWarpRowMax elements gets one warp (kRowsPerBlock rows
// per block); a longer row, up to GPT-2's 50257 logits and beyond, gets one block of
// kBlockRowThreads threads that loops over it. Rows are visited with a grid-stride loop.
//
// Within a row, thread `lane` handles elements lane * W, (lane + kThreads) * W, ... in
// packs of W = 4 (one float4) when every row is 16-byte aligned, else W = 1; so each
// thread always sees the same elements of a row, and every reduction here combines
// values in an order fixed by the thread indices: results are the same bits every run.
//
// bf16 rows (kernels/bf16.cuh; typed pointers: float*, bf16* or DynPtr) keep packs of four
// elements (8 bytes) when every row is 8-byte aligned and all arrays are bf16, so each
// thread sees the very elements it sees in fp32: a bf16 row op is the fp32 kernel's
// arithmetic, in the same order, on the widened values, its outputs rounded once.
#pragma once

#include <cstdint>

#include "kernels/bf16.cuh"
#include "kernels/common.cuh"
#include "kernels/launch.cuh"
#include "kernels/reduce.cuh"
#include "kernels/vec4.cuh"

namespace remat::kernels::rows {

constexpr int64_t kWarpRowMax = 1024;      // rows up to this length: a warp per row
constexpr int kBlockRowThreads = 512;      // longer rows: a block of this many threads per row
constexpr int kWarpRowsPerBlock = 8;       // warps (rows) per block in warp-per-row kernels
constexpr unsigned kMaxBlocks = 1u << 16;  // grid-stride beyond this

// A pack of W floats: one float4 (kVec) or one float; from bf16, four bf16 (8 bytes) or
// one; from a DynPtr, element by element.
template <bool kVec>
struct Pack {
  static constexpr int kWidth = kVec ? 4 : 1;
  float v[kWidth];

  __device__ REMAT_INLINE static Pack load(const float* p) {
    Pack r;
    if constexpr (kVec) {
      const float4 q = load_unit(reinterpret_cast<const float4*>(p));
      r.v[0] = q.x, r.v[1] = q.y, r.v[2] = q.z, r.v[3] = q.w;
    } else {
      r.v[0] = *p;
    }
    return r;
  }
  __device__ REMAT_INLINE static Pack load(const bf16* p) {
    Pack r;
    if constexpr (kVec) {
      load4(p, 0, r.v);
    } else {
      r.v[0] = __bfloat162float(*p);
    }
    return r;
  }
  __device__ REMAT_INLINE static Pack load(DynPtr p) {
    Pack r;
    for (int k = 0; k < kWidth; ++k) r.v[k] = ld(p, k);
    return r;
  }
  __device__ REMAT_INLINE void store(float* p) const {
    if constexpr (kVec) {
      store_unit(reinterpret_cast<float4*>(p), make_float4(v[0], v[1], v[2], v[3]));
    } else {
      *p = v[0];
    }
  }
  __device__ REMAT_INLINE void store(bf16* p) const {
    if constexpr (kVec) {
      store4(p, 0, v);
    } else {
      *p = __float2bfloat16_rn(v[0]);
    }
  }
  __device__ REMAT_INLINE void store(DynPtr p) const {
    for (int k = 0; k < kWidth; ++k) st(p, k, v[k]);
  }
};

// A warp shuffle of a plain value; the kernels add overloads for their structs.
template <typename T>
__device__ REMAT_INLINE T shfl_xor(T v, int lane_mask) {
  return __shfl_xor_sync(kFullMask, v, lane_mask);
}

// The threads of one row: kThreads = 32 (a warp; the block is 32 x kWarpRowsPerBlock)
// or kBlockRowThreads (the whole block).
template <int kThreads>
struct Group {
  static_assert(kThreads == 32 || (kThreads % 32 == 0 && kThreads <= 1024), "a warp or a whole block per row");
  static constexpr int kRowsPerBlock = kThreads == 32 ? kWarpRowsPerBlock : 1;
  static constexpr int kWarps = kThreads / 32;  // size of the shared buffer a reduction needs

  __device__ REMAT_INLINE static int lane() { return static_cast<int>(threadIdx.x); }
  __device__ REMAT_INLINE static int64_t first_row() {
    return static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  }
  __device__ REMAT_INLINE static int64_t row_stride() { return static_cast<int64_t>(gridDim.x) * kRowsPerBlock; }

  // Sum over the row's threads (reduce.cuh); every thread gets the total.
  template <typename T>
  __device__ REMAT_INLINE static T sum(T v, T* shared) {
    if constexpr (kThreads == 32) {
      return warp_sum(v);
    } else {
      return block_sum<kThreads>(v, shared);
    }
  }

  // Combines v over the row's threads with `op` (commutative and associative up to
  // rounding), in a fixed order: a butterfly within each warp, then the warps in index
  // order. T needs a shfl_xor(T, int) overload (found by argument-dependent lookup).
  // Every thread gets the result; `shared` holds kWarps values.
  template <typename T, typename Op>
  __device__ REMAT_INLINE static T reduce(T v, T* shared, Op op) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, shfl_xor(v, o));
    if constexpr (kThreads > 32) {
      const int lane32 = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
      if (lane32 == 0) shared[warp] = v;
      __syncthreads();
      v = shared[0];
      for (int w = 1; w < kWarps; ++w) v = op(v, shared[w]);
      __syncthreads();
    }
    return v;
  }
};

// Host side: the launch shape of a row-wise kernel with kThreads per row.
template <int kThreads>
dim3 block_shape() {
  return dim3(kThreads, Group<kThreads>::kRowsPerBlock);
}
template <int kThreads>
dim3 grid_shape(int64_t rows) {
  const int64_t blocks = ceil_div<int64_t>(rows, Group<kThreads>::kRowsPerBlock);
  return dim3(static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks));
}

inline bool warp_per_row(int64_t row_length) { return row_length <= kWarpRowMax; }

// The compile-time shape of a row-wise kernel: threads per row and float4 packs or not.
template <int kThreadsPerRow, bool kVector>
struct Layout {
  static constexpr int kThreads = kThreadsPerRow;
  static constexpr bool kVec = kVector;
};

// Calls launch(Layout<kThreads, kVec>{}) with the threads per row that the row length
// calls for, so one generic lambda launches the right instantiation of a kernel (see
// REMAT_LAUNCH_ROWS below).
template <typename F>
void dispatch(int64_t row_length, bool vec, F&& launch) {
  if (warp_per_row(row_length)) {
    if (vec)
      launch(Layout<32, true>{});
    else
      launch(Layout<32, false>{});
  } else {
    if (vec)
      launch(Layout<kBlockRowThreads, true>{});
    else
      launch(Layout<kBlockRowThreads, false>{});
  }
}

// Rows can be read in float4 packs when their length is a multiple of 4 and every
// pointer is 16-byte aligned (then so is every row).
template <typename... Ptrs>
bool can_vectorise(int64_t row_length, const Ptrs*... ptrs) {
  return row_length % 4 == 0 && (aligned16(ptrs) && ...);
}

// The same for FloatBuf arrays (bf16.cuh): packs when every array has one dtype (absent
// ones aside) and is aligned to a pack (16 bytes of f32, 8 bytes of bf16).
template <typename... Bufs>
bool can_vectorise_bufs(int64_t row_length, const Bufs&... bufs) {
  const bool all_f32 = ((!bufs.p || !bufs.bf16) && ...), all_bf16 = ((!bufs.p || bufs.bf16) && ...);
  if (!all_f32 && !all_bf16) return false;
  const uintptr_t align = all_f32 ? 16 : 8;
  return row_length % 4 == 0 && ((reinterpret_cast<uintptr_t>(bufs.p) % align == 0) && ...);
}

}  // namespace remat::kernels::rows

// Launches kernel<kThreads, kVec> (a template of a row-wise kernel) over `rows` rows of
// length n, in the layout rows::dispatch picks; the rest are the kernel's arguments.
#define REMAT_LAUNCH_ROWS(kernel, num_rows, row_length, vec, stream, ...)                                   \
  ::remat::kernels::rows::dispatch(row_length, vec, [&](auto layout) {                                      \
    using L = decltype(layout);                                                                             \
    REMAT_LAUNCH((kernel<L::kThreads, L::kVec>), ::remat::kernels::rows::grid_shape<L::kThreads>(num_rows), \
                 ::remat::kernels::rows::block_shape<L::kThreads>(), 0, stream, __VA_ARGS__);               \
  })

// REMAT_LAUNCH_ROWS for a kernel with further template parameters after <kThreads, kVec>:
// `types` is their parenthesised list, e.g. (decltype(px), decltype(py)).
#define REMAT_ROWS_UNPAREN(...) __VA_ARGS__
#define REMAT_LAUNCH_ROWS_T(kernel, types, num_rows, row_length, vec, stream, ...)            \
  ::remat::kernels::rows::dispatch(row_length, vec, [&](auto layout) {                        \
    using L = decltype(layout);                                                               \
    REMAT_LAUNCH((kernel<L::kThreads, L::kVec, REMAT_ROWS_UNPAREN types>),                    \
                 ::remat::kernels::rows::grid_shape<L::kThreads>(num_rows),                   \
                 ::remat::kernels::rows::block_shape<L::kThreads>(), 0, stream, __VA_ARGS__); \
  })
