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

// The same over operands that may be bf16 (training.precision bf16): all three f32 take
// gemm_strided above (the fp32 path as it was); two bf16 factors into a bf16 or f32 c take
// cublasGemmEx / cublasGemmStridedBatchedEx with CUDA_R_16BF inputs and CUBLAS_COMPUTE_32F
// (tensor cores, fp32 accumulation; a bf16 c is rounded once at the end); what cuBLAS has
// no kernel for (an f32 factor times a bf16 one: a first layer reading the f32 batch with
// bf16 working weights; f32 factors into a bf16 c) takes remat's own kernels::gemm_fma
// (kernels/gemm.cuh: fp32 FMA chains in k order, slow, deterministic) on the handle's
// stream. `op` names the caller (unused: every combination runs).
void gemm_strided_mixed(cublasHandle_t h, const char* op, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                        float alpha, kernels::FloatBuf a, int64_t lda, int64_t sa, kernels::FloatBuf b, int64_t ldb,
                        int64_t sb, float beta, kernels::FloatBuf c, int64_t ldc, int64_t sc, int64_t batch);

// The same over pointer arrays in device memory: c[i] = alpha * op(a[i]) @ op(b[i]) +
// beta * c[i] for i < batch, one cuBLAS call. fp32 throughout (bf16 false) is
// cublasSgemmBatched; bf16 factors into a bf16 (c_bf16) or f32 c is cublasGemmBatchedEx
// with CUBLAS_COMPUTE_32F. The arrays hold the row-major operands' pointers (swapped for
// cuBLAS here, as above). cuBLAS cannot see the matrices' alignment through the arrays:
// the caller checks it (attention.cpp).
void gemm_batched(cublasHandle_t h, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                  const void* const* a, int64_t lda, const void* const* b, int64_t ldb, float beta, void* const* c,
                  int64_t ldc, bool bf16, bool c_bf16, int64_t batch);

REMAT_KERNELS_ABI_END
}  // namespace remat
