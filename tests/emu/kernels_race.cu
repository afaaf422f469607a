// Reductions with and without the barriers they need, for the race checker. This file is
// compiled with the race instrumentation (remat_emu_add_kernels ... RACECHECK).
#include "kernels/common.cuh"
#include "kernels/launch.cuh"
#include "tests/emu/test_kernels.h"

namespace emu_test {
namespace {

constexpr int kThreads = 128;

// Tree reduction in static shared memory; kFixed adds the barrier after the stores.
template <bool kFixed>
__global__ void static_reduce_kernel(const float* in, float* out) {
  __shared__ float s[kThreads];
  const int t = static_cast<int>(threadIdx.x);
  s[t] = in[blockIdx.x * kThreads + t];
  if (kFixed) __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

template <bool kFixed>
__global__ void dynamic_reduce_kernel(const float* in, float* out) {
  REMAT_DYNAMIC_SHARED(float, s);
  const int t = static_cast<int>(threadIdx.x);
  s[t] = in[blockIdx.x * kThreads + t];
  if (kFixed) __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

// The last warp finishes the reduction in shared memory; without __syncwarp between the
// steps this is the legacy warp-synchronous pattern that is wrong since Volta.
template <bool kSyncwarp>
__global__ void warp_tail_reduce_kernel(const float* in, float* out) {
  __shared__ float s[kThreads];
  const int t = static_cast<int>(threadIdx.x);
  s[t] = in[blockIdx.x * kThreads + t];
  __syncthreads();
  if (t < 64) s[t] += s[t + 64];
  __syncthreads();
  if (t < 32) {
    for (int stride = 32; stride > 0; stride >>= 1) {
      const float other = s[t + stride];
      if (kSyncwarp) __syncwarp();
      s[t] += other;
      if (kSyncwarp) __syncwarp();
    }
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

// Atomics on shared memory do not race with each other.
__global__ void shared_atomics_kernel(const float* in, float* out) {
  __shared__ float total;
  const int t = static_cast<int>(threadIdx.x);
  if (t == 0) total = 0.0f;
  __syncthreads();
  atomicAdd(&total, in[blockIdx.x * kThreads + t]);
  __syncthreads();
  if (t == 0) out[blockIdx.x] = total;
}

// kFloats floats of static shared memory (40 or 50 KiB), for the shared-memory limits.
template <int kFloats>
__global__ void big_static_shared_kernel(float* out) {
  __shared__ float big[kFloats];
  const int t = static_cast<int>(threadIdx.x);
  big[t] = static_cast<float>(t);
  __syncthreads();
  if (t == 0) out[0] = big[kThreads - 1];
}

}  // namespace

void big_static_shared(int static_kib, size_t dynamic_bytes, float* out) {
  if (static_kib == 40)
    REMAT_LAUNCH(big_static_shared_kernel<40 * 256>, dim3(1), dim3(kThreads), dynamic_bytes, nullptr, out);
  else
    REMAT_LAUNCH(big_static_shared_kernel<50 * 256>, dim3(1), dim3(kThreads), dynamic_bytes, nullptr, out);
}

cudaError_t allow_big_static_dynamic(int bytes) {
  return cudaFuncSetAttribute(big_static_shared_kernel<40 * 256>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

void race_reduction(RaceCase which, const float* in, float* out, int blocks) {
  const dim3 grid(static_cast<unsigned>(blocks)), block(kThreads);
  const size_t smem = kThreads * sizeof(float);
  switch (which) {
    case RaceCase::kStaticMissingBarrier:
      REMAT_LAUNCH(static_reduce_kernel<false>, grid, block, 0, nullptr, in, out);
      break;
    case RaceCase::kStaticFixed: REMAT_LAUNCH(static_reduce_kernel<true>, grid, block, 0, nullptr, in, out); break;
    case RaceCase::kDynamicMissingBarrier:
      REMAT_LAUNCH(dynamic_reduce_kernel<false>, grid, block, smem, nullptr, in, out);
      break;
    case RaceCase::kDynamicFixed: REMAT_LAUNCH(dynamic_reduce_kernel<true>, grid, block, smem, nullptr, in, out); break;
    case RaceCase::kWarpWithoutSyncwarp:
      REMAT_LAUNCH(warp_tail_reduce_kernel<false>, grid, block, 0, nullptr, in, out);
      break;
    case RaceCase::kWarpWithSyncwarp:
      REMAT_LAUNCH(warp_tail_reduce_kernel<true>, grid, block, 0, nullptr, in, out);
      break;
    case RaceCase::kSharedAtomics: REMAT_LAUNCH(shared_atomics_kernel, grid, block, 0, nullptr, in, out); break;
  }
}

}  // namespace emu_test
