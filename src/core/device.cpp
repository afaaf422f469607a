#include "remat/device.h"

#include <omp.h>

#include <cctype>
#include <cstdlib>

#include "remat/error.h"

extern "C" char* openblas_get_config(void);

namespace remat {

Device Device::parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "meta") return meta();
  if (s == "cuda") return cuda(0);
  if (s == "cuda-emu") return cuda_emu();
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5 && s.size() < 10) {
    bool digits = true;
    for (size_t i = 5; i < s.size(); ++i) digits = digits && std::isdigit(static_cast<unsigned char>(s[i]));
    if (digits) return cuda(std::atoi(s.c_str() + 5));
  }
  REMAT_THROW("unknown device \"", s, "\" (expected cpu, meta, cuda, cuda:N or cuda-emu)");
}

std::string Device::str() const {
  switch (type) {
    case DeviceType::cpu: return "cpu";
    case DeviceType::meta: return "meta";
    case DeviceType::cuda: return "cuda:" + std::to_string(index);
    case DeviceType::cuda_emu: return "cuda-emu";
  }
  return "?";
}

void require_available(Device d) {
  if (!d.is_cuda()) return;
  const CudaStatus& st = cuda_status();
  if (!st.built) REMAT_THROW("device ", d.str(), " is not available: remat was built without CUDA (REMAT_CUDA=OFF)");
  if (!st.available) REMAT_THROW("device ", d.str(), " is not available: ", st.error);
  REMAT_CHECK(d.index >= 0 && d.index < st.device_count, "device ", d.str(), " is not available: only ",
              st.device_count, " CUDA device(s) found");
}

#ifndef REMAT_WITH_CUDA
const CudaStatus& cuda_status() {
  static const CudaStatus status = [] {
    CudaStatus s;
    s.error = "remat was built without CUDA";
    return s;
  }();
  return status;
}
#endif

namespace detail {
void fill_cuda_build_info(BuildInfo& info);  // src/backends/cuda/probe.cpp
}

BuildInfo build_info() {
  BuildInfo info;
  info.version = REMAT_VERSION;
#ifdef REMAT_WITH_CUDA
  info.cuda = true;
  detail::fill_cuda_build_info(info);
#endif
  const char* cfg = openblas_get_config();
  info.blas = cfg ? cfg : "unknown";
#if defined(__clang__)
  info.compiler = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  info.compiler = std::string("gcc ") + __VERSION__;
#endif
  info.cpu_threads = omp_get_max_threads();
  return info;
}

}  // namespace remat
