// Kernels that can never finish. The emulator must name the lines where their threads
// wait: the test finds them by the DEADLOCK_* markers below.
#include "kernels/launch.cuh"
#include "tests/emu/test_kernels.h"

namespace emu_test {
namespace {

__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < 16) {
    __syncthreads();  // DEADLOCK_A
  } else {
    __syncthreads();  // DEADLOCK_B
  }
  out[threadIdx.x] = 1;
}

__global__ void split_shuffle_kernel(int* out) {
  int v = static_cast<int>(threadIdx.x);
  if (threadIdx.x < 16) {
    v = __shfl_xor_sync(0xffffffffu, v, 1);  // DEADLOCK_C
  } else {
    __syncthreads();  // DEADLOCK_D
  }
  out[threadIdx.x] = v;
}

}  // namespace

void divergent_barriers(int* out) { REMAT_LAUNCH(divergent_barrier_kernel, dim3(2), dim3(32), 0, nullptr, out); }

void shuffle_split_by_barrier(int* out) { REMAT_LAUNCH(split_shuffle_kernel, dim3(1), dim3(32), 0, nullptr, out); }

}  // namespace emu_test
