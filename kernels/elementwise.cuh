// Elementwise kernels: add, scale, ReLU and GELU forward and backward, copy. Each maps
// n contiguous floats, with the formulas of the CPU backend (src/backends/cpu/elementwise.cpp).
// An output may be one of the inputs (in place): every element is read before it is written.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace remat::kernels {

enum class Gelu { erf, tanh };  // the exact form, or PyTorch's approximate="tanh"

// y = a + b
void add_f32(const float* a, const float* b, float* y, int64_t n, cudaStream_t stream);
// y = alpha * x
void scale_f32(const float* x, float alpha, float* y, int64_t n, cudaStream_t stream);
// y = x
void copy_f32(const float* x, float* y, int64_t n, cudaStream_t stream);
// y = max(x, 0) (NaN gives 0); dx = x > 0 ? dy : 0
void relu_forward(const float* x, float* y, int64_t n, cudaStream_t stream);
void relu_backward(const float* dy, const float* x, float* dx, int64_t n, cudaStream_t stream);
// y = x * Phi(x), Phi the normal CDF (or its tanh approximation); dx = dy * dy/dx
void gelu_forward(const float* x, Gelu form, float* y, int64_t n, cudaStream_t stream);
void gelu_backward(const float* dy, const float* x, Gelu form, float* dx, int64_t n, cudaStream_t stream);

}  // namespace remat::kernels
