// The emulated GPU's memory: every cudaMalloc is a mapping of its own that host code
// cannot touch. Its pages are readable and writable only while an emulated call that a
// GPU would run on the device is in progress (a kernel, a copy, a memset, a cuBLAS call:
// a DeviceAccess section); outside those sections they are PROT_NONE, so host code that
// dereferences a device pointer faults here as it does on a GPU, with a message naming the
// allocation. The allocation ends just before a page that is never accessible, so a kernel
// that runs past the end of an allocation faults too (and under AddressSanitizer the bytes
// between the end and that page are poisoned, so one element past the end is caught).
//
// REMAT_EMU_PROTECT_DEVICE_MEMORY=0 maps the memory read-write for good (for debugging
// with tools that cannot step over the faults).
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>

#include "kernels/emu/emu.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define REMAT_EMU_DEVICE_ASAN 1
#endif

namespace remat::emu {
namespace {

constexpr size_t kAlign = 256;  // cudaMalloc's alignment

struct Mapping {
  char* base;         // the mapping: data pages, then one guard page
  size_t map_bytes;   // data pages + guard page
  size_t data_pages;  // bytes of the pages that hold the allocation
  size_t bytes;       // what the caller asked for
};

std::mutex g_mutex;                          // guards everything below
std::map<uintptr_t, Mapping> g_allocations;  // by the address cudaMalloc returned
int g_open_sections = 0;                     // DeviceAccess sections now open
bool g_protect = true;                       // REMAT_EMU_PROTECT_DEVICE_MEMORY
bool g_configured = false;
struct sigaction g_previous_segv {};
bool g_handler_installed = false;

size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

void configure_locked() {
  if (g_configured) return;
  g_configured = true;
  const char* v = std::getenv("REMAT_EMU_PROTECT_DEVICE_MEMORY");
  g_protect = !(v && std::strcmp(v, "0") == 0);
}

void set_access_locked(const Mapping& m, bool open) {
  if (mprotect(m.base, m.data_pages, open ? PROT_READ | PROT_WRITE : PROT_NONE) != 0) {
    std::fprintf(stderr, "cuda-emu: mprotect of device memory failed: %s\n", std::strerror(errno));
    std::abort();
  }
}

// The allocation that holds `addr` or whose guard page holds it (null: none).
const Mapping* find_locked(uintptr_t addr) {
  auto it = g_allocations.upper_bound(addr);
  if (it == g_allocations.begin()) return nullptr;
  --it;
  const Mapping& m = it->second;
  const auto base = reinterpret_cast<uintptr_t>(m.base);
  return addr >= base && addr < base + m.map_bytes ? &m : nullptr;
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

// Explains a fault in device memory, then lets it take its course: the previous handler
// (AddressSanitizer's report, a debugger's) or the default action (the process ends with
// SIGSEGV). No lock: the process is about to end, and the map is not changed while a
// section that could fault is open.
void on_segv(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  const Mapping* m = nullptr;
  for (const auto& [user, mapping] : g_allocations) {
    const auto base = reinterpret_cast<uintptr_t>(mapping.base);
    if (addr >= base && addr < base + mapping.map_bytes) m = &mapping;
  }
  if (m) {
    char msg[512];
    const uintptr_t user =
        reinterpret_cast<uintptr_t>(m->base) + m->data_pages - (m->bytes + kAlign - 1) / kAlign * kAlign;
    const bool past = addr >= reinterpret_cast<uintptr_t>(m->base) + m->data_pages;
    if (g_open_sections > 0 || past) {
      std::snprintf(msg, sizeof msg,
                    "cuda-emu: an access at 0x%llx, past the cudaMalloc allocation of %zu bytes at 0x%llx "
                    "(an illegal address on a GPU)\n",
                    static_cast<unsigned long long>(addr), m->bytes, static_cast<unsigned long long>(user));
    } else {
      std::snprintf(msg, sizeof msg,
                    "cuda-emu: host code touched device memory at 0x%llx, inside the cudaMalloc allocation of %zu "
                    "bytes at 0x%llx: a GPU's memory is not addressable from the host; copy it with cudaMemcpy (or "
                    "a Tensor's to(), to_vector())\n",
                    static_cast<unsigned long long>(addr), m->bytes, static_cast<unsigned long long>(user));
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

void install_handler_locked() {
  if (g_handler_installed) return;
  g_handler_installed = true;
  struct sigaction sa {};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_previous_segv);
}

}  // namespace

void* device_allocate(size_t bytes) {
  const size_t page = page_size();
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  const size_t data_pages = (rounded + page - 1) / page * page;
  const size_t map_bytes = data_pages + page;
  std::lock_guard<std::mutex> lock(g_mutex);
  configure_locked();
  install_handler_locked();
  const int prot = (g_protect && g_open_sections == 0) ? PROT_NONE : PROT_READ | PROT_WRITE;
  void* base = mmap(nullptr, map_bytes, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return nullptr;
  char* b = static_cast<char*>(base);
  // The last page stays inaccessible whatever sections open.
  if (prot != PROT_NONE) mprotect(b + data_pages, page, PROT_NONE);
  char* user = b + data_pages - rounded;
#if defined(REMAT_EMU_DEVICE_ASAN)
  if (rounded > bytes) __asan_poison_memory_region(user + bytes, rounded - bytes);
#endif
  g_allocations[reinterpret_cast<uintptr_t>(user)] = Mapping{b, map_bytes, data_pages, bytes};
  return user;
}

bool device_free(void* ptr) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == g_allocations.end()) return false;
  const Mapping m = it->second;
  g_allocations.erase(it);
#if defined(REMAT_EMU_DEVICE_ASAN)
  __asan_unpoison_memory_region(m.base, m.data_pages);
#endif
  munmap(m.base, m.map_bytes);
  return true;
}

DeviceAccess::DeviceAccess() {
  std::lock_guard<std::mutex> lock(g_mutex);
  configure_locked();
  if (g_open_sections++ == 0 && g_protect) {
    for (const auto& [user, m] : g_allocations) set_access_locked(m, true);
  }
}

DeviceAccess::~DeviceAccess() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (--g_open_sections == 0 && g_protect) {
    for (const auto& [user, m] : g_allocations) set_access_locked(m, false);
  }
}

bool device_memory_protected() {
  std::lock_guard<std::mutex> lock(g_mutex);
  configure_locked();
  return g_protect;
}

bool is_device_pointer(const void* p) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const Mapping* m = find_locked(reinterpret_cast<uintptr_t>(p));
  if (!m) return false;
  const auto a = reinterpret_cast<uintptr_t>(p);
  return a < reinterpret_cast<uintptr_t>(m->base) + m->data_pages;
}

}  // namespace remat::emu
