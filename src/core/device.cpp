#include "remat/device.h"

#include <omp.h>

#include <cctype>
#include <cstdlib>

#include "remat/device_registry.h"
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
  const DeviceKind& kind = device_kind(d);
  if (kind.require_available) kind.require_available(d);
}

BuildInfo build_info() {
  BuildInfo info;
  info.version = REMAT_VERSION;
  for (const DeviceKind* k : device_kinds())
    if (k->describe) k->describe(info);
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
