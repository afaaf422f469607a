// The emulator's cuBLAS (kernels/emu/include/cublas_v2.h): OpenBLAS's column-major sgemm.
#include <cblas.h>

#include <atomic>
#include <initializer_list>
#include <vector>

#include "kernels/emu/emu.h"
#include "kernels/emu/include/cublas_v2.h"
#include "kernels/emu/include/cuda_bf16.h"

struct remat_emu_cublas_context {
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace {

std::atomic<uint64_t> g_gemm_calls{0};

bool valid_op(cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }
CBLAS_TRANSPOSE to_cblas(cublasOperation_t op) { return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans; }

// cuBLAS's argument checks (its documented CUBLAS_STATUS_INVALID_VALUE cases).
cublasStatus_t check_gemm(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                          int lda, int ldb, int ldc) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!valid_op(ta) || !valid_op(tb) || m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
  const int rows_a = ta == CUBLAS_OP_N ? m : k;
  const int rows_b = tb == CUBLAS_OP_N ? k : n;
  if (lda < (rows_a > 1 ? rows_a : 1) || ldb < (rows_b > 1 ? rows_b : 1) || ldc < (m > 1 ? m : 1))
    return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // C = beta * C (beta == 0 overwrites, NaN included, as cuBLAS)
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i)
        C[static_cast<int64_t>(j) * ldc + i] = beta == 0.0f ? 0.0f : beta * C[static_cast<int64_t>(j) * ldc + i];
    return;
  }
  cblas_sgemm(CblasColMajor, to_cblas(ta), to_cblas(tb), m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

// The columns x rows (column-major, leading dimension ld) of a bf16 matrix as fp32, packed
// (leading dimension rows).
std::vector<float> widen(const void* p, int rows, int cols, int ld) {
  std::vector<float> out(static_cast<size_t>(rows) * static_cast<size_t>(cols));
  const auto* h = static_cast<const __nv_bfloat16*>(p);
  for (int j = 0; j < cols; ++j)
    for (int i = 0; i < rows; ++i)
      out[static_cast<size_t>(j) * rows + i] = __bfloat162float(h[static_cast<int64_t>(j) * ld + i]);
  return out;
}

bool compute_32f(cublasComputeType_t t) {
  return t == CUBLAS_COMPUTE_32F || t == CUBLAS_COMPUTE_32F_PEDANTIC || t == CUBLAS_COMPUTE_32F_FAST_16BF ||
         t == CUBLAS_COMPUTE_32F_FAST_TF32;
}

bool supported_types(cudaDataType a, cudaDataType b, cudaDataType c) {
  if (a != b) return false;
  if (a == CUDA_R_32F) return c == CUDA_R_32F;
  return a == CUDA_R_16BF && (c == CUDA_R_16BF || c == CUDA_R_32F);
}

// One GEMM of cublasGemmEx's types.
void gemm_ex(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const void* A,
             cudaDataType at, int lda, const void* B, int ldb, float beta, void* C, cudaDataType ct, int ldc) {
  if (m == 0 || n == 0) return;
  if (at == CUDA_R_32F) {
    gemm(ta, tb, m, n, k, alpha, static_cast<const float*>(A), lda, static_cast<const float*>(B), ldb, beta,
         static_cast<float*>(C), ldc);
    return;
  }
  const int rows_a = ta == CUBLAS_OP_N ? m : k, cols_a = ta == CUBLAS_OP_N ? k : m;
  const int rows_b = tb == CUBLAS_OP_N ? k : n, cols_b = tb == CUBLAS_OP_N ? n : k;
  const std::vector<float> a = widen(A, rows_a, cols_a, lda), b = widen(B, rows_b, cols_b, ldb);
  const int la = rows_a > 1 ? rows_a : 1, lb = rows_b > 1 ? rows_b : 1;
  if (ct == CUDA_R_32F) {
    gemm(ta, tb, m, n, k, alpha, a.data(), la, b.data(), lb, beta, static_cast<float*>(C), ldc);
    return;
  }
  // A bf16 C: computed in fp32 (its old values widened when beta reads them), rounded once.
  auto* h = static_cast<__nv_bfloat16*>(C);
  std::vector<float> c = beta == 0.0f ? std::vector<float>(static_cast<size_t>(m) * n, 0.0f) : widen(C, m, n, ldc);
  gemm(ta, tb, m, n, k, alpha, a.data(), la, b.data(), lb, beta, c.data(), m);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i)
      h[static_cast<int64_t>(j) * ldc + i] = __float2bfloat16_rn(c[static_cast<size_t>(j) * m + i]);
}

size_t type_size(cudaDataType t) { return t == CUDA_R_16BF ? 2 : 4; }

// The pointer arrays of the batched calls must be device memory (cuBLAS's kernels read
// them; on a GPU a host array is an illegal address when the GEMM runs): the emulator
// refuses a host array up front.
bool device_arrays(int batch, std::initializer_list<const void*> arrays) {
  if (batch == 0) return true;
  for (const void* p : arrays)
    if (!remat::emu::is_device_pointer(p)) return false;
  return true;
}

}  // namespace

uint64_t remat::emu::cublas_gemm_calls() { return g_gemm_calls.load(); }

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new remat_emu_cublas_context();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!stream) return CUBLAS_STATUS_INVALID_VALUE;
  *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!mode) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->math;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t s) { return cublasGetStatusName(s); }

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                           const float* beta, float* C, int ldc) {
  const cublasStatus_t st = check_gemm(handle, transa, transb, m, n, k, lda, ldb, ldc);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  remat::emu::note_stream(handle->stream);
  g_gemm_calls.fetch_add(1);
  remat::emu::DeviceAccess open;  // the GEMM reads and writes device memory
  gemm(transa, transb, m, n, k, *alpha, A, lda, B, ldb, *beta, C, ldc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float* alpha, const float* A, int lda,
                                         long long int strideA, const float* B, int ldb, long long int strideB,
                                         const float* beta, float* C, int ldc, long long int strideC, int batchCount) {
  const cublasStatus_t st = check_gemm(handle, transa, transb, m, n, k, lda, ldb, ldc);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (!alpha || !beta || batchCount < 0) return CUBLAS_STATUS_INVALID_VALUE;
  remat::emu::note_stream(handle->stream);
  g_gemm_calls.fetch_add(1);
  remat::emu::DeviceAccess open;
  for (int b = 0; b < batchCount; ++b)
    gemm(transa, transb, m, n, k, *alpha, A + b * strideA, lda, B + b * strideB, ldb, *beta, C + b * strideC, ldc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  const cublasStatus_t st = check_gemm(handle, transa, transb, m, n, k, lda, ldb, ldc);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  if (!compute_32f(computeType) || !supported_types(Atype, Btype, Ctype)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (algo != CUBLAS_GEMM_DEFAULT && algo != CUBLAS_GEMM_DEFAULT_TENSOR_OP) return CUBLAS_STATUS_INVALID_VALUE;
  remat::emu::note_stream(handle->stream);
  g_gemm_calls.fetch_add(1);
  remat::emu::DeviceAccess open;
  gemm_ex(transa, transb, m, n, k, *static_cast<const float*>(alpha), A, Atype, lda, B, ldb,
          *static_cast<const float*>(beta), C, Ctype, ldc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long int strideA, const void* B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t algo) {
  const cublasStatus_t st = check_gemm(handle, transa, transb, m, n, k, lda, ldb, ldc);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (!alpha || !beta || batchCount < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (!compute_32f(computeType) || !supported_types(Atype, Btype, Ctype)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (algo != CUBLAS_GEMM_DEFAULT && algo != CUBLAS_GEMM_DEFAULT_TENSOR_OP) return CUBLAS_STATUS_INVALID_VALUE;
  remat::emu::note_stream(handle->stream);
  g_gemm_calls.fetch_add(1);
  remat::emu::DeviceAccess open;
  const size_t ea = type_size(Atype), ec = type_size(Ctype);
  for (int b = 0; b < batchCount; ++b)
    gemm_ex(transa, transb, m, n, k, *static_cast<const float*>(alpha),
            static_cast<const char*>(A) + b * strideA * static_cast<long long>(ea), Atype, lda,
            static_cast<const char*>(B) + b * strideB * static_cast<long long>(ea), ldb,
            *static_cast<const float*>(beta), static_cast<char*>(C) + b * strideC * static_cast<long long>(ec), Ctype,
            ldc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemmBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                  int n, int k, const float* alpha, const float* const Aarray[], int lda,
                                  const float* const Barray[], int ldb, const float* beta, float* const Carray[],
                                  int ldc, int batchCount) {
  const cublasStatus_t st = check_gemm(handle, transa, transb, m, n, k, lda, ldb, ldc);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (!alpha || !beta || batchCount < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (!device_arrays(batchCount, {Aarray, Barray, Carray})) return CUBLAS_STATUS_INVALID_VALUE;
  remat::emu::note_stream(handle->stream);
  g_gemm_calls.fetch_add(1);
  remat::emu::DeviceAccess open;  // the arrays and the matrices are device memory
  for (int b = 0; b < batchCount; ++b)
    gemm(transa, transb, m, n, k, *alpha, Aarray[b], lda, Barray[b], ldb, *beta, Carray[b], ldc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                   int n, int k, const void* alpha, const void* const Aarray[], cudaDataType Atype,
                                   int lda, const void* const Barray[], cudaDataType Btype, int ldb, const void* beta,
                                   void* const Carray[], cudaDataType Ctype, int ldc, int batchCount,
                                   cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  const cublasStatus_t st = check_gemm(handle, transa, transb, m, n, k, lda, ldb, ldc);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (!alpha || !beta || batchCount < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (!compute_32f(computeType) || !supported_types(Atype, Btype, Ctype)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (algo != CUBLAS_GEMM_DEFAULT && algo != CUBLAS_GEMM_DEFAULT_TENSOR_OP) return CUBLAS_STATUS_INVALID_VALUE;
  if (!device_arrays(batchCount, {Aarray, Barray, Carray})) return CUBLAS_STATUS_INVALID_VALUE;
  remat::emu::note_stream(handle->stream);
  g_gemm_calls.fetch_add(1);
  remat::emu::DeviceAccess open;
  for (int b = 0; b < batchCount; ++b)
    gemm_ex(transa, transb, m, n, k, *static_cast<const float*>(alpha), Aarray[b], Atype, lda, Barray[b], ldb,
            *static_cast<const float*>(beta), Carray[b], Ctype, ldc);
  return CUBLAS_STATUS_SUCCESS;
}
