// Warp and block reductions for kernels (device code). Every reduction here combines its
// values in an order fixed by the lane and thread indices, so a kernel that uses them
// gives the same bits on every run: remat uses no floating-point atomics where results
// must be reproducible.
#pragma once

#include "kernels/common.cuh"

namespace remat::kernels {

constexpr unsigned kFullMask = 0xffffffffu;

// Butterfly sum over the 32 lanes of a full warp; every lane gets the total.
template <typename T>
__device__ REMAT_INLINE T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

template <typename T>
__device__ REMAT_INLINE T warp_max(T v) {
  for (int o = 16; o > 0; o >>= 1) {
    const T other = __shfl_xor_sync(kFullMask, v, o);
    v = other > v ? other : v;
  }
  return v;
}

// Sum over a block of kThreads threads (a multiple of 32, at most 1024), every thread
// gets the total. `shared` holds kThreads / 32 values; the function synchronises before
// it returns, so it can be called again with the same buffer.
template <int kThreads, typename T>
__device__ REMAT_INLINE T block_sum(T v, T* shared) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "block_sum: kThreads must be a multiple of 32, <= 1024");
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T total = lane < kWarps ? shared[lane] : T(0);
  total = warp_sum(total);
  __syncthreads();
  return total;
}

template <int kThreads, typename T>
__device__ REMAT_INLINE T block_max(T v, T* shared) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "block_max: kThreads must be a multiple of 32, <= 1024");
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_max(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T m = lane < kWarps ? shared[lane] : shared[0];
  m = warp_max(m);
  __syncthreads();
  return m;
}

}  // namespace remat::kernels
