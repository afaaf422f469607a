#include "backends/cpu/cpu_backend.h"

#include "remat/error.h"

namespace remat {

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace remat
