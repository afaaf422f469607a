// remat's own GEMM for the factor pairs cuBLAS has no kernel for: an f32 factor times a
// bf16 one (training.precision bf16, where a layer reading the f32 batch, a linear or a
// convolution, multiplies it by bf16 working weights). Every other GEMM goes to cuBLAS
// (src/backends/cuda/gemm.h).
//
// Row-major, as gemm_strided_mixed: c = alpha * op(a) @ op(b) + beta * c for `batch`
// triples of matrices (row strides lda, ldb, ldc; batch strides sa, sb, sc in elements; c
// not read when beta is 0). Each output is one thread's fp32 FMA chain over k in order
// (16 x 16 tiles through shared memory): the same bits every run, on any grid; a bf16 c is
// rounded once. Slow next to cuBLAS's tensor cores, and used only where the data enters
// the network (a first layer's k is its input features or C * R * S).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/bf16.cuh"

namespace remat::kernels {

void gemm_fma(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, FloatBuf a, int64_t lda, int64_t sa,
              FloatBuf b, int64_t ldb, int64_t sb, float beta, FloatBuf c, int64_t ldc, int64_t sc, int64_t batch,
              cudaStream_t stream);

}  // namespace remat::kernels
