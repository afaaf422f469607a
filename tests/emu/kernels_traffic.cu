// Global-memory access patterns with known coalescing, for the emulator's traffic counter.
// This file is compiled with the race instrumentation (remat_emu_add_kernels ... RACECHECK),
// which reports every load and store.
#include "kernels/common.cuh"
#include "kernels/launch.cuh"
#include "tests/emu/test_kernels.h"

namespace emu_test {
namespace {

// One element per thread: out[i] from in[] by the pattern.
__global__ void traffic_kernel(TrafficCase c, const float* in, float* out) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x % 32;
  switch (c) {
    case TrafficCase::kCoalesced: out[i] = in[i] * 2.0f; break;
    case TrafficCase::kStride2: out[i] = in[2 * i]; break;
    case TrafficCase::kStride32: out[i] = in[32 * i]; break;
    case TrafficCase::kOffsetByOne: out[i] = in[i + 1]; break;
    case TrafficCase::kBroadcast: out[i] = in[0]; break;
    case TrafficCase::kReversedLanes: out[i] = in[i - lane + 31 - lane]; break;
    default: break;
  }
}

__global__ void traffic_float4_kernel(const float4* in, float4* out) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i] = in[i];
}

// One block walks the array with a stride of its size: iteration k of a lane and of the
// other lanes of its warp are one warp access. With kSync, a warp shuffle and a block
// barrier in every iteration (the lanes meet at synchronisation points between accesses).
template <bool kSync>
__global__ void traffic_loop_kernel(const float* in, float* out, int n) {
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) {
    float v = in[i];
    if (kSync) {
      v += 0.0f * __shfl_xor_sync(0xffffffffu, v, 1);
      __syncthreads();
    }
    out[i] = v;
  }
}

}  // namespace

void traffic_case(TrafficCase c, const float* in, float* out, int n, int threads) {
  const dim3 block(static_cast<unsigned>(threads));
  switch (c) {
    case TrafficCase::kFloat4:
      REMAT_LAUNCH(traffic_float4_kernel, dim3(static_cast<unsigned>(n / 4 / threads)), block, 0, nullptr,
                   reinterpret_cast<const float4*>(in), reinterpret_cast<float4*>(out));
      break;
    case TrafficCase::kLoop: REMAT_LAUNCH(traffic_loop_kernel<false>, dim3(1), block, 0, nullptr, in, out, n); break;
    case TrafficCase::kLoopSynchronised:
      REMAT_LAUNCH(traffic_loop_kernel<true>, dim3(1), block, 0, nullptr, in, out, n);
      break;
    default: REMAT_LAUNCH(traffic_kernel, dim3(static_cast<unsigned>(n / threads)), block, 0, nullptr, c, in, out);
  }
}

}  // namespace emu_test
