// Test hooks into the CPU conv2d (conv.cpp): which GEMM micro-kernel runs, which way the
// GEMMs get their operands, and how many images a chunk holds. Process-wide and not
// thread-safe: for tests only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace remat::cpu_conv {

// The micro-kernels this CPU can run ("avx512", "avx2", "portable"), best first.
std::vector<std::string> available_micro_kernels();
// The micro-kernel in use (the best available unless changed).
std::string micro_kernel();
// Throws remat::Error for a name that is unknown or that this CPU cannot run.
void use_micro_kernel(const std::string& name);

// How the GEMMs get their operands: `automatic` (the default) chooses per GEMM from the
// shapes; the others force one way wherever it applies and im2col / col2im elsewhere:
// `im2col` everywhere, `implicit` (stride-1 GEMMs over the padded width), `direct`
// (tiles of output positions by channels; dx only for stride 1). The workspace queries
// follow the setting.
enum class Path { automatic, im2col, implicit, direct };
Path path();
void set_path(Path p);
const char* path_name(Path p);

// Images per chunk: 0 (the default) chooses from the shapes; n > 0 fixes chunks of n
// images (the last one partial), to test chunking on small shapes. The workspace queries
// follow the setting.
int64_t chunk_images();
void set_chunk_images(int64_t images);

}  // namespace remat::cpu_conv
