// 128-bit access for memory-bound kernels: when every array a kernel touches is 16-byte
// aligned, it reads and writes four floats per instruction (float4), and the few elements
// past the last whole float4 one at a time. Also the grid size of such kernels.
#pragma once

#if !defined(REMAT_EMULATE)
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cstdint>

#include "kernels/common.cuh"

namespace remat::kernels {

// Host side: true when p may be accessed as float4 (an absent array does not count).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Float4 number q of p, that is elements 4q .. 4q + 3.
__device__ REMAT_INLINE float4 load4(const float* p, int64_t q) { return reinterpret_cast<const float4*>(p)[q]; }
__device__ REMAT_INLINE void store4(float* p, int64_t q, float4 v) { reinterpret_cast<float4*>(p)[q] = v; }

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
