// The device registry: what each kind of device provides (ggml's backend registry is the
// model). The code that implements a device registers its kind once: the kinds built into
// libremat (cpu, meta, cuda) in src/backends/registry.cpp, the emulated GPU (cuda-emu) in
// remat_cuda_emu through register_cuda_emu_backend(). Core and memory ask the registry and
// name no backend: the allocator takes its raw allocator from here, backend_for its backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "remat/device.h"

namespace remat {

class Backend;
class RawAllocator;
struct BuildInfo;

struct DeviceKind {
  DeviceType type = DeviceType::cpu;
  // Throws remat::Error naming the device and the reason when `d` cannot be used here (no
  // driver, index out of range); null: always usable.
  void (*require_available)(Device d) = nullptr;
  // Where tensors of the device live (called once per device).
  std::unique_ptr<RawAllocator> (*make_raw_allocator)(Device d) = nullptr;
  // The backend that runs ops on the device (called once per device).
  std::unique_ptr<Backend> (*make_backend)(Device d) = nullptr;
  // Moving data in and out of memory that host code cannot address (a GPU's, the emulated
  // GPU's): Tensor's copies, fills and zeroing go through these. Null for host memory
  // (cpu), which Tensor reads and writes itself. `copy` moves `bytes` between memory of
  // this kind and host memory or memory of this kind (one side at least of this kind).
  void (*copy)(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) = nullptr;
  void (*fill_f32)(float* dst, Device d, int64_t n, float value) = nullptr;
  void (*zero)(void* dst, Device d, size_t bytes) = nullptr;
  // Adds the library versions this kind was built with to `remat info`'s report; optional.
  void (*describe)(BuildInfo& info) = nullptr;
  // One line for `remat info` when the kind is usable; optional.
  const char* summary = nullptr;
};

// Registers a kind; registering a type twice throws remat::Error.
void register_device_kind(const DeviceKind& kind);
// The registered kind of `type`, or null when this program has none.
const DeviceKind* find_device_kind(DeviceType type);
// The kind of `d`; throws remat::Error naming the device when this program has none (a
// build without CUDA, a program not linked with the emulated backend).
const DeviceKind& device_kind(Device d);
// Every registered kind, in DeviceType order.
std::vector<const DeviceKind*> device_kinds();

}  // namespace remat
