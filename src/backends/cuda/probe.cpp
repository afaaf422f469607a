// Probing the CUDA runtime without crashing on machines that have no driver or GPU.
//
// cudaGetDeviceCount returns cudaErrorInsufficientDriver (35) without a driver, or
// cudaErrorStubLibrary (34) with only the stub, and leaves the count untouched: start at
// zero and trust the return code, not the count.
#include <cuda_runtime.h>
#include <curand.h>
#include <library_types.h>

#include <string>

#include "backends/cuda/cuda_device.h"
#include "remat/cuda_check.h"
#include "remat/device.h"
#include "remat/error.h"
#include "remat/log.h"

namespace remat {

const CudaStatus& cuda_status() {
  static const CudaStatus status = [] {
    CudaStatus s;
    s.built = true;
    cudaRuntimeGetVersion(&s.runtime_version);
    if (cudaDriverGetVersion(&s.driver_version) != cudaSuccess) s.driver_version = 0;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    // Clear the thread's last-error slot; a sticky error would still be reported by later
    // calls, which is why nothing else calls into CUDA when this probe says "unavailable".
    (void)cudaGetLastError();
    if (err != cudaSuccess) {
      s.error_code = static_cast<int>(err);
      s.error = std::string(err == cudaErrorInsufficientDriver ? "no CUDA driver found"
                            : err == cudaErrorNoDevice         ? "no CUDA-capable device"
                            : err == cudaErrorStubLibrary      ? "only the CUDA stub driver library was found"
                                                               : "CUDA initialisation failed") +
                " (cudaGetDeviceCount: error " + std::to_string(static_cast<int>(err)) + " " + cudaGetErrorName(err) +
                ")";
      log().debug("CUDA probe: {}", s.error);
      return s;
    }
    if (count <= 0) {
      s.error = "no CUDA-capable device (cudaGetDeviceCount returned 0)";
      return s;
    }
    s.available = true;
    s.device_count = count;
    for (int i = 0; i < count; ++i) {
      cudaDeviceProp p{};
      if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
        (void)cudaGetLastError();
        continue;
      }
      CudaDeviceInfo d;
      d.index = i;
      d.name = p.name;
      d.sm_major = p.major;
      d.sm_minor = p.minor;
      d.multiprocessors = p.multiProcessorCount;
      d.total_memory = p.totalGlobalMem;
      s.devices.push_back(d);
    }
    return s;
  }();
  return status;
}

void cuda_device::require_available(Device d) {
  const CudaStatus& st = cuda_status();
  if (!st.available) REMAT_THROW("device ", d.str(), " is not available: ", st.error);
  REMAT_CHECK(d.index >= 0 && d.index < st.device_count, "device ", d.str(), " is not available: only ",
              st.device_count, " CUDA device(s) found");
}

void cuda_device::describe(BuildInfo& info) {
  info.cuda = true;
  info.cuda_toolkit = std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS) {
    info.cublas = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  }
  int v = 0;
  if (curandGetVersion(&v) == CURAND_STATUS_SUCCESS) {
    info.curand = std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 100) + "." + std::to_string(v % 100);
  }
#ifdef REMAT_WITH_CUDNN
  size_t dnn = cudnnGetVersion();  // e.g. 91900 = 9.19.0
  info.cudnn = std::to_string(dnn / 10000) + "." + std::to_string(dnn % 10000 / 100) + "." + std::to_string(dnn % 100);
#endif
}

namespace detail {

std::string curand_status_name(curandStatus_t s) {
  switch (s) {
    case CURAND_STATUS_SUCCESS: return "CURAND_STATUS_SUCCESS";
    case CURAND_STATUS_VERSION_MISMATCH: return "CURAND_STATUS_VERSION_MISMATCH";
    case CURAND_STATUS_NOT_INITIALIZED: return "CURAND_STATUS_NOT_INITIALIZED";
    case CURAND_STATUS_ALLOCATION_FAILED: return "CURAND_STATUS_ALLOCATION_FAILED";
    case CURAND_STATUS_TYPE_ERROR: return "CURAND_STATUS_TYPE_ERROR";
    case CURAND_STATUS_OUT_OF_RANGE: return "CURAND_STATUS_OUT_OF_RANGE";
    case CURAND_STATUS_LENGTH_NOT_MULTIPLE: return "CURAND_STATUS_LENGTH_NOT_MULTIPLE";
    case CURAND_STATUS_DOUBLE_PRECISION_REQUIRED: return "CURAND_STATUS_DOUBLE_PRECISION_REQUIRED";
    case CURAND_STATUS_LAUNCH_FAILURE: return "CURAND_STATUS_LAUNCH_FAILURE";
    case CURAND_STATUS_PREEXISTING_FAILURE: return "CURAND_STATUS_PREEXISTING_FAILURE";
    case CURAND_STATUS_INITIALIZATION_FAILED: return "CURAND_STATUS_INITIALIZATION_FAILED";
    case CURAND_STATUS_ARCH_MISMATCH: return "CURAND_STATUS_ARCH_MISMATCH";
    case CURAND_STATUS_INTERNAL_ERROR: return "CURAND_STATUS_INTERNAL_ERROR";
    default: return "unknown cuRAND status";
  }
}

}  // namespace detail
}  // namespace remat
