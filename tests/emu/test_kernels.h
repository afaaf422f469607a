// Host launchers of the kernels the emulator tests run (tests/emu/*.cu). Pointers are
// device pointers; every launch goes through REMAT_LAUNCH.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace emu_test {

// kernels_semantics.cu
enum ShuffleOp : int { kIdx = 0, kUp = 1, kDown = 2, kXor = 3 };
// For each case c = (op, lane or delta or mask, width): out[c * block + t] = shuffle of 100 + t.
void shuffles(const int* cases, int ncases, int block_threads, int* out);
// Doubles through __shfl_xor_sync (64-bit values move whole).
void shuffle_doubles(double* out);
// out[0..31] ballot, [32..63] any, [64..95] all, for masks split in half-warps.
void votes(unsigned* out);
// __reduce_add/min/max_sync over a warp of int values (lane * 3 - 40).
void warp_reductions(int* out);
// Threads t >= active return at once; the rest meet at two barriers.
void early_exit(int block_threads, int active, int* out);
void atomics(int blocks, int threads, int* isum, float* fsum, int* imax, unsigned* inc, unsigned* cas_count,
             int* exch_last, long long* exch_sum);
// Template kernel with a static __shared__ tile of N floats, N = 64 and 128.
void tile_sums(int n, int blocks, const float* in, float* out, unsigned long long* tile_address);
// Reads dynamic and static shared memory before writing it (poison), per block.
void read_uninitialised_shared(int blocks, int threads, unsigned* out);
// Sums of in per block: warp shuffles, then a dynamic shared array of warp sums.
void block_sums(const float* in, int n, int blocks, int threads, float* out);
// Row softmax with one warp per row.
void softmax_rows(const float* x, float* y, int rows, int cols, int threads);
// Elementwise y = a * x + y.
void axpy(float a, const float* x, float* y, int64_t n);
// A kernel launched with an arbitrary configuration.
void configured_launch(dim3 grid, dim3 block, size_t smem, int* out);
// Lets configured_launch use up to `bytes` of dynamic shared memory.
cudaError_t allow_dynamic_shared(int bytes);
// A warp whose lanes meet in different collectives / a mask without the caller's lane.
void mismatched_collectives(int* out);
void mask_without_own_lane(int* out);
// Every thread passes `iterations` barriers (to measure fiber switches).
void barrier_loop(int blocks, int threads, int iterations, int* out);
// out[b * threads + t] = (t + 1) + (t, the lower neighbour in its warp, or 0 at lane 0):
// shared-memory values, read with or without __syncwarp after the write.
void neighbour_sums(bool syncwarp, int blocks, int threads, int* out);
// One thread writes 7 to out[index] (index may lie past the allocation).
void write_one(int* out, long long index);
// Writes one element past the dynamic shared buffer (for AddressSanitizer).
void overflow_dynamic_shared(int* out);

// kernels_deadlock.cu
void divergent_barriers(int* out);
void shuffle_split_by_barrier(int* out);

// kernels_race.cu (compiled with the race instrumentation)
enum class RaceCase : int {
  kStaticMissingBarrier,
  kStaticFixed,
  kDynamicMissingBarrier,
  kDynamicFixed,
  kWarpWithoutSyncwarp,
  kWarpWithSyncwarp,
  kSharedAtomics,
};
void race_reduction(RaceCase which, const float* in, float* out, int blocks);
// A kernel with static_kib (40 or 50) KiB of static __shared__ memory, launched with
// dynamic_bytes of dynamic shared memory; the opt-in of the 40 KiB one.
void big_static_shared(int static_kib, size_t dynamic_bytes, float* out);
cudaError_t allow_big_static_dynamic(int bytes);

// kernels_traffic.cu (compiled with the instrumentation): out[i] for i < n from in[] by a
// pattern of known coalescing, blocks of `threads` threads.
enum class TrafficCase : int {
  kCoalesced,         // out[i] = 2 in[i]
  kStride2,           // out[i] = in[2 i]
  kStride32,          // out[i] = in[32 i]
  kOffsetByOne,       // out[i] = in[i + 1]
  kBroadcast,         // out[i] = in[0]
  kReversedLanes,     // lane l of a warp reads the element of lane 31 - l
  kFloat4,            // n / 4 float4 copied, one per thread
  kLoop,              // one block, each thread every blockDim-th element in a loop
  kLoopSynchronised,  // the same with a warp shuffle and a __syncthreads per iteration
};
void traffic_case(TrafficCase c, const float* in, float* out, int n, int threads);

}  // namespace emu_test
