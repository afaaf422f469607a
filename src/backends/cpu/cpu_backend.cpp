#include "backends/cpu/cpu_backend.h"

#include <map>
#include <mutex>

#include "remat/error.h"

namespace remat {

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

Backend& backend_for(Device d) {
  static std::mutex mutex;
  static auto* registry = new std::map<std::string, std::unique_ptr<Backend>>();  // never destroyed
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*registry)[d.str()];
  if (!slot) {
    switch (d.type) {
      case DeviceType::cpu: slot = make_cpu_backend(); break;
      case DeviceType::meta: slot = make_meta_backend(); break;
      case DeviceType::cuda:
        require_available(d);
        REMAT_THROW("device ", d.str(), ": the CUDA backend is not built yet");
    }
  }
  return *slot;
}

}  // namespace remat
