// Check macros for the CUDA runtime, cuBLAS, cuDNN and cuRAND. Each throws remat::Error
// with the library, the numeric code, its name, the expression and the source location.
// Only for translation units that include the CUDA headers. In an emulated build
// (REMAT_EMULATE: the cuda-emu backend) the runtime and cuBLAS are the emulator's
// stand-ins (kernels/emu/include) and cuRAND and cuDNN do not exist.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "remat/error.h"

#if !defined(REMAT_EMULATE)
#include <curand.h>
#ifdef REMAT_WITH_CUDNN
#include <cudnn.h>
#endif
namespace remat::detail {
std::string curand_status_name(curandStatus_t s);
}  // namespace remat::detail
#endif

#define REMAT_CUDA_CHECK(expr)                                                                           \
  do {                                                                                                   \
    cudaError_t remat_err_ = (expr);                                                                     \
    if (remat_err_ != cudaSuccess) {                                                                     \
      (void)cudaGetLastError(); /* clear a non-sticky error so it does not leak */                       \
      REMAT_THROW("CUDA error ", static_cast<int>(remat_err_), " (", cudaGetErrorName(remat_err_), ": ", \
                  cudaGetErrorString(remat_err_), ") in `", #expr, "`");                                 \
    }                                                                                                    \
  } while (0)

#define REMAT_CUBLAS_CHECK(expr)                                                                                       \
  do {                                                                                                                 \
    cublasStatus_t remat_st_ = (expr);                                                                                 \
    if (remat_st_ != CUBLAS_STATUS_SUCCESS) {                                                                          \
      REMAT_THROW("cuBLAS error ", static_cast<int>(remat_st_), " (", cublasGetStatusName(remat_st_), ") in `", #expr, \
                  "`");                                                                                                \
    }                                                                                                                  \
  } while (0)

#if !defined(REMAT_EMULATE)
#define REMAT_CURAND_CHECK(expr)                                                                                      \
  do {                                                                                                                \
    curandStatus_t remat_st_ = (expr);                                                                                \
    if (remat_st_ != CURAND_STATUS_SUCCESS) {                                                                         \
      REMAT_THROW("cuRAND error ", static_cast<int>(remat_st_), " (", ::remat::detail::curand_status_name(remat_st_), \
                  ") in `", #expr, "`");                                                                              \
    }                                                                                                                 \
  } while (0)

#endif

#if defined(REMAT_WITH_CUDNN) && !defined(REMAT_EMULATE)
#define REMAT_CUDNN_CHECK(expr)                                                                                       \
  do {                                                                                                                \
    cudnnStatus_t remat_st_ = (expr);                                                                                 \
    if (remat_st_ != CUDNN_STATUS_SUCCESS) {                                                                          \
      REMAT_THROW("cuDNN error ", static_cast<int>(remat_st_), " (", cudnnGetErrorString(remat_st_), ") in `", #expr, \
                  "`");                                                                                               \
    }                                                                                                                 \
  } while (0)
#endif
