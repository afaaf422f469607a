// backend_for: one backend object per device, created on first use.
#include <map>
#include <mutex>

#include "remat/backend.h"
#include "remat/error.h"

namespace remat {

namespace {
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<DeviceType, BackendFactory>& factories() {
  static auto* f = new std::map<DeviceType, BackendFactory>();  // never destroyed
  return *f;
}
}  // namespace

void register_backend_factory(DeviceType type, BackendFactory factory) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  factories()[type] = factory;
}

bool backend_registered(DeviceType type) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return factories().count(type) != 0;
}

Backend& backend_for(Device d) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  static auto* backends = new std::map<std::string, std::unique_ptr<Backend>>();  // never destroyed
  auto& slot = (*backends)[d.str()];
  if (!slot) {
    switch (d.type) {
      case DeviceType::cpu: slot = make_cpu_backend(); break;
      case DeviceType::meta: slot = make_meta_backend(); break;
      case DeviceType::cuda:
        require_available(d);
#ifdef REMAT_WITH_CUDA
        slot = make_cuda_backend(d.index);
#endif
        break;
      case DeviceType::cuda_emu: {
        auto it = factories().find(d.type);
        if (it == factories().end()) {
          backends->erase(d.str());
          REMAT_THROW("device cuda-emu: this program was not linked with the emulated CUDA backend "
                      "(remat_cuda_emu; call register_cuda_emu_backend() at startup)");
        }
        slot = it->second(d);
        break;
      }
    }
  }
  return *slot;
}

}  // namespace remat
