// The CUDA execution emulator: lets a kernels/*.cu file compile unchanged with the host
// C++ compiler (-x c++ -DREMAT_EMULATE) and run on the CPU with CUDA's execution semantics.
//
// What this header provides, in CUDA's own names: the function and variable qualifiers,
// the built-in variables (threadIdx, blockIdx, blockDim, gridDim, warpSize), the vector
// types, block barriers, warp collectives (shuffles, votes, __match_any_sync, __syncwarp,
// reductions), atomics, the math and bit intrinsics kernels use, and the host runtime calls
// remat needs (memory, streams, events, errors): device memory in a protected arena of its
// own (device_memory.cpp), streams and events as no-ops.
//
// How it runs (see docs/kernels.md): every CUDA thread of a block is a fiber
// (boost::context); the blocks of a grid run one after another on the launching host
// thread; a fiber switches only at a barrier, a warp collective or its exit, so the
// scheduler sees exactly which threads wait where. A grid that can never finish
// (threads at different barriers, a shuffle whose lanes are split across a barrier)
// is reported as a remat::Error naming the kernel, the block and the source lines.
//
// Static __shared__ variables are block-scope thread_locals; dynamic shared memory comes
// from REMAT_DYNAMIC_SHARED (kernels/common.cuh) and is poisoned (0xFF bytes, NaN as a
// float) before every block. With
// REMAT_EMU_RACECHECK=1, kernels compiled with the race instrumentation (see
// kernels/emu/CMakeLists.txt) report conflicting shared-memory accesses between
// threads of one barrier interval. With REMAT_EMU_SHUFFLE_LANES=<seed>, the threads of a
// block run in a shuffled order between synchronisation points (set_shuffle_lanes).
#pragma once

#if !defined(REMAT_EMULATE)
#error "kernels/emu/emu.h is the host emulator of CUDA: compile with -DREMAT_EMULATE"
#endif

#include <math.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// ---------------------------------------------------------------------------
// Qualifiers
// ---------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __forceinline__ inline
// __noinline__ is not defined: libstdc++ spells __attribute__((__noinline__)) itself, which
// the macro would break in every header included after this one.
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __grid_constant__
// A static __shared__ variable is a block-scope thread_local: blocks run one at a time
// per host thread and every fiber of a block runs on that thread, so each variable has
// one copy per running block (a template instantiation has its own). Unlike dynamic
// shared memory it is not poisoned between blocks (see docs/kernels.md).
#define __shared__ static thread_local __attribute__((aligned(16)))

// ---------------------------------------------------------------------------
// Vector types (sizes and alignments as in CUDA's vector_types.h)
// ---------------------------------------------------------------------------
#define REMAT_EMU_VEC2(T, name, align)          \
  struct __attribute__((aligned(align))) name { \
    T x, y;                                     \
  };                                            \
  inline constexpr name make_##name(T x, T y) { return name{x, y}; }
#define REMAT_EMU_VEC3(T, name) \
  struct name {                 \
    T x, y, z;                  \
  };                            \
  inline constexpr name make_##name(T x, T y, T z) { return name{x, y, z}; }
#define REMAT_EMU_VEC4(T, name, align)          \
  struct __attribute__((aligned(align))) name { \
    T x, y, z, w;                               \
  };                                            \
  inline constexpr name make_##name(T x, T y, T z, T w) { return name{x, y, z, w}; }

REMAT_EMU_VEC2(char, char2, 2)
REMAT_EMU_VEC2(unsigned char, uchar2, 2)
REMAT_EMU_VEC2(short, short2, 4)
REMAT_EMU_VEC2(unsigned short, ushort2, 4)
REMAT_EMU_VEC2(int, int2, 8)
REMAT_EMU_VEC2(unsigned int, uint2, 8)
REMAT_EMU_VEC2(float, float2, 8)
REMAT_EMU_VEC2(long long, longlong2, 16)
REMAT_EMU_VEC2(unsigned long long, ulonglong2, 16)
REMAT_EMU_VEC2(double, double2, 16)
REMAT_EMU_VEC3(int, int3)
REMAT_EMU_VEC3(unsigned int, uint3)
REMAT_EMU_VEC3(float, float3)
REMAT_EMU_VEC4(char, char4, 4)
REMAT_EMU_VEC4(unsigned char, uchar4, 4)
REMAT_EMU_VEC4(short, short4, 8)
REMAT_EMU_VEC4(unsigned short, ushort4, 8)
REMAT_EMU_VEC4(int, int4, 16)
REMAT_EMU_VEC4(unsigned int, uint4, 16)
REMAT_EMU_VEC4(float, float4, 16)
#undef REMAT_EMU_VEC2
#undef REMAT_EMU_VEC3
#undef REMAT_EMU_VEC4

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

static_assert(sizeof(float4) == 16 && alignof(float4) == 16, "float4 as in CUDA");
static_assert(sizeof(uint4) == 16 && alignof(uint4) == 16, "uint4 as in CUDA");
static_assert(sizeof(float2) == 8 && alignof(float2) == 8, "float2 as in CUDA");
static_assert(sizeof(float3) == 12 && alignof(float3) == 4, "float3 as in CUDA");

// ---------------------------------------------------------------------------
// Built-in variables. Blocks run one at a time per process (launches are serialised),
// and the scheduler sets threadIdx before it switches to a thread's fiber.
// ---------------------------------------------------------------------------
inline uint3 threadIdx{0, 0, 0};
inline uint3 blockIdx{0, 0, 0};
inline dim3 blockDim{1, 1, 1};
inline dim3 gridDim{1, 1, 1};
constexpr int warpSize = 32;

// ---------------------------------------------------------------------------
// Emulator entry points (kernels/emu/emu.cpp)
// ---------------------------------------------------------------------------
namespace remat::emu {

enum class WarpOp : int {
  kSyncwarp,
  kShflIdx,
  kShflUp,
  kShflDown,
  kShflXor,
  kBallot,
  kAny,
  kAll,
  kReduceAdd,
  kReduceMinU,
  kReduceMaxU,
  kReduceMinS,
  kReduceMaxS,
};

enum class BarrierOp : int { kSync, kCount, kAnd, kOr };

// A block barrier (__syncthreads and its counting/voting forms); returns the reduction.
int block_barrier(BarrierOp op, int predicate, const char* file, int line);

// A warp collective: waits until every non-exited lane named in `mask` arrives, then
// returns this lane's result (the raw bits of the shuffled value, or the vote).
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const char* file, int line);

// Lanes of the calling thread's warp that have not exited.
unsigned active_mask();

// The calling block's dynamic shared memory (REMAT_DYNAMIC_SHARED).
void* dynamic_shared();

[[noreturn]] void trap(const char* file, int line);

// Race checking of shared memory (also switched on by REMAT_EMU_RACECHECK=1).
void set_racecheck(bool on);
bool racecheck_enabled();

// Lane shuffling (also switched on by REMAT_EMU_SHUFFLE_LANES=<seed>, a non-zero integer;
// 0: off): between synchronisation points the runnable threads of a block run in an order
// drawn from the seed (the same seed, the same order) instead of thread order, so code
// that assumes warp-synchronous execution (a lane reading another lane's shared-memory
// write without __syncwarp) computes a wrong result.
void set_shuffle_lanes(uint64_t seed);
uint64_t shuffle_lanes_seed();

// Number of fiber switches since the process started (for measurements).
uint64_t switch_count();

// Global-memory traffic per kernel (kernels/emu/traffic.cpp; also switched on by
// REMAT_EMU_TRAFFIC=1, which prints a table of every kernel to stderr at exit). Kernels
// compiled with the race instrumentation (remat_emu_add_kernels ... RACECHECK) report their
// loads and stores; those into device memory are grouped into warp accesses (one
// instruction executed by the lanes of a warp between two synchronisation points) and each
// counts the distinct bytes its lanes requested and the distinct 32-byte sectors those
// bytes lie in. Coalescing efficiency = requested bytes / (32 x sectors): 100% when a
// warp's lanes read consecutive words, 50% when they read every other word.
struct KernelTraffic {
  std::string kernel;  // as written at the launch
  uint64_t launches = 0;
  uint64_t warp_accesses = 0;
  uint64_t requested_bytes = 0, sectors = 0;  // loads and stores
  uint64_t load_requested_bytes = 0, load_sectors = 0;
  uint64_t store_requested_bytes = 0, store_sectors = 0;
  // The instruction that wasted the most sector bytes ("<module>+0x<offset>": addr2line -e
  // <module> <offset> names the line), and its own efficiency; empty when none wasted any.
  std::string worst_site;
  double worst_site_efficiency = 1.0;
  double efficiency() const { return sectors ? static_cast<double>(requested_bytes) / (32.0 * sectors) : 0.0; }
};
void set_traffic_count(bool on);
bool traffic_count_enabled();
// Whether any code linked into the program carries the instrumentation (else nothing can be
// counted).
bool traffic_instrumented();
// The kernels counted since the last call, in name order; clears the counts.
std::vector<KernelTraffic> take_traffic();

struct LaunchSpec {
  const char* name;  // the kernel, as written at the launch site
  const char* file;  // the launch site
  int line;
  const void* kernel;  // identity, for cudaFuncSetAttribute
  dim3 grid, block;
  size_t smem;
  void (*thunk)(const void* params);  // calls the kernel with a copy of the arguments
  const void* params;
};

// Validates the configuration (an invalid one sets the error cudaGetLastError returns,
// as CUDA does) and runs every block to completion. Faults are thrown as remat::Error.
void run_kernel(const LaunchSpec& spec);

template <typename T>
T bits_to(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

template <typename T>
uint64_t to_bits(T v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "warp shuffles move values of at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}

// The objects the warp-intrinsic macros expand to: they capture the call site.
template <WarpOp Op>
struct ShflAt {
  const char* file;
  int line;
  template <typename T>
  T operator()(unsigned mask, T var, int lane_or_delta, int width = warpSize) const {
    return bits_to<T>(warp_collective(Op, mask, to_bits(var), lane_or_delta, width, file, line));
  }
};

template <WarpOp Op>
struct VoteAt {
  const char* file;
  int line;
  auto operator()(unsigned mask, int predicate) const {
    const uint64_t r = warp_collective(Op, mask, predicate != 0 ? 1u : 0u, 0, warpSize, file, line);
    if constexpr (Op == WarpOp::kBallot) {
      return static_cast<unsigned>(r);
    } else {
      return static_cast<int>(r);
    }
  }
};

struct SyncwarpAt {
  const char* file;
  int line;
  void operator()(unsigned mask = 0xffffffffu) const {
    warp_collective(WarpOp::kSyncwarp, mask, 0, 0, warpSize, file, line);
  }
};

struct ReduceAt {
  const char* file;
  int line;
  WarpOp unsigned_op, signed_op;
  unsigned operator()(unsigned mask, unsigned value) const {
    return static_cast<unsigned>(warp_collective(unsigned_op, mask, value, 0, warpSize, file, line));
  }
  int operator()(unsigned mask, int value) const {
    return static_cast<int>(
        static_cast<uint32_t>(warp_collective(signed_op, mask, static_cast<uint32_t>(value), 0, warpSize, file, line)));
  }
};

// __match_any_sync: the lanes of `mask` whose value has the same bits as this lane's.
// Built from index shuffles (each lane of `mask` reads every lane of `mask`), so it has
// the collective's convergence rules: every lane named in `mask` must call it.
struct MatchAnyAt {
  const char* file;
  int line;
  template <typename T>
  unsigned operator()(unsigned mask, T value) const {
    static_assert(std::is_integral_v<T> || std::is_floating_point_v<T>, "__match_any_sync takes a scalar");
    const uint64_t mine = to_bits(value);
    unsigned peers = 0;
    for (int lane = 0; lane < warpSize; ++lane) {
      if (!((mask >> lane) & 1u)) continue;
      if (warp_collective(WarpOp::kShflIdx, mask, mine, lane, warpSize, file, line) == mine) peers |= 1u << lane;
    }
    return peers;
  }
};

// Launches `kernel` on the emulator: the arguments are converted to the kernel's
// parameter types once (as CUDA copies them at launch) and every thread gets its own copy.
template <typename... KernelArgs, typename... Args>
void launch(const char* name, const char* file, int line, void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
            size_t smem, Args&&... args) {
  struct Pack {
    void (*kernel)(KernelArgs...);
    std::tuple<std::decay_t<KernelArgs>...> params;
  };
  const Pack pack{kernel, std::tuple<std::decay_t<KernelArgs>...>(std::forward<Args>(args)...)};
  const auto thunk = [](const void* p) {
    const Pack& pk = *static_cast<const Pack*>(p);
    std::apply(pk.kernel, pk.params);
  };
  run_kernel(LaunchSpec{name, file, line, reinterpret_cast<const void*>(kernel), grid, block, smem, +thunk, &pack});
}

}  // namespace remat::emu

// ---------------------------------------------------------------------------
// Barriers and warp collectives (macros so that each call records its source line)
// ---------------------------------------------------------------------------
#define __syncthreads() ::remat::emu::block_barrier(::remat::emu::BarrierOp::kSync, 0, __FILE__, __LINE__)
#define __syncthreads_count(p) \
  ::remat::emu::block_barrier(::remat::emu::BarrierOp::kCount, (p) ? 1 : 0, __FILE__, __LINE__)
#define __syncthreads_and(p) ::remat::emu::block_barrier(::remat::emu::BarrierOp::kAnd, (p) ? 1 : 0, __FILE__, __LINE__)
#define __syncthreads_or(p) ::remat::emu::block_barrier(::remat::emu::BarrierOp::kOr, (p) ? 1 : 0, __FILE__, __LINE__)
#define __syncwarp \
  ::remat::emu::SyncwarpAt { __FILE__, __LINE__ }
#define __shfl_sync \
  ::remat::emu::ShflAt<::remat::emu::WarpOp::kShflIdx> { __FILE__, __LINE__ }
#define __shfl_up_sync \
  ::remat::emu::ShflAt<::remat::emu::WarpOp::kShflUp> { __FILE__, __LINE__ }
#define __shfl_down_sync \
  ::remat::emu::ShflAt<::remat::emu::WarpOp::kShflDown> { __FILE__, __LINE__ }
#define __shfl_xor_sync \
  ::remat::emu::ShflAt<::remat::emu::WarpOp::kShflXor> { __FILE__, __LINE__ }
#define __ballot_sync \
  ::remat::emu::VoteAt<::remat::emu::WarpOp::kBallot> { __FILE__, __LINE__ }
#define __any_sync \
  ::remat::emu::VoteAt<::remat::emu::WarpOp::kAny> { __FILE__, __LINE__ }
#define __all_sync \
  ::remat::emu::VoteAt<::remat::emu::WarpOp::kAll> { __FILE__, __LINE__ }
#define __match_any_sync \
  ::remat::emu::MatchAnyAt { __FILE__, __LINE__ }
#define __reduce_add_sync \
  ::remat::emu::ReduceAt { __FILE__, __LINE__, ::remat::emu::WarpOp::kReduceAdd, ::remat::emu::WarpOp::kReduceAdd }
#define __reduce_min_sync \
  ::remat::emu::ReduceAt { __FILE__, __LINE__, ::remat::emu::WarpOp::kReduceMinU, ::remat::emu::WarpOp::kReduceMinS }
#define __reduce_max_sync \
  ::remat::emu::ReduceAt { __FILE__, __LINE__, ::remat::emu::WarpOp::kReduceMaxU, ::remat::emu::WarpOp::kReduceMaxS }
#define __trap() ::remat::emu::trap(__FILE__, __LINE__)

inline unsigned __activemask() { return ::remat::emu::active_mask(); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __nanosleep(unsigned) {}

// ---------------------------------------------------------------------------
// Atomics. Fibers switch only at barriers and warp collectives, so any read-modify-write
// is already indivisible between CUDA threads; the __atomic builtins also keep it so if
// blocks ever run on several host threads, and mark the accesses as atomic for the race
// checker.
// ---------------------------------------------------------------------------
namespace remat::emu::detail {
template <typename T, typename F>
T atomic_update(T* address, F f) {
  T old;
  __atomic_load(address, &old, __ATOMIC_RELAXED);
  for (;;) {
    T desired = f(old);
    if (__atomic_compare_exchange(address, &old, &desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return old;
  }
}
}  // namespace remat::emu::detail

#define REMAT_EMU_ATOMIC_INT(T)                                                             \
  inline T atomicAdd(T* a, T v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }      \
  inline T atomicExch(T* a, T v) { return __atomic_exchange_n(a, v, __ATOMIC_RELAXED); }    \
  inline T atomicAnd(T* a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_RELAXED); }      \
  inline T atomicOr(T* a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_RELAXED); }        \
  inline T atomicXor(T* a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_RELAXED); }      \
  inline T atomicMax(T* a, T v) {                                                           \
    return ::remat::emu::detail::atomic_update(a, [v](T o) { return o < v ? v : o; });      \
  }                                                                                         \
  inline T atomicMin(T* a, T v) {                                                           \
    return ::remat::emu::detail::atomic_update(a, [v](T o) { return v < o ? v : o; });      \
  }                                                                                         \
  inline T atomicCAS(T* a, T compare, T v) {                                                \
    __atomic_compare_exchange_n(a, &compare, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED); \
    return compare;                                                                         \
  }
REMAT_EMU_ATOMIC_INT(int)
REMAT_EMU_ATOMIC_INT(unsigned int)
REMAT_EMU_ATOMIC_INT(unsigned long long)
#undef REMAT_EMU_ATOMIC_INT
inline long long atomicMax(long long* a, long long v) {
  return ::remat::emu::detail::atomic_update(a, [v](long long o) { return o < v ? v : o; });
}
inline long long atomicMin(long long* a, long long v) {
  return ::remat::emu::detail::atomic_update(a, [v](long long o) { return v < o ? v : o; });
}
inline int atomicSub(int* a, int v) { return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); }
inline unsigned int atomicSub(unsigned int* a, unsigned int v) { return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); }
inline unsigned int atomicInc(unsigned int* a, unsigned int v) {
  return ::remat::emu::detail::atomic_update(a, [v](unsigned int o) { return o >= v ? 0u : o + 1; });
}
inline unsigned int atomicDec(unsigned int* a, unsigned int v) {
  return ::remat::emu::detail::atomic_update(a, [v](unsigned int o) { return (o == 0 || o > v) ? v : o - 1; });
}
// Floating-point adds through a compare-and-swap loop on the bits, as on old GPUs.
inline float atomicAdd(float* a, float v) {
  return ::remat::emu::detail::atomic_update(a, [v](float o) { return o + v; });
}
inline double atomicAdd(double* a, double v) {
  return ::remat::emu::detail::atomic_update(a, [v](double o) { return o + v; });
}
inline float atomicExch(float* a, float v) {
  float old;
  __atomic_exchange(a, &v, &old, __ATOMIC_RELAXED);
  return old;
}

// ---------------------------------------------------------------------------
// Math and bit intrinsics. The fast-math forms (__expf, __logf, ...) are computed with
// the accurate host functions: results can differ from the GPU in the last bits.
// ---------------------------------------------------------------------------
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return powf(10.0f, x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float __tanhf(float x) { return tanhf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }  // NaN -> 0

inline unsigned int __float_as_uint(float x) {
  unsigned int u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float __uint_as_float(unsigned int u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
inline int __float_as_int(float x) { return static_cast<int>(__float_as_uint(x)); }
inline float __int_as_float(int i) { return __uint_as_float(static_cast<unsigned int>(i)); }
inline long long __double_as_longlong(double x) {
  long long v;
  std::memcpy(&v, &x, 8);
  return v;
}
inline double __longlong_as_double(long long v) {
  double x;
  std::memcpy(&x, &v, 8);
  return x;
}
inline int __float2int_rn(float x) { return static_cast<int>(nearbyintf(x)); }
inline int __float2int_rz(float x) { return static_cast<int>(truncf(x)); }
inline int __float2int_rd(float x) { return static_cast<int>(floorf(x)); }
inline int __float2int_ru(float x) { return static_cast<int>(ceilf(x)); }
inline unsigned int __float2uint_rn(float x) { return static_cast<unsigned int>(nearbyintf(x)); }
inline float __int2float_rn(int i) { return static_cast<float>(i); }
inline float __uint2float_rn(unsigned int i) { return static_cast<float>(i); }

inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned int>(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned int __brev(unsigned int x) {
  unsigned int r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline unsigned int __umulhi(unsigned int a, unsigned int b) {
  return static_cast<unsigned int>((static_cast<unsigned long long>(a) * b) >> 32);
}
inline int __mulhi(int a, int b) { return static_cast<int>((static_cast<long long>(a) * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return static_cast<unsigned long long>((static_cast<unsigned __int128>(a) * b) >> 64);
}
inline int __mul24(int a, int b) { return ((a << 8) >> 8) * ((b << 8) >> 8); }
inline unsigned int __umul24(unsigned int a, unsigned int b) { return (a & 0xffffffu) * (b & 0xffffffu); }

// Cache-hinted loads and stores are plain accesses.
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
template <typename T>
inline T __ldcg(const T* p) {
  return *p;
}
template <typename T>
inline T __ldca(const T* p) {
  return *p;
}
template <typename T>
inline T __ldcs(const T* p) {
  return *p;
}
template <typename T>
inline T __ldlu(const T* p) {
  return *p;
}
template <typename T>
inline void __stcg(T* p, T v) {
  *p = v;
}
template <typename T>
inline void __stcs(T* p, T v) {
  *p = v;
}
template <typename T>
inline void __stwt(T* p, T v) {
  *p = v;
}

// CUDA's integer and float min/max overloads.
#define REMAT_EMU_MINMAX(T)                        \
  inline T max(T a, T b) { return a < b ? b : a; } \
  inline T min(T a, T b) { return b < a ? b : a; }
REMAT_EMU_MINMAX(int)
REMAT_EMU_MINMAX(unsigned int)
REMAT_EMU_MINMAX(long)
REMAT_EMU_MINMAX(unsigned long)
REMAT_EMU_MINMAX(long long)
REMAT_EMU_MINMAX(unsigned long long)
#undef REMAT_EMU_MINMAX
inline unsigned int max(int a, unsigned int b) { return max(static_cast<unsigned int>(a), b); }
inline unsigned int max(unsigned int a, int b) { return max(a, static_cast<unsigned int>(b)); }
inline unsigned int min(int a, unsigned int b) { return min(static_cast<unsigned int>(a), b); }
inline unsigned int min(unsigned int a, int b) { return min(a, static_cast<unsigned int>(b)); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline float min(float a, float b) { return fminf(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline long long clock64() { return static_cast<long long>(::remat::emu::switch_count()); }

// ---------------------------------------------------------------------------
// Host runtime: device memory in the emulator's arena (below); streams and events are
// ordered by construction (every launch runs to completion before it returns), except
// the copies on a non-blocking stream, which wait until something waits for them
// (emu.cpp, "PendingCopy"): stricter than a GPU about ordering copies with events.
// ---------------------------------------------------------------------------
enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorAssert = 710,
  cudaErrorLaunchFailure = 719,
  cudaErrorUnknown = 999,
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};

// Distinct handle types: a function taking a stream has a different mangled name in an
// emulated build than in a CUDA build, so both can be linked into one program.
struct remat_emu_stream;
struct remat_emu_event;
typedef remat_emu_stream* cudaStream_t;
typedef remat_emu_event* cudaEvent_t;

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  size_t sharedMemPerBlockOptin;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int multiProcessorCount;
  int maxThreadsPerMultiProcessor;
  int major;
  int minor;
};

cudaError_t cudaMalloc(void** ptr, size_t bytes);
template <typename T>
inline cudaError_t cudaMalloc(T** ptr, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMallocHost(void** ptr, size_t bytes);
template <typename T>
inline cudaError_t cudaMallocHost(T** ptr, size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void**>(ptr), bytes);
}
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);

cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorName(cudaError_t err);
const char* cudaGetErrorString(cudaError_t err);

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaDeviceReset();

cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

namespace remat::emu {
cudaError_t func_set_attribute(const void* kernel, cudaFuncAttribute attr, int value);
// Work enqueued on the legacy default stream: kernel launches (REMAT_LAUNCH) and
// cudaMemcpy*/cudaMemset* with stream nullptr, and cudaMemcpy/cudaMemset themselves.
// Counted process-wide, so that tests can check that the CUDA backend puts all its work on
// its own stream (on a GPU, work on the default stream is ordered with the backend's only
// while that stream is a blocking one).
void note_stream(cudaStream_t stream);
uint64_t default_stream_uses();
// GEMM calls made to the emulated cuBLAS (kernels/emu/cublas.cpp: cublasSgemm, cublasGemmEx
// and their strided and pointer-array batched forms, each call one, whatever its batch),
// counted process-wide, so that tests can count the calls an op makes.
uint64_t cublas_gemm_calls();

// Device memory (kernels/emu/device_memory.cpp): every cudaMalloc takes pages of one
// reserved arena, followed by a guard page, inaccessible to host code except inside a
// DeviceAccess section, which every emulated call that touches device memory opens
// (kernels, copies, memsets, cuBLAS). Sections nest and may be open on several threads;
// while any is open, the allocations that the section's code touches are made accessible
// (on their first access) until the last one closes.
void* device_allocate(size_t bytes);  // null when out of memory
bool device_free(void* ptr);          // false: not an address device_allocate returned
struct DeviceAccess {
  DeviceAccess();
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;
};
// False when REMAT_EMU_PROTECT_DEVICE_MEMORY=0 leaves device memory accessible.
bool device_memory_protected();
// Whether `p` points into memory that cudaMalloc returned (and not yet freed).
bool is_device_pointer(const void* p);
// The device's size (the arena's: REMAT_EMU_DEVICE_MEMORY_MIB, or physical memory) and what
// is not allocated (pages and guard pages count).
void device_memory_info(size_t* free_bytes, size_t* total_bytes);
// The arena's address range: every device pointer lies in it.
bool device_arena(const void** base, size_t* bytes);
}  // namespace remat::emu
template <typename... Args>
inline cudaError_t cudaFuncSetAttribute(void (*kernel)(Args...), cudaFuncAttribute attr, int value) {
  return ::remat::emu::func_set_attribute(reinterpret_cast<const void*>(kernel), attr, value);
}

// __constant__ and __device__ variables are ordinary host variables.
template <typename T>
inline cudaError_t cudaMemcpyToSymbol(T& symbol, const void* src, size_t bytes, size_t offset = 0,
                                      cudaMemcpyKind = cudaMemcpyHostToDevice) {
  if (offset + bytes > sizeof(T)) return cudaErrorInvalidValue;
  std::memcpy(reinterpret_cast<char*>(&symbol) + offset, src, bytes);
  return cudaSuccess;
}
template <typename T>
inline cudaError_t cudaMemcpyFromSymbol(void* dst, const T& symbol, size_t bytes, size_t offset = 0,
                                        cudaMemcpyKind = cudaMemcpyDeviceToHost) {
  if (offset + bytes > sizeof(T)) return cudaErrorInvalidValue;
  std::memcpy(dst, reinterpret_cast<const char*>(&symbol) + offset, bytes);
  return cudaSuccess;
}
