// What the CUDA backend gives the device registry (src/backends/registry.cpp) for the
// device kind `cuda` (the build against the real toolkit only; cuda-emu registers itself).
#pragma once

#include <memory>

#include "remat/backend.h"
#include "remat/device.h"
#include "remat/memory.h"

namespace remat::cuda_device {

void require_available(Device d);                            // probe.cpp
void describe(BuildInfo& info);                              // probe.cpp
std::unique_ptr<RawAllocator> make_raw_allocator(Device d);  // cuda_memory.cpp
std::unique_ptr<Backend> make_backend(Device d);             // cuda_backend.cpp

}  // namespace remat::cuda_device
