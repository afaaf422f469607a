// Fill a float buffer with a value.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace remat::kernels {
void fill_f32(float* dst, int64_t n, float value, cudaStream_t stream);
}
