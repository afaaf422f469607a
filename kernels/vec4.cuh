// 128-bit access for memory-bound kernels: when every array a kernel touches is 16-byte
// aligned, it reads and writes four floats per instruction (float4), and the few elements
// past the last whole float4 one at a time; every float4 access of a kernel goes through
// load_unit/store_unit (or load4/store4). Also the grid size of such kernels.
#pragma once

#if !defined(REMAT_EMULATE)
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cstdint>
#if defined(REMAT_EMULATE)
#include <cstring>
#endif

#include "kernels/common.cuh"

namespace remat::kernels {

// Host side: true when p may be accessed as float4 (an absent array does not count).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

#if defined(REMAT_EMULATE)
// GCC vectors of 8 and 16 bytes: a load or store of one is one access for the host
// compiler.
template <size_t kBytes>
struct EmuVecOf;
template <>
struct EmuVecOf<8> {
  typedef unsigned type __attribute__((vector_size(8), may_alias));
};
template <>
struct EmuVecOf<16> {
  typedef unsigned type __attribute__((vector_size(16), may_alias));
};
#endif

// One T (a float, a float4, a uint4 of eight bf16, a uint2) read or written by one
// instruction, as a kernel's every global-memory access of a vector type is written. On a
// GPU a plain dereference (LDG.128 and STG.128 for a float4). On the emulator an 8- or
// 16-byte vector type moves through a GCC vector: the host compiler would otherwise split
// a float4 whose fields are used one by one into four 4-byte accesses, and the emulator's
// traffic counter (docs/kernels.md, "Coalescing") would see four instructions of a quarter
// of the GPU's width.
template <typename T>
__device__ REMAT_INLINE T load_unit(const T* p) {
#if defined(REMAT_EMULATE)
  if constexpr (sizeof(T) == 16 || (sizeof(T) == 8 && alignof(T) == 8)) {
    using V = typename EmuVecOf<sizeof(T)>::type;
    const V bits = *reinterpret_cast<const V*>(p);
    T v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
#endif
  return *p;
}
template <typename T>
__device__ REMAT_INLINE void store_unit(T* p, const T& v) {
#if defined(REMAT_EMULATE)
  if constexpr (sizeof(T) == 16 || (sizeof(T) == 8 && alignof(T) == 8)) {
    using V = typename EmuVecOf<sizeof(T)>::type;
    V bits;
    std::memcpy(&bits, &v, sizeof bits);
    *reinterpret_cast<V*>(p) = bits;
    return;
  }
#endif
  *p = v;
}

// Float4 number q of p, that is elements 4q .. 4q + 3.
__device__ REMAT_INLINE float4 load4(const float* p, int64_t q) {
  return load_unit(reinterpret_cast<const float4*>(p) + q);
}
__device__ REMAT_INLINE void store4(float* p, int64_t q, float4 v) { store_unit(reinterpret_cast<float4*>(p) + q, v); }

// Blocks of `block` threads for a grid-stride loop over `work` items: one item per thread
// up to 4096 blocks (about four waves of resident 256-thread blocks on an H200's 132 SMs,
// enough in flight to saturate HBM); larger work loops.
constexpr int64_t kMaxGridStrideBlocks = 4096;
inline unsigned grid_stride_blocks(int64_t work, int block) {
  return static_cast<unsigned>(std::min<int64_t>(ceil_div<int64_t>(work, block), kMaxGridStrideBlocks));
}

// The first index and the stride of a 1-D grid-stride loop, in 64 bits.
__device__ REMAT_INLINE int64_t grid_start() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ REMAT_INLINE int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace remat::kernels
