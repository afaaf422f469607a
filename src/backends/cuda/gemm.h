// cuBLAS GEMMs on row-major matrices, shared by the CUDA backend's op families.
#pragma once

#include <cublas_v2.h>

#include <cstdint>

#include "kernels/bf16.cuh"
#include "kernels/common.cuh"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

// c = alpha * op(a) @ op(b) + beta * c (c is m x n, row-major) for `batch` triples of
// matrices with row strides lda, ldb, ldc and batch strides sa, sb, sc in elements (a
// stride of 0 shares a matrix across the batch). Row-major C is column-major C^T =
// op(B)^T op(A)^T, so cuBLAS gets the operands swapped. Sizes above cuBLAS's 32-bit range
// are an error naming them.
void gemm_strided(cublasHandle_t h, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, int64_t sa, const float* b, int64_t ldb, int64_t sb, float beta, float* c, int64_t ldc,
                  int64_t sc, int64_t batch);

// The same over operands that may be bf16 (training.precision bf16): a and b both f32 (c
// f32: gemm_strided above, the fp32 path as it was) or both bf16 with c bf16 or f32:
// cublasGemmEx / cublasGemmStridedBatchedEx with CUDA_R_16BF inputs and
// CUBLAS_COMPUTE_32F (tensor cores, fp32 accumulation; a bf16 c is rounded once at the
// end). Other combinations are an error naming `op` (cuBLAS multiplies no f32 by bf16).
void gemm_strided_mixed(cublasHandle_t h, const char* op, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                        float alpha, kernels::FloatBuf a, int64_t lda, int64_t sa, kernels::FloatBuf b, int64_t ldb,
                        int64_t sb, float beta, kernels::FloatBuf c, int64_t ldc, int64_t sc, int64_t batch);

REMAT_KERNELS_ABI_END
}  // namespace remat
