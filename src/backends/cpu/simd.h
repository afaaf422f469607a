// The vector instructions the CPU kernels use beyond the x86-64 baseline (SSE2), chosen
// at run time from what the CPU supports. Every path computes bitwise what the baseline
// code computes: the same float operations element by element (the CPU kernels are built
// without floating-point contraction) and the same order in every sum; tests/ops compare
// the paths. Other architectures use the portable code.
#pragma once

namespace remat::cpu {

enum class Simd { baseline, avx2, avx512 };

// The level in use: the best the CPU supports, or lower after set_simd_limit.
Simd simd();
// The best level the CPU supports.
Simd detected_simd();
// Caps the level (baseline runs the portable code everywhere). Process-wide and not
// thread-safe: for tests only.
void set_simd_limit(Simd limit);
const char* simd_name(Simd s);

}  // namespace remat::cpu
