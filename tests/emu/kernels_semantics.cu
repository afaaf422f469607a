// Kernels that exercise CUDA's execution semantics on the emulator. They are plain CUDA
// (they compile with nvcc too); the expectations live in test_emu.cpp.
#include <math.h>

#include "kernels/common.cuh"
#include "kernels/launch.cuh"
#include "tests/emu/test_kernels.h"

namespace emu_test {
namespace {

__global__ void shuffle_kernel(const int* cases, int ncases, int* out) {
  const int t = static_cast<int>(threadIdx.x);
  const int v = 100 + t;
  for (int c = 0; c < ncases; ++c) {
    const int op = cases[3 * c], arg = cases[3 * c + 1], width = cases[3 * c + 2];
    int r = 0;
    switch (op) {
      case kIdx: r = __shfl_sync(0xffffffffu, v, arg, width); break;
      case kUp: r = __shfl_up_sync(0xffffffffu, v, static_cast<unsigned>(arg), width); break;
      case kDown: r = __shfl_down_sync(0xffffffffu, v, static_cast<unsigned>(arg), width); break;
      default: r = __shfl_xor_sync(0xffffffffu, v, arg, width); break;
    }
    out[c * static_cast<int>(blockDim.x) + t] = r;
  }
}

__global__ void shuffle_double_kernel(double* out) {
  const double v = 1.0e300 + static_cast<double>(threadIdx.x) * 1.0e290;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 5);
}

__global__ void vote_kernel(unsigned* out) {
  const unsigned lane = threadIdx.x;
  // The half-warps vote separately, each with a mask of its own lanes.
  const unsigned mask = lane < 16 ? 0x0000ffffu : 0xffff0000u;
  out[lane] = __ballot_sync(mask, lane % 3 == 0);
  out[32 + lane] = static_cast<unsigned>(__any_sync(mask, lane == 20));
  out[64 + lane] = static_cast<unsigned>(__all_sync(mask, lane != 3));
}

__global__ void warp_reduce_kernel(int* out) {
  const int v = static_cast<int>(threadIdx.x) * 3 - 40;
  out[threadIdx.x] = __reduce_add_sync(0xffffffffu, v);
  out[32 + threadIdx.x] = __reduce_min_sync(0xffffffffu, v);
  out[64 + threadIdx.x] = __reduce_max_sync(0xffffffffu, v);
}

__global__ void early_exit_kernel(int active, int* out) {
  __shared__ int s[1024];
  const int t = static_cast<int>(threadIdx.x);
  if (t >= active) return;  // these threads never reach the barriers below
  s[t] = 2 * t;
  __syncthreads();
  out[t] = s[(t + 1) % active];
  const int evens = __syncthreads_count(t % 2 == 0);
  if (t == 0) out[active] = evens;
}

__global__ void atomics_kernel(int* isum, float* fsum, int* imax, unsigned* inc, unsigned* cas_count, int* exch_last,
                               long long* exch_sum) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  atomicAdd(isum, i);
  atomicAdd(fsum, static_cast<float>(i % 4) * 0.25f);
  atomicMax(imax, (i * 7919) % 10007);
  atomicInc(inc, 99u);
  unsigned old = *cas_count, seen;
  do {
    seen = old;
    old = atomicCAS(cas_count, seen, seen + 1);
  } while (old != seen);
  const int previous = atomicExch(exch_last, i);
  atomicAdd(reinterpret_cast<unsigned long long*>(exch_sum), static_cast<unsigned long long>(previous));
}

template <int N>
__global__ void tile_sum_kernel(const float* in, float* out, unsigned long long* tile_address) {
  __shared__ float tile[N];
  const int t = static_cast<int>(threadIdx.x);
  tile[t] = in[blockIdx.x * N + t];
  __syncthreads();
  if (t == 0) {
    float s = 0.0f;
    for (int k = 0; k < N; ++k) s += tile[k];
    out[blockIdx.x] = s;
    if (blockIdx.x == 0) *tile_address = reinterpret_cast<unsigned long long>(&tile[0]);
  }
}

__global__ void uninitialised_shared_kernel(unsigned* out) {
  REMAT_DYNAMIC_SHARED(unsigned, dyn);
  __shared__ float stat[64];
  const unsigned t = threadIdx.x, n = blockDim.x;
  unsigned* o = out + blockIdx.x * 3 * n;
  o[t] = dyn[t];  // before any write: what the block starts with
  o[n + t] = __float_as_uint(stat[t]);
  __syncthreads();
  dyn[t] = t + 1000 * blockIdx.x;
  stat[t] = static_cast<float>(t);
  __syncthreads();
  o[2 * n + t] = dyn[n - 1 - t] + static_cast<unsigned>(stat[n - 1 - t]);
}

__global__ void block_sum_kernel(const float* in, int n, float* out) {
  REMAT_DYNAMIC_SHARED(float, warp_sums);
  const int t = static_cast<int>(threadIdx.x);
  float v = 0.0f;
  for (int i = static_cast<int>(blockIdx.x * blockDim.x) + t; i < n; i += static_cast<int>(gridDim.x * blockDim.x)) {
    v += in[i];
  }
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if (t % 32 == 0) warp_sums[t / 32] = v;
  __syncthreads();
  if (t < 32) {
    v = t < static_cast<int>(blockDim.x / 32) ? warp_sums[t] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if (t == 0) out[blockIdx.x] = v;
  }
}

__global__ void softmax_kernel(const float* x, float* y, int rows, int cols) {
  const int row = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (row >= rows) return;  // whole warps only
  const float* xr = x + static_cast<int64_t>(row) * cols;
  float* yr = y + static_cast<int64_t>(row) * cols;
  float m = -INFINITY;
  for (int c = lane; c < cols; c += 32) m = fmaxf(m, xr[c]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float s = 0.0f;
  for (int c = lane; c < cols; c += 32) s += __expf(xr[c] - m);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const float inv = __fdividef(1.0f, s);
  for (int c = lane; c < cols; c += 32) yr[c] = __expf(xr[c] - m) * inv;
}

__global__ void axpy_kernel(float a, const float* x, float* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = fmaf(a, x[i], y[i]);
}

__global__ void configured_kernel(int* out) {
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) atomicAdd(out, 1);
}

__global__ void mismatched_kernel(int* out) {
  const int lane = static_cast<int>(threadIdx.x);
  int r;
  if (lane % 2 == 0) {
    r = __shfl_sync(0xffffffffu, lane, 0);
  } else {
    r = static_cast<int>(__ballot_sync(0xffffffffu, 1));
  }
  out[lane] = r;
}

__global__ void own_lane_kernel(int* out) { out[threadIdx.x] = __shfl_sync(0x1u, static_cast<int>(threadIdx.x), 0); }

__global__ void shared_overflow_kernel(int* out) {
  REMAT_DYNAMIC_SHARED(int, buf);
  buf[threadIdx.x + 1] = 1;  // one past the end for the last thread
  out[threadIdx.x] = buf[0];
}

// Each lane adds its lower neighbour's shared-memory value. Without __syncwarp between the
// write and the read it assumes the lanes run in step (warp-synchronous code): right when
// the lanes run one after another in lane order, wrong in any other order.
template <bool kSyncwarp>
__global__ void neighbour_sum_kernel(int* out) {
  REMAT_DYNAMIC_SHARED(int, buf);
  const int t = static_cast<int>(threadIdx.x), lane = t % 32;
  buf[t] = t + 1;
  if (kSyncwarp) __syncwarp();
  out[blockIdx.x * blockDim.x + t] = buf[t] + (lane > 0 ? buf[t - 1] : 0);
}

__global__ void barrier_loop_kernel(int iterations, int* out) {
  int x = static_cast<int>(threadIdx.x);
  for (int i = 0; i < iterations; ++i) {
    x += i;
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = x;
}

}  // namespace

void barrier_loop(int blocks, int threads, int iterations, int* out) {
  REMAT_LAUNCH(barrier_loop_kernel, dim3(blocks), dim3(threads), 0, nullptr, iterations, out);
}

void neighbour_sums(bool syncwarp, int blocks, int threads, int* out) {
  const size_t smem = static_cast<size_t>(threads) * sizeof(int);
  if (syncwarp) {
    REMAT_LAUNCH(neighbour_sum_kernel<true>, dim3(blocks), dim3(threads), smem, nullptr, out);
  } else {
    REMAT_LAUNCH(neighbour_sum_kernel<false>, dim3(blocks), dim3(threads), smem, nullptr, out);
  }
}

__global__ void write_one_kernel(int* out, long long index) { out[index] = 7; }

void write_one(int* out, long long index) { REMAT_LAUNCH(write_one_kernel, dim3(1), dim3(1), 0, nullptr, out, index); }

void overflow_dynamic_shared(int* out) {
  REMAT_LAUNCH(shared_overflow_kernel, dim3(1), dim3(32), 32 * sizeof(int), nullptr, out);
}

void shuffles(const int* cases, int ncases, int block_threads, int* out) {
  REMAT_LAUNCH(shuffle_kernel, dim3(1), dim3(block_threads), 0, nullptr, cases, ncases, out);
}

void shuffle_doubles(double* out) { REMAT_LAUNCH(shuffle_double_kernel, dim3(1), dim3(32), 0, nullptr, out); }

void votes(unsigned* out) { REMAT_LAUNCH(vote_kernel, dim3(1), dim3(32), 0, nullptr, out); }

void warp_reductions(int* out) { REMAT_LAUNCH(warp_reduce_kernel, dim3(1), dim3(32), 0, nullptr, out); }

void early_exit(int block_threads, int active, int* out) {
  REMAT_LAUNCH(early_exit_kernel, dim3(1), dim3(block_threads), 0, nullptr, active, out);
}

void atomics(int blocks, int threads, int* isum, float* fsum, int* imax, unsigned* inc, unsigned* cas_count,
             int* exch_last, long long* exch_sum) {
  REMAT_LAUNCH(atomics_kernel, dim3(blocks), dim3(threads), 0, nullptr, isum, fsum, imax, inc, cas_count, exch_last,
               exch_sum);
}

void tile_sums(int n, int blocks, const float* in, float* out, unsigned long long* tile_address) {
  if (n == 64) {
    REMAT_LAUNCH(tile_sum_kernel<64>, dim3(blocks), dim3(64), 0, nullptr, in, out, tile_address);
  } else {
    REMAT_LAUNCH(tile_sum_kernel<128>, dim3(blocks), dim3(128), 0, nullptr, in, out, tile_address);
  }
}

void read_uninitialised_shared(int blocks, int threads, unsigned* out) {
  REMAT_LAUNCH(uninitialised_shared_kernel, dim3(blocks), dim3(threads), threads * sizeof(unsigned), nullptr, out);
}

void block_sums(const float* in, int n, int blocks, int threads, float* out) {
  REMAT_LAUNCH(block_sum_kernel, dim3(blocks), dim3(threads), (threads / 32) * sizeof(float), nullptr, in, n, out);
}

void softmax_rows(const float* x, float* y, int rows, int cols, int threads) {
  const int blocks = remat::ceil_div(rows * 32, threads);
  REMAT_LAUNCH(softmax_kernel, dim3(blocks), dim3(threads), 0, nullptr, x, y, rows, cols);
}

void axpy(float a, const float* x, float* y, int64_t n) {
  const int threads = 256;
  REMAT_LAUNCH(axpy_kernel, dim3(static_cast<unsigned>(remat::ceil_div<int64_t>(n, threads))), dim3(threads), 0,
               nullptr, a, x, y, n);
}

void configured_launch(dim3 grid, dim3 block, size_t smem, int* out) {
  REMAT_LAUNCH(configured_kernel, grid, block, smem, nullptr, out);
}

cudaError_t allow_dynamic_shared(int bytes) {
  return cudaFuncSetAttribute(configured_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

void mismatched_collectives(int* out) { REMAT_LAUNCH(mismatched_kernel, dim3(1), dim3(32), 0, nullptr, out); }

void mask_without_own_lane(int* out) { REMAT_LAUNCH(own_lane_kernel, dim3(1), dim3(32), 0, nullptr, out); }

}  // namespace emu_test
