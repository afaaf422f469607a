// Global-memory traffic counting of the CUDA emulator (internal to kernels/emu; the public
// entry points are in emu.h: set_traffic_count, take_traffic).
//
// Instrumented kernel code (the race instrumentation, racecheck.h) reports every load and
// store with the address of the instruction that made it. An access is global when it
// falls into the emulator's device memory (the cudaMalloc arena). A *warp access* is one
// instruction executed by the lanes of a warp: the lanes of a warp run one after another
// between synchronisation points, so the k-th execution of an instruction by one lane
// since its last synchronisation point (a block barrier or a warp collective it took part
// in) and the k-th execution of the same instruction by the other lanes of its warp since
// the same point are one warp access. Its requested bytes are the distinct bytes its lanes
// asked for (a value read by several lanes counts once), its sectors the distinct aligned
// 32-byte sectors those bytes lie in: what a GPU's memory system moves for it. Warp
// accesses are grouped until the block's next barrier or its end, then added to the
// kernel's totals (by the name written at the launch).
#pragma once

#include <cstddef>
#include <cstdint>

namespace remat::emu {

// Provided by emu.cpp: the running CUDA thread (linear index in its block) and how many
// synchronisation points it has passed in this block; false outside a kernel's thread.
bool traffic_lane(unsigned* linear, uint64_t* syncs);

// Called by emu.cpp around each launch and at every point where all of a block's warp
// accesses so far are complete (a block barrier's release, the block's end).
void traffic_begin_launch(const char* kernel);
void traffic_flush();
void traffic_end_launch();
// Whether the launch running now is counted (read on every instrumented access).
extern bool g_traffic_counting;

// Called by the instrumentation's entry points (racecheck.cpp) for every load and store.
void traffic_access(const void* addr, size_t size, bool is_write, const void* pc);
// A translation unit with the instrumentation started (its constructor calls __tsan_init).
void traffic_note_instrumented_module();

}  // namespace remat::emu
