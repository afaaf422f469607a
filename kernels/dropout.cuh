// Inverted dropout with the Philox stream of include/remat/philox.h: element i of an op whose
// RngState is {seed, offset} is kept when philox::keep(seed, offset, i, 1 - p), the rule
// of the CPU backend, so forward, backward and recompute draw the same mask on any device
// and any grid.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/bf16.cuh"

namespace remat::kernels {

// y[i] = kept(i) ? x[i] / (1 - p) : 0 for p in [0, 1]; p = 0 copies, p = 1 gives zeros.
// y may be x.
void dropout(FloatBuf x, FloatBuf y, int64_t n, float p, uint64_t seed, uint64_t offset, cudaStream_t stream);

}  // namespace remat::kernels
