#include <cstdlib>
#include <cstring>

#include "kernels/launch.cuh"
#include "remat/error.h"

namespace remat::kernels {
REMAT_KERNELS_ABI_BEGIN

bool sync_after_launch() {
  static const bool on = [] {
    const char* v = std::getenv("REMAT_SYNC");
    return v && std::strcmp(v, "0") != 0 && std::strcmp(v, "") != 0;
  }();
  return on;
}

void check_launch(const char* name, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, const char* file,
                  int line) {
  auto fail = [&](const char* when, cudaError_t err) {
    (void)cudaGetLastError();
    ::remat::detail::throw_error(
        file, line,
        ::remat::detail::str_cat("kernel ", name, " <<<(", grid.x, ",", grid.y, ",", grid.z, "), (", block.x, ",",
                                 block.y, ",", block.z, "), ", smem, ">>> failed ", when, ": CUDA error ",
                                 static_cast<int>(err), " (", cudaGetErrorName(err), ": ", cudaGetErrorString(err),
                                 ")"));
  };
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) fail("to launch", err);
  if (sync_after_launch()) {
    err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) fail("while running (REMAT_SYNC=1)", err);
  }
}

REMAT_KERNELS_ABI_END
}  // namespace remat::kernels
