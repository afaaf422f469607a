// The emulated GPU's memory: one reserved arena of address space (PROT_NONE, no memory
// committed), from which every cudaMalloc takes whole pages followed by a guard page that
// is never accessible. Host code cannot touch it: an allocation's pages become readable
// and writable only while an emulated call that a GPU would run on the device is in
// progress (a kernel, a copy, a memset, a cuBLAS call: a DeviceAccess section), so host
// code that dereferences a device pointer faults here as it does on a GPU, with a message
// naming the allocation.
//
// Opening is lazy: a section changes no protection when it opens. The first access of the
// section to an allocation faults; the SIGSEGV handler sees the open section and the live
// allocation that holds the address, makes that allocation's pages accessible (one
// mprotect) and returns, and the access runs again. When the last section closes, the
// allocations it opened go back to PROT_NONE (one mprotect each). So a section costs in
// proportion to the allocations it touches, not to the arena; the guard pages and the
// arena's free pages stay inaccessible inside sections too, so a kernel that runs past the
// end of an allocation, or into freed memory, faults (and under AddressSanitizer the bytes
// between an allocation's end and its guard page are poisoned, so one element past the end
// is caught).
//
// REMAT_EMU_PROTECT_DEVICE_MEMORY=0 leaves allocations readable and writable for good (for
// debugging with tools that stop at every SIGSEGV; the guard pages stay).
// REMAT_EMU_DEVICE_MEMORY_MIB=<n> sets the size of the device (default: the machine's
// physical memory, as cudaMemGetInfo reports it).
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "kernels/emu/emu.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define REMAT_EMU_DEVICE_ASAN 1
#endif

namespace remat::emu {
namespace {

constexpr size_t kAlign = 256;  // cudaMalloc's alignment

struct Allocation {
  size_t offset = 0;      // of its first data page in the arena
  size_t data_pages = 0;  // bytes of the pages that hold it (its guard page follows)
  size_t bytes = 0;       // what the caller asked for
  bool open = false;      // accessible in the sections now open
  uintptr_t user(const char* base) const {
    return reinterpret_cast<uintptr_t>(base) + offset + data_pages - (bytes + kAlign - 1) / kAlign * kAlign;
  }
};

std::mutex g_mutex;                  // guards everything below
thread_local bool t_locked = false;  // this thread holds g_mutex (the fault handler must not wait for it)
struct Lock {
  std::lock_guard<std::mutex> guard{g_mutex};
  Lock() { t_locked = true; }
  ~Lock() { t_locked = false; }
};

char* g_base = nullptr;                      // the arena
size_t g_size = 0;                           // its bytes (the device's memory)
size_t g_top = 0;                            // bytes ever handed out from its start (allocations and their guards)
size_t g_in_use = 0;                         // bytes of live allocations' pages, guards included
std::map<size_t, Allocation> g_allocations;  // by offset
std::map<size_t, size_t> g_free;             // free ranges below g_top: offset -> bytes (coalesced)
std::set<std::pair<size_t, size_t>> g_free_by_size;  // (bytes, offset) of the same ranges
std::vector<size_t> g_opened;                        // offsets of the allocations open now
int g_open_sections = 0;                             // DeviceAccess sections now open
bool g_protect = true;                               // REMAT_EMU_PROTECT_DEVICE_MEMORY
bool g_configured = false;
struct sigaction g_previous_segv {};

size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

void write_all(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

[[noreturn]] void die(const char* what) {
  char msg[256];
  std::snprintf(msg, sizeof msg, "cuda-emu: %s failed: %s\n", what, std::strerror(errno));
  write_all(msg);
  std::abort();
}

void set_access_locked(const Allocation& a, bool open) {
  if (mprotect(g_base + a.offset, a.data_pages, open ? PROT_READ | PROT_WRITE : PROT_NONE) != 0)
    die("mprotect of device memory");
}

// The allocation whose data pages or guard page hold arena offset `off` (null: none).
Allocation* find_locked(size_t off) {
  auto it = g_allocations.upper_bound(off);
  if (it == g_allocations.begin()) return nullptr;
  --it;
  Allocation& a = it->second;
  return off < a.offset + a.data_pages + page_size() ? &a : nullptr;
}

void on_segv(int sig, siginfo_t* info, void* context);

void configure_locked() {
  if (g_configured) return;
  g_configured = true;
  const char* v = std::getenv("REMAT_EMU_PROTECT_DEVICE_MEMORY");
  g_protect = !(v && std::strcmp(v, "0") == 0);
  const size_t page = page_size();
  size_t size = static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * page;
  if (const char* mib = std::getenv("REMAT_EMU_DEVICE_MEMORY_MIB"); mib && *mib) {
    char* end = nullptr;
    const unsigned long long m = std::strtoull(mib, &end, 10);
    if (end && *end == 0 && m > 0) {
      size = static_cast<size_t>(m) << 20;
    } else {
      std::fprintf(stderr, "REMAT_EMU_DEVICE_MEMORY_MIB=%s: want a positive number of MiB; using %zu MiB\n", mib,
                   size >> 20);
    }
  }
  size = (size + page - 1) / page * page;
  // Address space only: no memory is committed until pages are written.
  void* p = MAP_FAILED;
  while (p == MAP_FAILED && size >= (size_t{256} << 20)) {
    p = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) size /= 2;
  }
  if (p == MAP_FAILED) die("reserving the emulated device's memory (mmap)");
  g_base = static_cast<char*>(p);
  g_size = size;
  g_opened.reserve(4096);  // the fault handler appends to it: rarely an allocation there
  struct sigaction sa {};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_previous_segv);
}

void add_free_locked(size_t off, size_t bytes) {
  auto next = g_free.lower_bound(off);
  if (next != g_free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      g_free_by_size.erase({prev->second, prev->first});
      off = prev->first;
      bytes += prev->second;
      g_free.erase(prev);
    }
  }
  if (next != g_free.end() && off + bytes == next->first) {
    g_free_by_size.erase({next->second, next->first});
    bytes += next->second;
    g_free.erase(next);
  }
  if (off + bytes == g_top) {  // the end of the used part moves back
    g_top = off;
    return;
  }
  g_free[off] = bytes;
  g_free_by_size.insert({bytes, off});
}

// Offset of `bytes` (a page multiple) of free arena; g_size when the device is full.
size_t take_locked(size_t bytes) {
  auto it = g_free_by_size.lower_bound({bytes, 0});
  if (it != g_free_by_size.end()) {  // the smallest free range that fits
    const auto [len, off] = *it;
    g_free_by_size.erase(it);
    g_free.erase(off);
    if (len > bytes) {
      g_free[off + bytes] = len - bytes;
      g_free_by_size.insert({len - bytes, off + bytes});
    }
    return off;
  }
  if (g_size - g_top < bytes) return g_size;
  const size_t off = g_top;
  g_top += bytes;
  return off;
}

// Explains a fault in the arena, then lets it take its course: the previous handler
// (AddressSanitizer's report, a debugger's) or the default action (the process ends with
// SIGSEGV). Inside an open section, a fault on a live allocation's data pages opens the
// allocation and returns: the access runs again.
void on_segv(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  const auto base = reinterpret_cast<uintptr_t>(g_base);
  if (g_base && addr >= base && addr < base + g_size) {
    char msg[512];
    msg[0] = 0;
    if (t_locked) {
      std::snprintf(msg, sizeof msg,
                    "cuda-emu: internal error: a fault at 0x%llx while the device memory lock is held\n",
                    static_cast<unsigned long long>(addr));
    } else {
      Lock lock;
      const size_t off = addr - base;
      Allocation* a = find_locked(off);
      const bool in_data = a && off < a->offset + a->data_pages;
      if (in_data && g_open_sections > 0) {
        if (!a->open) {
          set_access_locked(*a, true);
          a->open = true;
          g_opened.push_back(a->offset);
        }
        return;  // (or another thread opened it meanwhile) the access runs again
      }
      if (a) {
        const unsigned long long user = a->user(g_base);
        if (!in_data) {
          std::snprintf(msg, sizeof msg,
                        "cuda-emu: an access at 0x%llx, past the cudaMalloc allocation of %zu bytes at 0x%llx "
                        "(an illegal address on a GPU)\n",
                        static_cast<unsigned long long>(addr), a->bytes, user);
        } else {
          std::snprintf(msg, sizeof msg,
                        "cuda-emu: host code touched device memory at 0x%llx, inside the cudaMalloc allocation of "
                        "%zu bytes at 0x%llx: a GPU's memory is not addressable from the host; copy it with "
                        "cudaMemcpy (or a Tensor's to(), to_vector())\n",
                        static_cast<unsigned long long>(addr), a->bytes, user);
        }
      } else {
        std::snprintf(msg, sizeof msg,
                      "cuda-emu: an access at 0x%llx, in the emulated device's memory but in no live cudaMalloc "
                      "allocation (freed, or never allocated: an illegal address on a GPU)\n",
                      static_cast<unsigned long long>(addr));
      }
    }
    write_all(msg);
  }
  // Back to what was there before; returning re-executes the access, which faults again
  // under that handler (or the default action).
  sigaction(SIGSEGV, &g_previous_segv, nullptr);
  if ((g_previous_segv.sa_flags & SA_SIGINFO) && g_previous_segv.sa_sigaction) {
    g_previous_segv.sa_sigaction(sig, info, context);
  }
}

}  // namespace

void* device_allocate(size_t bytes) {
  const size_t page = page_size();
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  const size_t data_pages = (rounded + page - 1) / page * page;
  if (rounded < bytes || data_pages < rounded) return nullptr;  // overflow
  Lock lock;
  configure_locked();
  if (data_pages > g_size - page) return nullptr;
  const size_t off = take_locked(data_pages + page);
  if (off == g_size) return nullptr;
  Allocation a{off, data_pages, bytes, false};
  if (!g_protect) set_access_locked(a, true);
  char* user = g_base + off + data_pages - rounded;
#if defined(REMAT_EMU_DEVICE_ASAN)
  if (rounded > bytes) __asan_poison_memory_region(user + bytes, rounded - bytes);
#endif
  g_allocations[off] = a;
  g_in_use += data_pages + page;
  return user;
}

bool device_free(void* ptr) {
  Lock lock;
  if (!g_base) return false;
  const auto p = reinterpret_cast<uintptr_t>(ptr), base = reinterpret_cast<uintptr_t>(g_base);
  if (p < base || p >= base + g_size) return false;
  Allocation* a = find_locked(p - base);
  if (!a || a->user(g_base) != p) return false;
  const Allocation gone = *a;
  g_allocations.erase(gone.offset);
#if defined(REMAT_EMU_DEVICE_ASAN)
  __asan_unpoison_memory_region(g_base + gone.offset, gone.data_pages);
#endif
  // The pages go back to the system (their contents with them); the range stays reserved.
  if (madvise(g_base + gone.offset, gone.data_pages, MADV_DONTNEED) != 0) die("madvise of device memory");
  if (gone.open || !g_protect) set_access_locked(gone, false);
  if (gone.open) {
    for (size_t& o : g_opened)
      if (o == gone.offset) o = SIZE_MAX;  // closed already
  }
  g_in_use -= gone.data_pages + page_size();
  add_free_locked(gone.offset, gone.data_pages + page_size());
  return true;
}

DeviceAccess::DeviceAccess() {
  Lock lock;
  configure_locked();
  ++g_open_sections;
}

DeviceAccess::~DeviceAccess() {
  Lock lock;
  if (--g_open_sections > 0) return;
  for (const size_t off : g_opened) {
    if (off == SIZE_MAX) continue;
    auto it = g_allocations.find(off);
    if (it == g_allocations.end()) continue;
    set_access_locked(it->second, false);
    it->second.open = false;
  }
  g_opened.clear();
}

bool device_memory_protected() {
  Lock lock;
  configure_locked();
  return g_protect;
}

bool is_device_pointer(const void* p) {
  Lock lock;
  if (!g_base) return false;
  const auto a = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(g_base);
  if (a < base || a >= base + g_size) return false;
  const Allocation* m = find_locked(a - base);
  return m && a - base < m->offset + m->data_pages;
}

void device_memory_info(size_t* free_bytes, size_t* total_bytes) {
  Lock lock;
  configure_locked();
  if (free_bytes) *free_bytes = g_size - g_in_use;
  if (total_bytes) *total_bytes = g_size;
}

bool device_arena(const void** base, size_t* bytes) {
  Lock lock;
  configure_locked();
  *base = g_base;
  *bytes = g_size;
  return g_base != nullptr;
}

}  // namespace remat::emu
