#include "remat/device_registry.h"

#include <map>
#include <mutex>

#include "remat/error.h"

namespace remat {

namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
// Never destroyed: devices are looked up until the very end of the program.
std::map<DeviceType, DeviceKind>& kinds() {
  static auto* k = new std::map<DeviceType, DeviceKind>();
  return *k;
}

}  // namespace

void register_device_kind(const DeviceKind& kind) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  REMAT_CHECK(kinds().count(kind.type) == 0, "device kind ", Device{kind.type, 0}.str(), " is registered twice");
  kinds()[kind.type] = kind;
}

const DeviceKind* find_device_kind(DeviceType type) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = kinds().find(type);
  return it == kinds().end() ? nullptr : &it->second;
}

const DeviceKind& device_kind(Device d) {
  if (const DeviceKind* k = find_device_kind(d.type)) return *k;
  switch (d.type) {
    case DeviceType::cuda:
      REMAT_THROW("device ", d.str(), " is not available: remat was built without CUDA (REMAT_CUDA=OFF)");
    case DeviceType::cuda_emu:
      REMAT_THROW(
          "device cuda-emu: this program was not linked with the emulated CUDA backend "
          "(remat_cuda_emu; call register_cuda_emu_backend() at startup)");
    default: REMAT_THROW("device ", d.str(), ": no backend is registered for it in this program");
  }
}

std::vector<const DeviceKind*> device_kinds() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<const DeviceKind*> out;
  for (auto& [type, kind] : kinds()) out.push_back(&kind);
  return out;
}

}  // namespace remat
