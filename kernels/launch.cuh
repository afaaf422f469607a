// The one launch path of remat: every kernel goes through REMAT_LAUNCH, which launches,
// checks the launch, and with REMAT_SYNC=1 synchronises and checks again so that an
// asynchronous fault is reported at the kernel that caused it.
//
// Under REMAT_EMULATE (a host C++ build on the CUDA emulator) the kernel runs on the
// emulator instead: configuration errors come back through cudaGetLastError as on a GPU,
// faults the emulator finds (deadlock, race, __trap) are thrown as remat::Error.
#pragma once

#if defined(REMAT_EMULATE)
#include "kernels/emu/emu.h"
#else
#include <cuda_runtime.h>
#endif

#include <utility>

#include "kernels/common.cuh"

namespace remat::kernels {
REMAT_KERNELS_ABI_BEGIN

// True when REMAT_SYNC=1 (read once).
bool sync_after_launch();

// Checks cudaGetLastError after launching `name` (and synchronises `stream` in sync mode);
// throws remat::Error naming the kernel, the launch shape and the call site.
void check_launch(const char* name, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, const char* file,
                  int line);

REMAT_KERNELS_ABI_END

template <typename... KernelArgs, typename... Args>
void launch(const char* name, const char* file, int line, void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
            size_t smem, cudaStream_t stream, Args&&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;  // nothing to do: an empty tensor
#if defined(REMAT_EMULATE)
  ::remat::emu::note_stream(stream);
  ::remat::emu::launch(name, file, line, kernel, grid, block, smem, std::forward<Args>(args)...);
#else
  kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
#endif
  check_launch(name, grid, block, smem, stream, file, line);
}

}  // namespace remat::kernels

#define REMAT_LAUNCH(kernel, grid, block, smem, stream, ...) \
  ::remat::kernels::launch(#kernel, __FILE__, __LINE__, kernel, grid, block, smem, stream, __VA_ARGS__)
