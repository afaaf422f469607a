// Shared-memory race checking of the CUDA emulator (internal to kernels/emu).
//
// Kernel translation units compiled with the race instrumentation (GCC's
// -fsanitize=thread code generation, linked against our own __tsan_* entry points in
// racecheck.cpp instead of the ThreadSanitizer runtime) report every load and store.
// While a launch runs with race checking on, accesses that fall into the block's shared
// memory (the static __shared__ section and the dynamic buffer) update a shadow record
// per byte: the last writer and up to two readers, each with its barrier interval.
// Two accesses by different threads to one byte in the same interval, at least one of
// them a write, are a race, unless both threads are in one warp and a __syncwarp
// completed between them. Atomics are not reported as plain accesses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace remat::emu {

namespace race {
// Who is accessing memory now (provided by emu.cpp).
struct AccessorInfo {
  unsigned thread;      // linear index in the block
  uint64_t warp_epoch;  // changes when the thread's warp completes a __syncwarp
  uint64_t interval;    // changes at every block barrier and every block start
};
bool thread_info(AccessorInfo* out);
uint64_t warp_epoch_of(unsigned thread);
std::string thread_name(unsigned thread);
std::string interval_site(unsigned thread);
}  // namespace race

// static_module: the ELF file whose thread-local block holds the static __shared__
// variables (to name them in reports).
void race_begin_launch(const void* dynamic_base, size_t dynamic_bytes, const void* static_base, size_t static_bytes,
                       const char* static_module);
void race_end_launch();
// A race was found since the last report.
bool race_pending();
// The static __shared__ memory of the launch running (or just run): the whole size of every
// thread-local variable of the module that its instrumented code touched (the bytes touched
// where the symbol table is missing); `variables` gets their names and sizes.
size_t race_static_shared_bytes(std::string* variables);
// The report of the first race found (prefixed by `where`); clears it.
std::string race_report(const std::string& where);

}  // namespace remat::emu
