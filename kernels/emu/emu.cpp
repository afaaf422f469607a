// The CUDA execution emulator: the scheduler of CUDA threads as fibers, block barriers,
// warp collectives, deadlock and race detection, and the host runtime calls.
//
// One launch at a time (a process-wide mutex): the blocks of a grid run one after another
// on the launching host thread. A block's threads are fibers that switch only at block
// barriers, warp collectives and their exit, so the scheduler always knows where each
// waiting thread waits; "no thread can run, some have not exited" is a deadlock.
#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/context/fiber.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/emu/emu.h"
#include "kernels/emu/racecheck.h"
#include "kernels/emu/traffic.h"
#include "remat/error.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define REMAT_EMU_ASAN 1
#endif

namespace remat::emu {
namespace {

namespace bctx = boost::context;

// ---------------------------------------------------------------------------
// Limits of the emulated device (an sm_90-class GPU)
// ---------------------------------------------------------------------------
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlockDimZ = 64;
constexpr unsigned kMaxGridDimX = 0x7fffffffu;
constexpr unsigned kMaxGridDimYZ = 65535;
constexpr size_t kDefaultSharedPerBlock = 48 * 1024;
constexpr size_t kMaxSharedPerBlockOptin = 227 * 1024;

std::mutex g_launch_mutex;              // one launch at a time: the built-in variables are process-wide
thread_local bool t_in_launch = false;  // this host thread is running a launch
thread_local cudaError_t g_last_error = cudaSuccess;
std::atomic<uint64_t> g_switches{0};
std::mutex g_attr_mutex;
std::map<const void*, size_t> g_max_dynamic_smem;  // cudaFuncAttributeMaxDynamicSharedMemorySize

std::string dim_str(dim3 d) { return ::remat::detail::str_cat("(", d.x, ",", d.y, ",", d.z, ")"); }

size_t env_size(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 10);
  return (end && *end == 0 && x > 0) ? static_cast<size_t>(x) : fallback;
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

// ---------------------------------------------------------------------------
// Fiber stacks: one mapping of equal slots, each with a guard page below it, reused by
// every launch (a block never has more than 1024 threads).
// ---------------------------------------------------------------------------
class StackPool {
 public:
  ~StackPool() {
    if (base_) munmap(base_, slot_ * count_);
  }
  // Makes room for n stacks; only called between launches.
  void reserve(unsigned n) {
    if (n <= count_) return;
    if (base_) munmap(base_, slot_ * count_);
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
#if defined(REMAT_EMU_ASAN)
    const size_t fallback_kib = 256;  // ASan's redzones make frames larger
#else
    const size_t fallback_kib = 64;
#endif
    const size_t usable = (env_size("REMAT_EMU_STACK_KIB", fallback_kib) * 1024 + page - 1) / page * page;
    slot_ = usable + page;
    void* p = mmap(nullptr, slot_ * n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) REMAT_THROW("CUDA emulator: cannot map ", n, " fiber stacks of ", slot_, " bytes");
    base_ = static_cast<char*>(p);
    count_ = n;
    for (unsigned i = 0; i < n; ++i) mprotect(base_ + i * slot_, page, PROT_NONE);  // overflow faults
    guard_ = page;
  }
  // Highest address of stack i (stacks grow down) and its usable size.
  char* top(unsigned i) const { return base_ + (i + 1) * slot_; }
  size_t usable() const { return slot_ - guard_; }

 private:
  char* base_ = nullptr;
  size_t slot_ = 0, guard_ = 0;
  unsigned count_ = 0;
};

StackPool g_stacks;

// The fibers never free their stacks: the pool owns them.
struct PoolStack {
  bctx::stack_context allocate() { return {}; }
  void deallocate(bctx::stack_context&) noexcept {}
};

// Thrown inside a fiber to unwind a thread of a block that is being abandoned.
struct AbortBlock {};

enum class State : uint8_t { kReady, kRunning, kAtBarrier, kAtWarp, kExited };

struct Thread {
  bctx::fiber fiber;         // the suspended thread (empty while it runs)
  bctx::fiber to_scheduler;  // the scheduler, while this thread runs
  uint3 idx{0, 0, 0};
  unsigned linear = 0;
  State state = State::kReady;
  // Where it waits.
  const char* file = nullptr;
  int line = 0;
  // Block barrier.
  BarrierOp barrier_op = BarrierOp::kSync;
  int predicate = 0;
  int barrier_result = 0;
  // Warp collective.
  WarpOp op = WarpOp::kSyncwarp;
  unsigned mask = 0;
  uint64_t value = 0;
  int arg = 0;
  int width = 32;
  uint64_t result = 0;
  // The barrier whose release began this thread's current interval (race reports).
  const char* interval_file = nullptr;
  int interval_line = 0;
  // Block barriers and warp collectives this thread has passed in its block (traffic
  // counting: the lanes of a warp agree on it between synchronisation points).
  uint64_t syncs = 0;
#if defined(REMAT_EMU_ASAN)
  void* fake_stack = nullptr;
  const void* stack_bottom = nullptr;
  size_t stack_size = 0;
#endif
};

struct Warp {
  unsigned live = 0;        // lanes that exist and have not exited
  unsigned pending = 0;     // lanes waiting in a warp collective
  uint64_t sync_epoch = 0;  // changes when a __syncwarp completes (race checking)
};

struct Launch {
  const LaunchSpec* spec = nullptr;
  unsigned nthreads = 0;
  std::vector<Thread> threads;
  std::vector<Warp> warps;
  std::vector<unsigned> ready;  // ring buffer of runnable threads
  size_t ready_head = 0, ready_count = 0;
  unsigned live = 0, arrived = 0;
  bool aborting = false, quitting = false;
  std::exception_ptr error;
  unsigned char* dynamic_smem = nullptr;
  uint3 block{0, 0, 0};
  uint64_t shuffle_state = 0;  // lane shuffling (set_shuffle_lanes): this block's generator
#if defined(REMAT_EMU_ASAN)
  const void* scheduler_bottom = nullptr;
  size_t scheduler_size = 0;
#endif
};

// This host thread's thread-local block of the module (executable or shared library)
// that holds `code`: where the static __shared__ variables of its kernels live.
struct TlsBlock {
  const void* base = nullptr;
  size_t bytes = 0;
  const char* module = nullptr;  // its file
};

TlsBlock module_tls(const void* code) {
  Dl_info info{};
  if (!dladdr(code, &info)) return {};
  struct Query {
    const void* module_base;
    TlsBlock found;
  } q{info.dli_fbase, {nullptr, 0, info.dli_fname}};
  dl_iterate_phdr(
      [](dl_phdr_info* m, size_t, void* data) -> int {
        auto& q = *static_cast<Query*>(data);
        for (int i = 0; i < m->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = m->dlpi_phdr[i];
          if (ph.p_type == PT_LOAD && ph.p_offset == 0 &&
              reinterpret_cast<const void*>(m->dlpi_addr + ph.p_vaddr) == q.module_base) {
            for (int k = 0; k < m->dlpi_phnum; ++k) {
              if (m->dlpi_phdr[k].p_type == PT_TLS && m->dlpi_tls_data) {
                q.found.base = m->dlpi_tls_data;
                if (!m->dlpi_name || !*m->dlpi_name) q.found.module = "/proc/self/exe";  // the executable
                q.found.bytes = m->dlpi_phdr[k].p_memsz;
              }
            }
            return 1;
          }
        }
        return 0;
      },
      &q);
  return q.found;
}

Launch* g_launch = nullptr;
Thread* g_current = nullptr;
bool g_racecheck = env_flag("REMAT_EMU_RACECHECK");
bool g_poison = !std::getenv("REMAT_EMU_POISON") || env_flag("REMAT_EMU_POISON");
// REMAT_EMU_SHUFFLE_LANES=<seed> (a non-zero integer): runnable threads run in a random order.
uint64_t shuffle_seed_from_env() {
  const char* v = std::getenv("REMAT_EMU_SHUFFLE_LANES");
  if (!v || !*v) return 0;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 10);
  if (*end != 0 || x == 0) {
    std::fprintf(stderr, "REMAT_EMU_SHUFFLE_LANES=%s: want a non-zero integer seed; lane shuffling stays off\n", v);
    return 0;
  }
  return x;
}
uint64_t g_shuffle_seed = shuffle_seed_from_env();
uint64_t g_interval = 1;     // barrier intervals, numbered across all blocks and launches
uint64_t g_warp_epochs = 0;  // completed __syncwarp groups, numbered likewise

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void push_ready(Launch& L, unsigned t) {
  L.ready[(L.ready_head + L.ready_count) % L.nthreads] = t;
  ++L.ready_count;
}

std::string thread_str(const Launch& L, unsigned linear) {
  const Thread& t = L.threads[linear];
  return ::remat::detail::str_cat("(", t.idx.x, ",", t.idx.y, ",", t.idx.z, ")");
}

std::string where(const Launch& L) {
  return ::remat::detail::str_cat("kernel ", L.spec->name, " block ", dim_str(L.block), " of grid ",
                                  dim_str(L.spec->grid), " x block ", dim_str(L.spec->block));
}

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::kSyncwarp: return "__syncwarp";
    case WarpOp::kShflIdx: return "__shfl_sync";
    case WarpOp::kShflUp: return "__shfl_up_sync";
    case WarpOp::kShflDown: return "__shfl_down_sync";
    case WarpOp::kShflXor: return "__shfl_xor_sync";
    case WarpOp::kBallot: return "__ballot_sync";
    case WarpOp::kAny: return "__any_sync";
    case WarpOp::kAll: return "__all_sync";
    case WarpOp::kReduceAdd: return "__reduce_add_sync";
    case WarpOp::kReduceMinU:
    case WarpOp::kReduceMinS: return "__reduce_min_sync";
    case WarpOp::kReduceMaxU:
    case WarpOp::kReduceMaxS: return "__reduce_max_sync";
  }
  return "?";
}

const char* barrier_name(BarrierOp op) {
  switch (op) {
    case BarrierOp::kSync: return "__syncthreads";
    case BarrierOp::kCount: return "__syncthreads_count";
    case BarrierOp::kAnd: return "__syncthreads_and";
    case BarrierOp::kOr: return "__syncthreads_or";
  }
  return "?";
}

bool same_site(const char* f1, int l1, const char* f2, int l2) {
  return l1 == l2 && (f1 == f2 || std::strcmp(f1, f2) == 0);
}

// "16 threads (0,0,0) (1,0,0) ... at __syncthreads (file:line)" for every distinct wait site.
std::string describe_waiters(const Launch& L) {
  struct Site {
    std::string what;
    std::vector<unsigned> threads;
    unsigned missing = 0;  // warp collectives: lanes the group still waits for
  };
  std::vector<Site> sites;
  for (unsigned i = 0; i < L.nthreads; ++i) {
    const Thread& t = L.threads[i];
    if (t.state != State::kAtBarrier && t.state != State::kAtWarp) continue;
    const std::string what = t.state == State::kAtBarrier
                                 ? ::remat::detail::str_cat(barrier_name(t.barrier_op), " (", t.file, ":", t.line, ")")
                                 : ::remat::detail::str_cat(op_name(t.op), " (", t.file, ":", t.line, ") with mask 0x",
                                                            std::hex, t.mask, std::dec, " in warp ", i / 32);
    auto it = std::find_if(sites.begin(), sites.end(), [&](const Site& s) { return s.what == what; });
    if (it == sites.end()) it = sites.insert(sites.end(), Site{what, {}, 0});
    it->threads.push_back(i);
    if (t.state == State::kAtWarp) {
      const Warp& w = L.warps[i / 32];
      it->missing |= t.mask & w.live & ~w.pending;
    }
  }
  std::string out;
  for (const Site& s : sites) {
    out += ::remat::detail::str_cat("\n  ", s.threads.size(), s.threads.size() == 1 ? " thread" : " threads", " at ",
                                    s.what, ":");
    for (size_t k = 0; k < s.threads.size() && k < 4; ++k) out += " " + thread_str(L, s.threads[k]);
    if (s.threads.size() > 4) out += " ...";
    if (s.missing) out += ::remat::detail::str_cat(" (waiting for lanes 0x", std::hex, s.missing, std::dec, ")");
  }
  return out;
}

[[noreturn]] void fail(const Launch& L, const std::string& what) {
  ::remat::detail::throw_error(L.spec->file, L.spec->line, ::remat::detail::str_cat(where(L), ": ", what));
}

// ---------------------------------------------------------------------------
// Switching
// ---------------------------------------------------------------------------
#if defined(REMAT_EMU_ASAN)
void asan_leave(void** fake_stack, const void* bottom, size_t size) {
  __sanitizer_start_switch_fiber(fake_stack, bottom, size);
}
void asan_enter(void* fake_stack, const void** old_bottom, size_t* old_size) {
  __sanitizer_finish_switch_fiber(fake_stack, old_bottom, old_size);
}
#endif

// Scheduler -> thread t; returns when t waits, exits or finishes the block.
void resume(Launch& L, Thread& t) {
  g_current = &t;
  threadIdx = t.idx;
  t.state = State::kRunning;
  g_switches.fetch_add(2, std::memory_order_relaxed);
#if defined(REMAT_EMU_ASAN)
  void* fake = nullptr;
  asan_leave(&fake, t.stack_bottom, t.stack_size);
  t.fiber = std::move(t.fiber).resume();
  asan_enter(fake, nullptr, nullptr);
#else
  t.fiber = std::move(t.fiber).resume();
#endif
  g_current = nullptr;
  (void)L;
}

// Thread -> scheduler; returns when the scheduler resumes this thread.
void yield_to_scheduler(Launch& L, Thread& t) {
#if defined(REMAT_EMU_ASAN)
  asan_leave(&t.fake_stack, L.scheduler_bottom, L.scheduler_size);
  t.to_scheduler = std::move(t.to_scheduler).resume();
  asan_enter(t.fake_stack, nullptr, nullptr);
#else
  (void)L;
  t.to_scheduler = std::move(t.to_scheduler).resume();
#endif
}

// Waits until the scheduler resumes this thread after it was released.
void wait(Launch& L, Thread& t) {
  yield_to_scheduler(L, t);
  if (L.aborting) throw AbortBlock{};
}

// ---------------------------------------------------------------------------
// Block barriers
// ---------------------------------------------------------------------------
void release_barrier(Launch& L) {
  // Every non-exited thread waits at a barrier: they must all wait at the same one.
  const Thread* first = nullptr;
  int count = 0, all = 1, any = 0;
  for (Thread& t : L.threads) {
    if (t.state != State::kAtBarrier) continue;
    if (!first) first = &t;
    if (!same_site(t.file, t.line, first->file, first->line) || t.barrier_op != first->barrier_op) {
      fail(L, ::remat::detail::str_cat("threads wait at different barriers, which never release each other (deadlock):",
                                       describe_waiters(L)));
    }
    count += t.predicate;
    all &= t.predicate;
    any |= t.predicate;
  }
  const int result = first->barrier_op == BarrierOp::kCount ? count
                     : first->barrier_op == BarrierOp::kAnd ? all
                     : first->barrier_op == BarrierOp::kOr  ? any
                                                            : 0;
  ++g_interval;
  for (unsigned i = 0; i < L.nthreads; ++i) {
    Thread& t = L.threads[i];
    if (t.state != State::kAtBarrier) continue;
    t.barrier_result = result;
    t.interval_file = t.file;
    t.interval_line = t.line;
    ++t.syncs;
    if (&t == g_current) {
      t.state = State::kRunning;
    } else {
      t.state = State::kReady;
      push_ready(L, i);
    }
  }
  L.arrived = 0;
  traffic_flush();  // every thread is here: the warp accesses before the barrier are complete
}

// ---------------------------------------------------------------------------
// Warp collectives
// ---------------------------------------------------------------------------

// PTX shfl.sync: c = ((32 - width) << 8) | clamp, clamp = 0x1f except for up (0).
// An out-of-range source keeps the caller's own value.
unsigned shuffle_source(WarpOp op, unsigned lane, int b, int width) {
  const unsigned segmask = static_cast<unsigned>(32 - width) & 0x1fu;
  const unsigned clamp = op == WarpOp::kShflUp ? 0u : 0x1fu;
  const unsigned bval = static_cast<unsigned>(b) & 0x1fu;
  const unsigned max_lane = (lane & segmask) | (clamp & ~segmask);
  const unsigned min_lane = lane & segmask;
  int j = 0;
  bool in_range = false;
  switch (op) {
    case WarpOp::kShflUp:
      j = static_cast<int>(lane) - static_cast<int>(bval);
      in_range = j >= static_cast<int>(max_lane);
      break;
    case WarpOp::kShflDown:
      j = static_cast<int>(lane + bval);
      in_range = j <= static_cast<int>(max_lane);
      break;
    case WarpOp::kShflXor:
      j = static_cast<int>(lane ^ bval);
      in_range = j <= static_cast<int>(max_lane);
      break;
    default:  // idx
      j = static_cast<int>(min_lane | (bval & ~segmask));
      in_range = j <= static_cast<int>(max_lane);
      break;
  }
  return in_range ? static_cast<unsigned>(j) : lane;
}

bool is_shuffle(WarpOp op) {
  return op == WarpOp::kShflIdx || op == WarpOp::kShflUp || op == WarpOp::kShflDown || op == WarpOp::kShflXor;
}

// Every lane of `group` has arrived: check they agree, compute their results, release them.
void complete_group(Launch& L, unsigned w, unsigned group) {
  Warp& W = L.warps[w];
  const unsigned base = w * 32;
  const unsigned leader = static_cast<unsigned>(__builtin_ctz(group));
  const Thread& lead = L.threads[base + leader];
  for (unsigned l = 0; l < 32; ++l) {
    if (!(group >> l & 1u)) continue;
    const Thread& t = L.threads[base + l];
    if (t.op != lead.op || t.mask != lead.mask || (is_shuffle(t.op) && t.width != lead.width)) {
      fail(L,
           ::remat::detail::str_cat("lanes of warp ", w, " meet in different warp collectives: lane ", leader, " in ",
                                    op_name(lead.op), " (", lead.file, ":", lead.line, ") mask 0x", std::hex, lead.mask,
                                    std::dec, " width ", lead.width, ", lane ", l, " in ", op_name(t.op), " (", t.file,
                                    ":", t.line, ") mask 0x", std::hex, t.mask, std::dec, " width ", t.width));
    }
  }
  uint64_t ballot = 0, sum = 0;
  uint32_t minu = 0xffffffffu, maxu = 0;
  int32_t mins = INT32_MAX, maxs = INT32_MIN;
  for (unsigned l = 0; l < 32; ++l) {
    if (!(group >> l & 1u)) continue;
    const uint64_t v = L.threads[base + l].value;
    if (v != 0) ballot |= uint64_t{1} << l;
    sum += v;
    minu = std::min(minu, static_cast<uint32_t>(v));
    maxu = std::max(maxu, static_cast<uint32_t>(v));
    mins = std::min(mins, static_cast<int32_t>(static_cast<uint32_t>(v)));
    maxs = std::max(maxs, static_cast<int32_t>(static_cast<uint32_t>(v)));
  }
  if (lead.op == WarpOp::kSyncwarp) W.sync_epoch = ++g_warp_epochs;
  for (unsigned l = 0; l < 32; ++l) {
    if (!(group >> l & 1u)) continue;
    Thread& t = L.threads[base + l];
    switch (t.op) {
      case WarpOp::kShflIdx:
      case WarpOp::kShflUp:
      case WarpOp::kShflDown:
      case WarpOp::kShflXor: {
        const unsigned src = shuffle_source(t.op, l, t.arg, t.width);
        // A source lane that does not take part (exited, absent or not in the mask) gives
        // an undefined value on a GPU: here all bits set (NaN as a float).
        t.result = (group >> src & 1u) ? L.threads[base + src].value : ~uint64_t{0};
        break;
      }
      case WarpOp::kBallot: t.result = ballot; break;
      case WarpOp::kAny: t.result = ballot != 0; break;
      case WarpOp::kAll: t.result = ballot == group; break;
      case WarpOp::kReduceAdd: t.result = static_cast<uint32_t>(sum); break;
      case WarpOp::kReduceMinU: t.result = minu; break;
      case WarpOp::kReduceMaxU: t.result = maxu; break;
      case WarpOp::kReduceMinS: t.result = static_cast<uint32_t>(mins); break;
      case WarpOp::kReduceMaxS: t.result = static_cast<uint32_t>(maxs); break;
      case WarpOp::kSyncwarp: t.result = 0; break;
    }
  }
  W.pending &= ~group;
  for (unsigned l = 0; l < 32; ++l) {
    if (!(group >> l & 1u)) continue;
    Thread& t = L.threads[base + l];
    ++t.syncs;
    if (&t == g_current) {
      t.state = State::kRunning;
    } else {
      t.state = State::kReady;
      push_ready(L, base + l);
    }
  }
}

// Completes every group of warp w whose non-exited lanes have all arrived.
void try_complete_warp(Launch& L, unsigned w) {
  Warp& W = L.warps[w];
  bool progress = true;
  while (progress && W.pending) {
    progress = false;
    for (unsigned rest = W.pending; rest; rest &= rest - 1) {
      const unsigned l = static_cast<unsigned>(__builtin_ctz(rest));
      const unsigned need = L.threads[w * 32 + l].mask & W.live;
      if ((W.pending & need) == need) {
        complete_group(L, w, need);
        progress = true;
        break;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Threads and blocks
// ---------------------------------------------------------------------------
void on_exit(Launch& L, Thread& t) {
  t.state = State::kExited;
  --L.live;
  const unsigned w = t.linear / 32;
  L.warps[w].live &= ~(1u << (t.linear % 32));
  if (L.aborting) return;
  if (L.arrived > 0 && L.arrived == L.live) release_barrier(L);
  try_complete_warp(L, w);
}

// The body of every fiber: runs this thread's kernel once per block until the launch ends.
bctx::fiber thread_main(Launch& L, Thread& t, bctx::fiber&& scheduler) {
  t.to_scheduler = std::move(scheduler);
#if defined(REMAT_EMU_ASAN)
  asan_enter(nullptr, &L.scheduler_bottom, &L.scheduler_size);
#endif
  while (!L.quitting) {
    if (!L.aborting) {
      try {
        L.spec->thunk(L.spec->params);
        on_exit(L, t);
      } catch (const bctx::detail::forced_unwind&) {
        throw;
      } catch (const AbortBlock&) {
        t.state = State::kExited;
      } catch (...) {
        if (!L.error) L.error = std::current_exception();
        t.state = State::kExited;
      }
    } else {
      t.state = State::kExited;
    }
    yield_to_scheduler(L, t);
  }
#if defined(REMAT_EMU_ASAN)
  asan_leave(nullptr, L.scheduler_bottom, L.scheduler_size);
#endif
  return std::move(t.to_scheduler);
}

// Unwinds every thread of the block that has not exited, then rethrows the block's error.
[[noreturn]] void abort_block(Launch& L, std::exception_ptr error) {
  L.aborting = true;
  for (Thread& t : L.threads) {
    if (t.state != State::kExited) resume(L, t);
  }
  L.aborting = false;
  std::rethrow_exception(error);
}

void check_race(Launch& L) {
  if (!race_pending()) return;
  abort_block(L, std::make_exception_ptr(Error(race_report(where(L)) +
                                               ::remat::detail::str_cat(" (", L.spec->file, ":", L.spec->line, ")"))));
}

void run_block(Launch& L, uint3 block) {
  L.block = block;
  blockIdx = block;
  if (g_poison) {
    if (L.dynamic_smem) std::memset(L.dynamic_smem, 0xff, L.spec->smem);
  }
  ++g_interval;
  L.ready_head = 0;
  L.ready_count = 0;
  L.live = L.nthreads;
  L.arrived = 0;
  for (unsigned w = 0; w < L.warps.size(); ++w) {
    const unsigned lanes = std::min(32u, L.nthreads - w * 32);
    L.warps[w] = Warp{lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1), 0, 0};
  }
  for (unsigned i = 0; i < L.nthreads; ++i) {
    Thread& t = L.threads[i];
    t.state = State::kReady;
    t.interval_file = nullptr;
    t.interval_line = 0;
    t.syncs = 0;
    push_ready(L, i);
  }
  L.shuffle_state = g_shuffle_seed ^ (uint64_t{block.x} | uint64_t{block.y} << 21 | uint64_t{block.z} << 42);
  while (L.ready_count > 0) {
    if (g_shuffle_seed && L.ready_count > 1) {
      // Any runnable thread may go next (a GPU promises no order between lanes outside
      // warp collectives): swap a random one to the head of the ring.
      const size_t k = (L.ready_head + splitmix64(L.shuffle_state) % L.ready_count) % L.nthreads;
      std::swap(L.ready[L.ready_head], L.ready[k]);
    }
    const unsigned i = L.ready[L.ready_head];
    L.ready_head = (L.ready_head + 1) % L.nthreads;
    --L.ready_count;
    resume(L, L.threads[i]);
    if (L.error) abort_block(L, std::exchange(L.error, nullptr));
    check_race(L);
  }
  traffic_flush();
  if (L.live > 0) {
    abort_block(L, std::make_exception_ptr(Error(::remat::detail::str_cat(
                       where(L), ": deadlock: ", L.live, " threads have not exited and none can proceed:",
                       describe_waiters(L), " (", L.spec->file, ":", L.spec->line, ")"))));
  }
}

cudaError_t validate(const LaunchSpec& s) {
  const unsigned long long threads = static_cast<unsigned long long>(s.block.x) * s.block.y * s.block.z;
  if (threads == 0 || threads > kMaxThreadsPerBlock || s.block.x > 1024 || s.block.y > 1024 ||
      s.block.z > kMaxBlockDimZ) {
    return cudaErrorInvalidConfiguration;
  }
  if (s.grid.x == 0 || s.grid.y == 0 || s.grid.z == 0 || s.grid.x > kMaxGridDimX || s.grid.y > kMaxGridDimYZ ||
      s.grid.z > kMaxGridDimYZ) {
    return cudaErrorInvalidConfiguration;
  }
  size_t limit = kDefaultSharedPerBlock;
  {
    std::lock_guard<std::mutex> lock(g_attr_mutex);
    auto it = g_max_dynamic_smem.find(s.kernel);
    if (it != g_max_dynamic_smem.end()) limit = std::max(limit, it->second);
  }
  if (s.smem > limit) return cudaErrorInvalidValue;
  return cudaSuccess;
}

// Static + dynamic shared memory against the GPU's limits, with the static size known only
// under race checking (the instrumented code's accesses name the __shared__ variables): at
// most 48 KiB static (ptxas refuses more), and static + dynamic at most 48 KiB, or 227 KiB
// once the kernel opted in with cudaFuncAttributeMaxDynamicSharedMemorySize (a GPU refuses
// the launch). Checked after the blocks ran: thrown as an error naming the variables.
void check_static_shared(const LaunchSpec& s) {
  std::string variables;
  const size_t static_bytes = race_static_shared_bytes(&variables);
  if (static_bytes == 0) return;
  bool opted_in = false;
  {
    std::lock_guard<std::mutex> lock(g_attr_mutex);
    opted_in = g_max_dynamic_smem.count(s.kernel) > 0;
  }
  const size_t limit = opted_in ? kMaxSharedPerBlockOptin : kDefaultSharedPerBlock;
  std::string why;
  if (static_bytes > kDefaultSharedPerBlock) {
    why = ::remat::detail::str_cat("static __shared__ memory of ", static_bytes, " bytes exceeds 48 KiB (",
                                   kDefaultSharedPerBlock, " bytes: ptxas refuses the kernel)");
  } else if (static_bytes + s.smem > limit) {
    why = ::remat::detail::str_cat("static __shared__ memory of ", static_bytes, " bytes + ", s.smem,
                                   " bytes of dynamic shared memory exceed the ", limit, " bytes a block may use",
                                   opted_in ? "" : " without cudaFuncAttributeMaxDynamicSharedMemorySize",
                                   " (a GPU refuses the launch)");
  }
  if (why.empty()) return;
  ::remat::detail::throw_error(s.file, s.line,
                               ::remat::detail::str_cat("kernel ", s.name, " <<<(", s.grid.x, ",", s.grid.y, ",",
                                                        s.grid.z, "), (", s.block.x, ",", s.block.y, ",", s.block.z,
                                                        "), ", s.smem, ">>>: ", why, "; variables: ", variables));
}

struct LaunchGuard {
  ~LaunchGuard() {
    t_in_launch = false;
    g_launch = nullptr;
    g_current = nullptr;
    race_end_launch();
    traffic_end_launch();
  }
};

}  // namespace

// ---------------------------------------------------------------------------
// Entry points used by emu.h
// ---------------------------------------------------------------------------
void run_kernel(const LaunchSpec& spec) {
  if (t_in_launch) {
    ::remat::detail::throw_error(spec.file, spec.line,
                                 ::remat::detail::str_cat("kernel ", spec.name,
                                                          " launched from inside a kernel: the CUDA emulator does not "
                                                          "support dynamic parallelism"));
  }
  const cudaError_t err = validate(spec);
  if (err != cudaSuccess) {
    g_last_error = err;
    return;
  }
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  DeviceAccess open;  // the kernel's threads read and write device memory
  Launch L;
  L.spec = &spec;
  L.nthreads = spec.block.x * spec.block.y * spec.block.z;
  L.threads.resize(L.nthreads);
  L.warps.resize((L.nthreads + 31) / 32);
  L.ready.resize(L.nthreads);
  std::vector<unsigned char> dynamic(spec.smem);
  L.dynamic_smem = spec.smem ? dynamic.data() : nullptr;
  g_stacks.reserve(L.nthreads);
  blockDim = spec.block;
  gridDim = spec.grid;
  g_launch = &L;
  LaunchGuard guard;
  t_in_launch = true;
  traffic_begin_launch(spec.name);
  if (g_racecheck) {
    const TlsBlock tls = module_tls(spec.kernel);
    race_begin_launch(L.dynamic_smem, spec.smem, tls.base, tls.bytes, tls.module);
  }

  for (unsigned i = 0; i < L.nthreads; ++i) {
    Thread& t = L.threads[i];
    t.linear = i;
    t.idx = uint3{i % spec.block.x, (i / spec.block.x) % spec.block.y, i / (spec.block.x * spec.block.y)};
    bctx::stack_context sctx;
    sctx.sp = g_stacks.top(i);
    sctx.size = g_stacks.usable();
#if defined(REMAT_EMU_ASAN)
    t.stack_bottom = static_cast<char*>(sctx.sp) - sctx.size;
    t.stack_size = sctx.size;
#endif
    t.fiber = bctx::fiber(std::allocator_arg, bctx::preallocated(sctx.sp, sctx.size, sctx), PoolStack{},
                          [&L, &t](bctx::fiber&& s) { return thread_main(L, t, std::move(s)); });
  }
  // Ends every fiber (their loops see `quitting`), also when a block failed.
  struct Quit {
    Launch& L;
    ~Quit() {
      L.quitting = true;
      L.aborting = true;  // a thread still inside the kernel (only after an internal error) unwinds
      for (Thread& t : L.threads) {
        while (t.fiber) resume(L, t);
      }
    }
  } quit{L};

  for (unsigned z = 0; z < spec.grid.z; ++z) {
    for (unsigned y = 0; y < spec.grid.y; ++y) {
      for (unsigned x = 0; x < spec.grid.x; ++x) run_block(L, uint3{x, y, z});
    }
  }
  if (g_racecheck) check_static_shared(spec);
}

int block_barrier(BarrierOp op, int predicate, const char* file, int line) {
  Launch& L = *g_launch;
  Thread& t = *g_current;
  t.state = State::kAtBarrier;
  t.barrier_op = op;
  t.predicate = predicate;
  t.file = file;
  t.line = line;
  ++L.arrived;
  if (L.arrived == L.live) {
    release_barrier(L);
  } else {
    wait(L, t);
  }
  return t.barrier_result;
}

uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const char* file, int line) {
  Launch& L = *g_launch;
  Thread& t = *g_current;
  const unsigned w = t.linear / 32, lane = t.linear % 32;
  if (!(mask >> lane & 1u)) {
    fail(L, ::remat::detail::str_cat("thread ", thread_str(L, t.linear), " calls ", op_name(op), " (", file, ":", line,
                                     ") with mask 0x", std::hex, mask, std::dec, ", which does not name its own lane ",
                                     lane));
  }
  if (is_shuffle(op) && (width < 1 || width > 32 || (width & (width - 1)) != 0)) {
    fail(L, ::remat::detail::str_cat("thread ", thread_str(L, t.linear), " calls ", op_name(op), " (", file, ":", line,
                                     ") with width ", width, ", which is not a power of two in [1, 32]"));
  }
  t.state = State::kAtWarp;
  t.op = op;
  t.mask = mask;
  t.value = value;
  t.arg = arg;
  t.width = width;
  t.file = file;
  t.line = line;
  L.warps[w].pending |= 1u << lane;
  try_complete_warp(L, w);
  if (t.state == State::kAtWarp) wait(L, t);
  return t.result;
}

unsigned active_mask() {
  const Thread& t = *g_current;
  return g_launch->warps[t.linear / 32].live;
}

void* dynamic_shared() { return g_launch ? g_launch->dynamic_smem : nullptr; }

void trap(const char* file, int line) {
  fail(*g_launch, ::remat::detail::str_cat("thread ", thread_str(*g_launch, g_current->linear), " executed __trap() (",
                                           file, ":", line, ")"));
}

void set_racecheck(bool on) { g_racecheck = on; }
bool racecheck_enabled() { return g_racecheck; }
void set_shuffle_lanes(uint64_t seed) { g_shuffle_seed = seed; }
uint64_t shuffle_lanes_seed() { return g_shuffle_seed; }
uint64_t switch_count() { return g_switches.load(std::memory_order_relaxed); }

cudaError_t func_set_attribute(const void* kernel, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || static_cast<size_t>(value) > kMaxSharedPerBlockOptin) return cudaErrorInvalidValue;
    std::lock_guard<std::mutex> lock(g_attr_mutex);
    g_max_dynamic_smem[kernel] = static_cast<size_t>(value);
  }
  return cudaSuccess;
}

// The traffic counter asks which lane accesses memory, after how many synchronisations.
bool traffic_lane(unsigned* linear, uint64_t* syncs) {
  if (!g_launch || !g_current) return false;
  *linear = g_current->linear;
  *syncs = g_current->syncs;
  return true;
}

// The race checker asks who accesses shared memory, and in which interval.
namespace race {
bool thread_info(AccessorInfo* out) {
  if (!g_launch || !g_current) return false;
  const Thread& t = *g_current;
  out->thread = t.linear;
  out->warp_epoch = g_launch->warps[t.linear / 32].sync_epoch;
  out->interval = g_interval;
  return true;
}
uint64_t warp_epoch_of(unsigned thread) { return g_launch->warps[thread / 32].sync_epoch; }
std::string thread_name(unsigned thread) { return thread_str(*g_launch, thread); }
std::string interval_site(unsigned thread) {
  const Thread& t = g_launch->threads[thread];
  if (!t.interval_file) return "the start of the block";
  return ::remat::detail::str_cat("the barrier at ", t.interval_file, ":", t.interval_line);
}
}  // namespace race

}  // namespace remat::emu

// ---------------------------------------------------------------------------
// Host runtime
// ---------------------------------------------------------------------------
namespace {

struct EmuEvent {
  std::chrono::steady_clock::time_point when{};
  bool recorded = false;
};

}  // namespace

// A non-blocking stream (cudaStreamNonBlocking: remat's copy stream) is where a GPU's
// copy engine runs beside the compute: the emulator defers its copies to the latest point
// a GPU could run them, the moment something waits for them (an event recorded after them
// is waited for or synchronised, the stream is synchronised, or work is launched on it).
// A program that frees, reuses or reads a copy's memory before waiting for the copy sees
// stale or overwritten bytes here, however lucky its timing on a GPU.
struct PendingCopy {
  void* dst;
  const void* src;
  size_t bytes;
};
struct remat_emu_stream {
  unsigned flags = 0;
  std::vector<PendingCopy> pending;  // deferred copies, in stream order
  uint64_t enqueued = 0;             // copies ever deferred on this stream
  uint64_t done = 0;                 // ... and run
};
struct remat_emu_event {
  EmuEvent e;
  unsigned flags = 0;
  remat_emu_stream* stream = nullptr;  // the deferring stream it was last recorded on
  uint64_t upto = 0;                   // the copies of that stream it waits for
};

namespace {
std::mutex g_streams_mutex;
std::vector<remat_emu_stream*> g_deferring_streams;  // live non-blocking streams

bool defers(cudaStream_t s) { return s && (s->flags & cudaStreamNonBlocking); }

// Runs the deferred copies of `s` up to its `upto`-th.
void run_deferred(remat_emu_stream* s, uint64_t upto) {
  if (!s) return;
  std::lock_guard<std::mutex> lock(g_streams_mutex);
  while (s->done < upto && !s->pending.empty()) {
    const PendingCopy c = s->pending.front();
    s->pending.erase(s->pending.begin());
    ++s->done;
    remat::emu::DeviceAccess open;
    std::memmove(c.dst, c.src, c.bytes);
  }
}
void run_all_deferred(remat_emu_stream* s) {
  if (s) run_deferred(s, s->enqueued);
}
}  // namespace

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (!ptr) return cudaErrorInvalidValue;
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  void* p = remat::emu::device_allocate(bytes);
  if (!p) return remat::emu::g_last_error = cudaErrorMemoryAllocation;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  if (!remat::emu::device_free(ptr)) return remat::emu::g_last_error = cudaErrorInvalidValue;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  if (!ptr) return cudaErrorInvalidValue;
  *ptr = bytes ? std::aligned_alloc(256, (bytes + 255) / 256 * 256) : nullptr;
  return (bytes && !*ptr) ? cudaErrorMemoryAllocation : cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}

namespace remat::emu {
namespace {
std::atomic<uint64_t> g_default_stream_uses{0};
}
void note_stream(cudaStream_t stream) {
  if (!stream) g_default_stream_uses.fetch_add(1, std::memory_order_relaxed);
  if (defers(stream)) run_all_deferred(stream);  // work on the stream runs after its copies
}
uint64_t default_stream_uses() { return g_default_stream_uses.load(std::memory_order_relaxed); }
}  // namespace remat::emu

namespace {
cudaError_t memcpy_on(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return cudaErrorInvalidMemcpyDirection;
  if (bytes == 0) return cudaSuccess;
  if (!dst || !src) return cudaErrorInvalidValue;
  remat::emu::DeviceAccess open;
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t memset_on(void* dst, int value, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (!dst) return cudaErrorInvalidValue;
  remat::emu::DeviceAccess open;
  std::memset(dst, value, bytes);
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  remat::emu::note_stream(nullptr);
  return memcpy_on(dst, src, bytes, kind);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  if (defers(stream)) {
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return cudaErrorInvalidMemcpyDirection;
    if (bytes == 0) return cudaSuccess;
    if (!dst || !src) return cudaErrorInvalidValue;
    std::lock_guard<std::mutex> lock(g_streams_mutex);
    stream->pending.push_back({dst, src, bytes});
    ++stream->enqueued;
    return cudaSuccess;
  }
  remat::emu::note_stream(stream);
  return memcpy_on(dst, src, bytes, kind);
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  remat::emu::note_stream(nullptr);
  return memset_on(dst, value, bytes);
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  remat::emu::note_stream(stream);
  return memset_on(dst, value, bytes);
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  remat::emu::device_memory_info(free_bytes, total_bytes);
  return cudaSuccess;
}

cudaError_t cudaGetLastError() { return std::exchange(remat::emu::g_last_error, cudaSuccess); }
cudaError_t cudaPeekAtLastError() { return remat::emu::g_last_error; }

const char* cudaGetErrorName(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorAssert: return "cudaErrorAssert";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorUnknown: return "cudaErrorUnknown";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorAssert: return "device-side assert triggered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorUnknown: return "unknown error";
  }
  return "unknown error";
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return cudaErrorInvalidValue;
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetDevice(int* device) {
  if (!device) return cudaErrorInvalidValue;
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!prop) return cudaErrorInvalidValue;
  if (device != 0) return cudaErrorInvalidDevice;
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof(prop->name), "remat CUDA emulator");
  size_t free_bytes = 0, total = 0;
  cudaMemGetInfo(&free_bytes, &total);
  prop->totalGlobalMem = total;
  prop->sharedMemPerBlock = remat::emu::kDefaultSharedPerBlock;
  prop->sharedMemPerBlockOptin = remat::emu::kMaxSharedPerBlockOptin;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = static_cast<int>(remat::emu::kMaxThreadsPerBlock);
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = static_cast<int>(remat::emu::kMaxBlockDimZ);
  prop->maxGridSize[0] = static_cast<int>(remat::emu::kMaxGridDimX);
  prop->maxGridSize[1] = static_cast<int>(remat::emu::kMaxGridDimYZ);
  prop->maxGridSize[2] = static_cast<int>(remat::emu::kMaxGridDimYZ);
  prop->multiProcessorCount = 1;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->major = 9;
  prop->minor = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  std::vector<remat_emu_stream*> streams;
  {
    std::lock_guard<std::mutex> lock(g_streams_mutex);
    streams = g_deferring_streams;
  }
  for (remat_emu_stream* s : streams) run_all_deferred(s);
  return cudaSuccess;
}
cudaError_t cudaDeviceReset() { return cudaSuccess; }

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (!stream) return cudaErrorInvalidValue;
  *stream = new remat_emu_stream{flags, {}, 0, 0};
  if (defers(*stream)) {
    std::lock_guard<std::mutex> lock(g_streams_mutex);
    g_deferring_streams.push_back(*stream);
  }
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (!stream) return cudaErrorInvalidResourceHandle;
  run_all_deferred(stream);  // as a GPU, which completes the stream's work first
  {
    std::lock_guard<std::mutex> lock(g_streams_mutex);
    auto& v = g_deferring_streams;
    v.erase(std::remove(v.begin(), v.end(), stream), v.end());
  }
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (defers(stream)) run_all_deferred(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (defers(stream) && stream->done < stream->enqueued) return cudaErrorNotReady;
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t event, unsigned int) {
  if (!event) return cudaErrorInvalidResourceHandle;
  run_deferred(event->stream, event->upto);  // the waiting stream's later work sees the copies
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (!event) return cudaErrorInvalidValue;
  *event = new remat_emu_event{EmuEvent{}, flags};
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (!event) return cudaErrorInvalidResourceHandle;
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!event) return cudaErrorInvalidResourceHandle;
  event->e.when = std::chrono::steady_clock::now();
  event->e.recorded = true;
  event->stream = defers(stream) ? stream : nullptr;
  event->upto = defers(stream) ? stream->enqueued : 0;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (!event) return cudaErrorInvalidResourceHandle;
  run_deferred(event->stream, event->upto);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (!event) return cudaErrorInvalidResourceHandle;
  // Not ready while its copies wait: a caller polling it must synchronise (as on a GPU,
  // whose copy may still run).
  if (event->stream && event->stream->done < event->upto) return cudaErrorNotReady;
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return cudaErrorInvalidValue;
  if (!start || !end) return cudaErrorInvalidResourceHandle;
  if ((start->flags | end->flags) & cudaEventDisableTiming) return cudaErrorInvalidResourceHandle;
  if (!start->e.recorded || !end->e.recorded) return cudaErrorInvalidResourceHandle;
  *ms = std::chrono::duration<float, std::milli>(end->e.when - start->e.when).count();
  return cudaSuccess;
}
