// cuBLAS GEMMs on row-major matrices, shared by the CUDA backend's op families.
#pragma once

#include <cublas_v2.h>

#include <cstdint>

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

REMAT_KERNELS_ABI_END
}  // namespace remat
