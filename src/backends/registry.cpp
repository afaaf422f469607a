// The device kinds built into libremat (cpu, meta, and cuda when built with the toolkit),
// registered before main() runs; and backend_for: one backend object per device, created
// on first use from its kind. This file is the one place that names every built-in
// backend (as ggml's ggml-backend-reg.cpp does); the emulated GPU registers itself
// (register_cuda_emu_backend, in remat_cuda_emu).
#include <map>
#include <mutex>

#include "remat/backend.h"
#include "remat/device_registry.h"
#include "remat/error.h"
#include "remat/memory.h"
#if defined(REMAT_WITH_CUDA)
#include "backends/cuda/cuda_device.h"
#endif

namespace remat {

namespace {

bool register_builtin_kinds() {
  DeviceKind cpu;
  cpu.type = DeviceType::cpu;
  cpu.make_raw_allocator = [](Device) { return make_cpu_raw_allocator(); };
  cpu.make_backend = [](Device) { return make_cpu_backend(); };
  register_device_kind(cpu);

  DeviceKind meta;
  meta.type = DeviceType::meta;
  meta.make_raw_allocator = [](Device) { return make_meta_raw_allocator(); };
  meta.make_backend = [](Device) { return make_meta_backend(); };
  meta.summary = "shapes and allocations only, no data";
  register_device_kind(meta);

#if defined(REMAT_WITH_CUDA)
  DeviceKind cuda;
  cuda.type = DeviceType::cuda;
  cuda.require_available = &cuda_device::require_available;
  cuda.make_raw_allocator = &cuda_device::make_raw_allocator;
  cuda.make_backend = &cuda_device::make_backend;
  cuda.copy = &cuda_device::copy;
  cuda.fill_f32 = &cuda_device::fill_f32;
  cuda.zero = &cuda_device::zero;
  cuda.describe = &cuda_device::describe;
  register_device_kind(cuda);
#endif
  return true;
}

// Runs before main(): the library is linked whole (CMakeLists.txt), so this is always part
// of a program that uses remat.
[[maybe_unused]] const bool kBuiltinKinds = register_builtin_kinds();

}  // namespace

#if !defined(REMAT_WITH_CUDA)
const CudaStatus& cuda_status() {
  static const CudaStatus status = [] {
    CudaStatus s;
    s.error = "remat was built without CUDA";
    return s;
  }();
  return status;
}
#endif

bool backend_registered(DeviceType type) { return find_device_kind(type) != nullptr; }

Backend& backend_for(Device d) {
  static std::mutex mutex;
  static auto* backends = new std::map<std::string, std::unique_ptr<Backend>>();  // never destroyed
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*backends)[d.str()];
  if (!slot) {
    try {
      const DeviceKind& kind = device_kind(d);
      if (kind.require_available) kind.require_available(d);
      REMAT_CHECK(kind.make_backend, "device ", d.str(), " has no backend");
      slot = kind.make_backend(d);
    } catch (...) {
      backends->erase(d.str());
      throw;
    }
  }
  return *slot;
}

}  // namespace remat
