// cuBLAS GEMMs on row-major matrices, shared by the CUDA backend's op families.
#pragma once

#include <cublas_v2.h>

#include <cstdint>

#include "kernels/bf16.cuh"
#include "kernels/common.cuh"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

// C = alpha * op(A) @ op(B) + beta * C over `batch` triples of row-major matrices: C is
// m x n and op(A) m x k, op(B) k x n.
struct GemmSize {
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;
};

// One operand of a strided GEMM: row-major matrices in device memory (f32 or bf16), rows
// `ld` elements apart, the batch's matrices `stride` elements apart (0: one matrix shared
// by the whole batch). `trans`: the product reads the matrix transposed (op(X) = X^T;
// factors only, never C). matrix() and transposed() name the two.
struct GemmOperand {
  kernels::FloatBuf buf;
  int64_t ld = 0;
  int64_t stride = 0;
  bool trans = false;
};
inline GemmOperand matrix(kernels::FloatBuf buf, int64_t ld, int64_t stride = 0) { return {buf, ld, stride, false}; }
inline GemmOperand transposed(kernels::FloatBuf buf, int64_t ld, int64_t stride = 0) { return {buf, ld, stride, true}; }

// The fp32 GEMM: every operand f32 (an error otherwise). Row-major C is column-major C^T =
// op(B)^T op(A)^T, so cuBLAS gets the factors swapped: cublasSgemm for one triple,
// cublasSgemmStridedBatched for more. Sizes above cuBLAS's 32-bit range are an error
// naming them.
void gemm_strided(cublasHandle_t h, const GemmSize& size, float alpha, const GemmOperand& a, const GemmOperand& b,
                  float beta, const GemmOperand& c);

// The same over operands that may be bf16 (training.precision bf16): all three f32 take
// gemm_strided above (the fp32 path as it was); two bf16 factors into a bf16 or f32 c take
// cublasGemmEx / cublasGemmStridedBatchedEx with CUDA_R_16BF inputs and CUBLAS_COMPUTE_32F
// (tensor cores, fp32 accumulation; a bf16 c is rounded once at the end); what cuBLAS has
// no kernel for (an f32 factor times a bf16 one: a first layer reading the f32 batch with
// bf16 working weights; f32 factors into a bf16 c) takes remat's own kernels::gemm_fma
// (kernels/gemm.cuh: fp32 FMA chains in k order, slow, deterministic) on the handle's
// stream. `op` names the caller (unused: every combination runs).
void gemm_strided_mixed(cublasHandle_t h, const char* op, const GemmSize& size, float alpha, const GemmOperand& a,
                        const GemmOperand& b, float beta, const GemmOperand& c);

// One operand of a pointer-array GEMM: an array in device memory of `size.batch` pointers
// to row-major matrices (rows `ld` elements apart), all f32 or all bf16; `trans` as above.
struct GemmPointers {
  void* const* ptrs = nullptr;
  bool bf16 = false;
  int64_t ld = 0;
  bool trans = false;
};

// The same over pointer arrays: C[i] = alpha * op(A[i]) @ op(B[i]) + beta * C[i] for
// i < size.batch, one cuBLAS call. fp32 throughout is cublasSgemmBatched; bf16 factors
// (both) into a bf16 or f32 C is cublasGemmBatchedEx with CUBLAS_COMPUTE_32F; f32 factors
// into a bf16 C, or one bf16 factor, are an error (no cuBLAS kernel). The arrays hold the
// row-major operands' pointers (swapped for cuBLAS here, as above). cuBLAS cannot see the
// matrices' alignment through the arrays: the caller checks it (attention.cpp).
void gemm_batched(cublasHandle_t h, const GemmSize& size, float alpha, const GemmPointers& a, const GemmPointers& b,
                  float beta, const GemmPointers& c);

REMAT_KERNELS_ABI_END
}  // namespace remat
