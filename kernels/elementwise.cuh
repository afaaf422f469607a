// Elementwise kernels: add, scale, ReLU, GELU and SiLU forward and backward, mul, copy. Each maps
// n contiguous elements (f32 or bf16), with the formulas of the CPU backend (src/backends/cpu/elementwise.cpp).
// An output may be one of the inputs (in place): every element is read before it is written.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/bf16.cuh"

namespace remat::kernels {

enum class Gelu { erf, tanh };  // the exact form, or PyTorch's approximate="tanh"

// Every array is a FloatBuf (kernels/bf16.cuh): f32 or bf16 storage, fp32 math, a bf16
// output rounded once (round to nearest even).
// y = a + b
void add(FloatBuf a, FloatBuf b, FloatBuf y, int64_t n, cudaStream_t stream);
// y = alpha * x
void scale(FloatBuf x, float alpha, FloatBuf y, int64_t n, cudaStream_t stream);
// y = x (rounded to bf16 when y is bf16 and x f32)
void copy(FloatBuf x, FloatBuf y, int64_t n, cudaStream_t stream);
// y = 0
void zero(FloatBuf y, int64_t n, cudaStream_t stream);
// y = max(x, 0) (NaN gives 0); dx = x > 0 ? dy : 0
void relu_forward(FloatBuf x, FloatBuf y, int64_t n, cudaStream_t stream);
void relu_backward(FloatBuf dy, FloatBuf x, FloatBuf dx, int64_t n, cudaStream_t stream);
// y = x * Phi(x), Phi the normal CDF (or its tanh approximation); dx = dy * dy/dx
void gelu_forward(FloatBuf x, Gelu form, FloatBuf y, int64_t n, cudaStream_t stream);
void gelu_backward(FloatBuf dy, FloatBuf x, Gelu form, FloatBuf dx, int64_t n, cudaStream_t stream);
// y = x * s, s = 1 / (1 + exp(-x)); dx = dy * s * (1 + x * (1 - s))
void silu_forward(FloatBuf x, FloatBuf y, int64_t n, cudaStream_t stream);
void silu_backward(FloatBuf dy, FloatBuf x, FloatBuf dx, int64_t n, cudaStream_t stream);
// y = a * b (mul's backward is two of them: da = dy * b, db = dy * a)
void mul(FloatBuf a, FloatBuf b, FloatBuf y, int64_t n, cudaStream_t stream);

// Multi-tensor f32 -> bf16 conversion (Backend::cast_multi: the bf16 working copies of the
// fp32 masters, ParamStore::refresh_working): up to kCastMultiMax tensors per launch, their
// pointers and sizes in the kernel's arguments (no table to upload), one chunk of
// kCastMultiChunk elements of one tensor per block; every element rounded by
// __float2bfloat16_rn as by copy/scale (eight per access where both pointers are 16-byte
// aligned). GPT-2 124M's 148 parameter tensors: 2 launches instead of 148 scale launches.
constexpr int kCastMultiMax = 128;
constexpr int64_t kCastMultiChunk = 16384;
struct CastMultiEntry {
  const float* src;
  bf16* dst;
  int64_t n;
};
// Converts entries[0 .. count) (count <= kCastMultiMax) in one launch.
void cast_f32_to_bf16_multi(const CastMultiEntry* entries, int count, cudaStream_t stream);

}  // namespace remat::kernels
