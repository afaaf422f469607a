// The one launch path of remat: every kernel goes through REMAT_LAUNCH, which launches,
// checks the launch, and with REMAT_SYNC=1 synchronises and checks again so that an
// asynchronous fault is reported at the kernel that caused it.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/common.cuh"

namespace remat::kernels {

// True when REMAT_SYNC=1 (read once).
bool sync_after_launch();

// Checks cudaGetLastError after launching `name` (and synchronises `stream` in sync mode);
// throws remat::Error naming the kernel, the launch shape and the call site.
void check_launch(const char* name, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, const char* file,
                  int line);

template <typename... KernelArgs, typename... Args>
void launch(const char* name, const char* file, int line, void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
            size_t smem, cudaStream_t stream, Args&&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;  // nothing to do: an empty tensor
  kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
  check_launch(name, grid, block, smem, stream, file, line);
}

}  // namespace remat::kernels

#define REMAT_LAUNCH(kernel, grid, block, smem, stream, ...) \
  ::remat::kernels::launch(#kernel, __FILE__, __LINE__, kernel, grid, block, smem, stream, __VA_ARGS__)
