// Shared-memory race checking: shadow records and the __tsan_* entry points that
// instrumented kernel code calls (see racecheck.h). This file must not itself be
// compiled with -fsanitize=thread.
#include "kernels/emu/racecheck.h"

#include "kernels/emu/traffic.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <vector>

#include "remat/error.h"

namespace remat::emu {
namespace {

struct Rec {
  uint64_t interval = 0;  // 0: none
  uint64_t warp_epoch = 0;
  unsigned thread = 0;
};

struct Shadow {
  Rec write, read1, read2;
};

struct Region {
  const char* base = nullptr;
  size_t bytes = 0;
  const char* name = "";
  std::vector<Shadow> shadow;
};

struct TlsSymbol {
  size_t value = 0, size = 0;  // offset in the module's TLS block, bytes
  std::string name;            // demangled
};

// The thread-local variables of `module` (an ELF file), from its symbol table, by offset;
// empty when unknown (e.g. a stripped binary). Read once per module.
const std::vector<TlsSymbol>& tls_symbols(const std::string& module) {
  static std::map<std::string, std::vector<TlsSymbol>> cache;
  auto [it, inserted] = cache.try_emplace(module);
  if (!inserted) return it->second;
  std::vector<TlsSymbol>& out = it->second;
  std::ifstream f(module, std::ios::binary);
  const std::vector<char> elf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (elf.size() < sizeof(Elf64_Ehdr) || std::memcmp(elf.data(), ELFMAG, SELFMAG) != 0 || elf[EI_CLASS] != ELFCLASS64) {
    return out;
  }
  Elf64_Ehdr eh;
  std::memcpy(&eh, elf.data(), sizeof eh);
  auto section = [&](size_t i) {
    Elf64_Shdr sh{};
    const size_t at = eh.e_shoff + i * sizeof(Elf64_Shdr);
    if (at + sizeof sh <= elf.size()) std::memcpy(&sh, elf.data() + at, sizeof sh);
    return sh;
  };
  for (size_t i = 0; i < eh.e_shnum; ++i) {
    const Elf64_Shdr symtab = section(i);
    if (symtab.sh_type != SHT_SYMTAB || symtab.sh_offset + symtab.sh_size > elf.size()) continue;
    const Elf64_Shdr strtab = section(symtab.sh_link);
    for (size_t k = 0; k < symtab.sh_size / sizeof(Elf64_Sym); ++k) {
      Elf64_Sym sym;
      std::memcpy(&sym, elf.data() + symtab.sh_offset + k * sizeof sym, sizeof sym);
      if (ELF64_ST_TYPE(sym.st_info) != STT_TLS || strtab.sh_offset + sym.st_name >= elf.size()) continue;
      const char* mangled = elf.data() + strtab.sh_offset + sym.st_name;
      int status = 0;
      char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
      out.push_back({sym.st_value, sym.st_size, status == 0 && demangled ? demangled : mangled});
      std::free(demangled);
    }
  }
  std::sort(out.begin(), out.end(), [](const TlsSymbol& a, const TlsSymbol& b) { return a.value < b.value; });
  return out;
}

// The symbol of `module` that holds byte `offset` of its TLS block; nullptr when unknown.
const TlsSymbol* tls_symbol_at(const std::string& module, size_t offset) {
  for (const TlsSymbol& s : tls_symbols(module))
    if (offset >= s.value && offset < s.value + s.size) return &s;
  return nullptr;
}

// The thread-local variable that holds byte `offset`, as "name + k"; "" when unknown.
std::string tls_symbol(const std::string& module, size_t offset) {
  const TlsSymbol* s = tls_symbol_at(module, offset);
  return s ? ::remat::detail::str_cat(s->name, " + ", offset - s->value) : "";
}

bool g_active = false;
std::string g_static_module;  // the file that holds the static __shared__ variables
Region g_dynamic, g_static;
bool g_found = false;
std::string g_report;

bool conflicts(const Rec& prev, const race::AccessorInfo& cur) {
  if (prev.interval != cur.interval || prev.thread == cur.thread) return false;
  // Lanes of one warp are ordered by a __syncwarp that completed between the accesses.
  if (prev.thread / 32 == cur.thread / 32 && prev.warp_epoch != cur.warp_epoch) return false;
  return true;
}

void report(const char* kind, const Region& r, size_t offset, const Rec& prev, const race::AccessorInfo& cur,
            const void* pc) {
  if (g_found) return;
  g_found = true;
  std::string what = ::remat::detail::str_cat(r.name, " byte ", offset);
  if (&r == &g_static) {
    const std::string sym = tls_symbol(g_static_module, offset);
    if (!sym.empty())
      what = ::remat::detail::str_cat("static __shared__ ", sym, " (byte ", offset, " of the thread-local block)");
  }
  std::string at;
  Dl_info info{};
  if (pc && dladdr(pc, &info) && info.dli_fname) {
    const char* base = std::strrchr(info.dli_fname, '/');
    at = ::remat::detail::str_cat("; the second access is at ", base ? base + 1 : info.dli_fname, "+0x", std::hex,
                                  reinterpret_cast<uintptr_t>(pc) - reinterpret_cast<uintptr_t>(info.dli_fbase),
                                  std::dec, " (addr2line -e <binary> <offset> names the line)");
  }
  g_report = ::remat::detail::str_cat("shared-memory race (", kind, ") on ", what, ": thread ",
                                      race::thread_name(prev.thread), " and thread ", race::thread_name(cur.thread),
                                      " access it in the same barrier interval (after ",
                                      race::interval_site(cur.thread), ") with no __syncthreads between them", at);
}

void access(Region& r, size_t offset, size_t size, bool is_write, const race::AccessorInfo& cur, const void* pc) {
  const size_t end = std::min(offset + size, r.bytes);
  for (size_t o = offset; o < end; ++o) {
    Shadow& s = r.shadow[o];
    if (conflicts(s.write, cur)) report(is_write ? "write-write" : "write-read", r, o, s.write, cur, pc);
    const Rec me{cur.interval, cur.warp_epoch, cur.thread};
    if (is_write) {
      if (conflicts(s.read1, cur)) report("read-write", r, o, s.read1, cur, pc);
      if (conflicts(s.read2, cur)) report("read-write", r, o, s.read2, cur, pc);
      s.write = me;
    } else if (s.read1.interval != cur.interval || s.read1.thread == cur.thread) {
      s.read1 = me;
    } else {
      s.read2 = me;  // a second, different reader in this interval
    }
  }
}

void on_access(const void* addr, size_t size, bool is_write, const void* pc) {
  const char* p = static_cast<const char*>(addr);
  Region* r = nullptr;
  if (g_dynamic.bytes && p >= g_dynamic.base && p < g_dynamic.base + g_dynamic.bytes) {
    r = &g_dynamic;
  } else if (g_static.bytes && p >= g_static.base && p < g_static.base + g_static.bytes) {
    r = &g_static;
  } else {
    return;
  }
  race::AccessorInfo cur{};
  if (!race::thread_info(&cur)) return;
  access(*r, static_cast<size_t>(p - r->base), size, is_write, cur, pc);
}

void setup(Region& r, const void* base, size_t bytes, const char* name) {
  r.base = static_cast<const char*>(base);
  r.bytes = base ? bytes : 0;
  r.name = name;
  r.shadow.assign(r.bytes, Shadow{});
}

}  // namespace

void race_begin_launch(const void* dynamic_base, size_t dynamic_bytes, const void* static_base, size_t static_bytes,
                       const char* static_module) {
  g_static_module = static_module ? static_module : "";
  setup(g_dynamic, dynamic_base, dynamic_bytes, "dynamic shared memory");
  setup(g_static, static_base, static_bytes, "static __shared__ memory");
  g_found = false;
  g_active = true;
}

void race_end_launch() {
  g_active = false;
  g_found = false;
}

bool race_pending() { return g_found; }

size_t race_static_shared_bytes(std::string* variables) {
  size_t total = 0;
  for (size_t o = 0; o < g_static.bytes;) {
    const Shadow& sh = g_static.shadow[o];
    if (!sh.write.interval && !sh.read1.interval && !sh.read2.interval) {
      ++o;
      continue;
    }
    const TlsSymbol* sym = tls_symbol_at(g_static_module, o);
    if (!sym) {  // no symbol table: the bytes touched, at least
      ++total;
      ++o;
      continue;
    }
    total += sym->size;
    if (variables)
      *variables += ::remat::detail::str_cat(variables->empty() ? "" : ", ", sym->name, " (", sym->size, ")");
    o = sym->value + sym->size;
  }
  return total;
}

std::string race_report(const std::string& where) {
  g_found = false;
  return where + ": " + g_report;
}

}  // namespace remat::emu

// ---------------------------------------------------------------------------
// The entry points GCC's -fsanitize=thread instrumentation calls. Only loads and stores
// are checked (and counted by traffic.cpp); atomics are performed (sequentially
// consistent) and neither recorded nor counted.
// Absent from a build that links the real ThreadSanitizer runtime.
// ---------------------------------------------------------------------------
#if !defined(__SANITIZE_THREAD__)
extern "C" {

// Every load and store goes to the race checker and to the traffic counter when they run.
#define REMAT_EMU_ACCESS(a, n, w)                                                                         \
  do {                                                                                                    \
    if (remat::emu::g_active) remat::emu::on_access(a, n, w, __builtin_return_address(0));                \
    if (remat::emu::g_traffic_counting) remat::emu::traffic_access(a, n, w, __builtin_return_address(0)); \
  } while (0)
#define REMAT_RACE_RW(n)                                                    \
  void __tsan_read##n(void* a) { REMAT_EMU_ACCESS(a, n, false); }           \
  void __tsan_write##n(void* a) { REMAT_EMU_ACCESS(a, n, true); }           \
  void __tsan_unaligned_read##n(void* a) { REMAT_EMU_ACCESS(a, n, false); } \
  void __tsan_unaligned_write##n(void* a) { REMAT_EMU_ACCESS(a, n, true); } \
  void __tsan_volatile_read##n(void* a) { REMAT_EMU_ACCESS(a, n, false); }  \
  void __tsan_volatile_write##n(void* a) { REMAT_EMU_ACCESS(a, n, true); }
REMAT_RACE_RW(1)
REMAT_RACE_RW(2)
REMAT_RACE_RW(4)
REMAT_RACE_RW(8)
REMAT_RACE_RW(16)
#undef REMAT_RACE_RW

void __tsan_read_range(void* a, unsigned long n) { REMAT_EMU_ACCESS(a, n, false); }
void __tsan_write_range(void* a, unsigned long n) { REMAT_EMU_ACCESS(a, n, true); }
#undef REMAT_EMU_ACCESS
// Each instrumented translation unit calls this from its constructor.
void __tsan_init() { remat::emu::traffic_note_instrumented_module(); }
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

#define REMAT_RACE_ATOMIC(n, T)                                                                                    \
  T __tsan_atomic##n##_load(const volatile T* a, int) { return __atomic_load_n(a, __ATOMIC_SEQ_CST); }             \
  void __tsan_atomic##n##_store(volatile T* a, T v, int) { __atomic_store_n(a, v, __ATOMIC_SEQ_CST); }             \
  T __tsan_atomic##n##_exchange(volatile T* a, T v, int) { return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); }   \
  T __tsan_atomic##n##_fetch_add(volatile T* a, T v, int) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }   \
  T __tsan_atomic##n##_fetch_sub(volatile T* a, T v, int) { return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); }   \
  T __tsan_atomic##n##_fetch_and(volatile T* a, T v, int) { return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); }   \
  T __tsan_atomic##n##_fetch_or(volatile T* a, T v, int) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }     \
  T __tsan_atomic##n##_fetch_xor(volatile T* a, T v, int) { return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); }   \
  T __tsan_atomic##n##_fetch_nand(volatile T* a, T v, int) { return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST); } \
  int __tsan_atomic##n##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) {                             \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                        \
  }                                                                                                                \
  int __tsan_atomic##n##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {                               \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                        \
  }                                                                                                                \
  T __tsan_atomic##n##_compare_exchange_val(volatile T* a, T c, T v, int, int) {                                   \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                              \
    return c;                                                                                                      \
  }
REMAT_RACE_ATOMIC(8, char)
REMAT_RACE_ATOMIC(16, short)
REMAT_RACE_ATOMIC(32, int)
REMAT_RACE_ATOMIC(64, long)
#undef REMAT_RACE_ATOMIC

}  // extern "C"
#endif
