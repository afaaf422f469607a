// Bulk bf16 conversions of the CPU backend (include/remat/bf16.h gives the element rule):
// the portable loop, and an AVX-512-BF16 path (VCVTNEPS2BF16) chosen at run time when the
// CPU has it and the SIMD level (simd.h) is avx512. Both write the same bits: the
// instruction flushes subnormal inputs to zero, so those lanes are redone with the
// integer rounding of the portable code.
#pragma once

#include <cstdint>

namespace remat::cpu {

// Whether the CPU has AVX-512-BF16 (detected once).
bool detected_avx512_bf16();
// Whether the conversions below use it now (detected and the SIMD level is avx512).
bool use_avx512_bf16();

void f32_to_bf16(const float* x, uint16_t* y, int64_t n);
void bf16_to_f32(const uint16_t* x, float* y, int64_t n);
// The same, spread over the OpenMP threads for large n (the same bits: element by element).
// For whole blocks converted between parallel phases (attention's per-element staging).
void f32_to_bf16_parallel(const float* x, uint16_t* y, int64_t n);
void bf16_to_f32_parallel(const uint16_t* x, float* y, int64_t n);

// The portable loops, whatever the CPU (for tests).
void f32_to_bf16_portable(const float* x, uint16_t* y, int64_t n);
void bf16_to_f32_portable(const uint16_t* x, float* y, int64_t n);

}  // namespace remat::cpu
