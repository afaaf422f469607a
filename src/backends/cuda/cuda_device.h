// What the CUDA backend gives the device registry: for the device kind `cuda` in the build
// against the real toolkit (src/backends/registry.cpp registers it), and for `cuda-emu` in
// the build against the emulator (register_cuda_emu_backend, cuda_backend.cpp), whose
// symbols REMAT_KERNELS_ABI_BEGIN keeps apart.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/common.cuh"
#include "remat/backend.h"
#include "remat/device.h"
#include "remat/memory.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN
namespace cuda_device {

void require_available(Device d);                            // probe.cpp (not emulated)
void describe(BuildInfo& info);                              // probe.cpp (not emulated)
std::unique_ptr<RawAllocator> make_raw_allocator(Device d);  // cuda_memory.cpp
std::unique_ptr<Backend> make_backend(Device d);             // cuda_backend.cpp
// Copies and fills of device memory, on the device's backend stream (cuda_memory.cpp): the
// DeviceKind's copy, fill_f32 and zero.
void copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes);
void fill_f32(float* dst, Device dev, int64_t n, float value);
void zero(void* dst, Device dev, size_t bytes);

}  // namespace cuda_device
REMAT_KERNELS_ABI_END
}  // namespace remat
