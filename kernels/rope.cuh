// Rotary position embeddings (src/backends/cpu/rope.cpp is the reference): one thread per
// channel pair of a rotated head, its angle, cosine and sine in double, the products in
// double, each output rounded once (to float, then bf16 where stored so), as the CPU
// backend does; a second loop copies the heads that do not turn. No reductions. x and y
// may be f32 or bf16 (FloatBuf) and may be the same array.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/bf16.cuh"
#include "remat/rope.h"

namespace remat::kernels {

// x, y [rows = B * T, heads * d]: row r is position r % t_len; in each of its first `rotated`
// heads the pair (i, i + d/2) turns by sign * (r % t_len) * rope_inv_freq(theta, i, d, scaling)
// (sign +1 forward, -1 backward); the other channels are copied unless y is x.
void rope(FloatBuf x, int64_t rows, int64_t t_len, int heads, int rotated, int64_t d, double theta, RopeScaling scaling,
          double sign, FloatBuf y, cudaStream_t stream);

}  // namespace remat::kernels
