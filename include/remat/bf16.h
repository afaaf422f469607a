// bfloat16 (1 sign, 8 exponent, 7 mantissa bits: the upper half of an IEEE float) and its
// conversions, for host and device code alike (the CPU backend, CUDA kernels, the
// emulator), so that every backend rounds to the same bits.
//
// float -> bf16 rounds to nearest, ties to even, on the float's bit pattern; subnormals are
// kept (never flushed), values past the largest bf16 become infinity. A NaN stays a quiet
// NaN with its sign and the upper 7 bits of its payload (the quiet bit is set), which is
// what the AVX-512-BF16 instruction VCVTNEPS2BF16 gives; PyTorch's vectorised conversion
// writes 0xFFFF and its scalar one 0x7FC0 instead (both NaN too: tests compare NaN by class).
// bf16 -> float is exact.
#pragma once

#include <cstdint>
#include <cstring>

#include "remat/hd.h"

namespace remat {

REMAT_HD REMAT_INLINE uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

REMAT_HD REMAT_INLINE float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// The bf16 bits of a float, rounded to nearest even.
REMAT_HD REMAT_INLINE uint16_t bf16_from_float(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN: quiet
  // Adding 0x7fff plus the lowest kept bit carries into the kept bits exactly when the
  // dropped half is above the halfway point, or at it with the kept part odd.
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// The float of bf16 bits (exact).
REMAT_HD REMAT_INLINE float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// A float rounded to the nearest bf16 and back: what a value keeps when stored in bf16.
REMAT_HD REMAT_INLINE float round_to_bf16(float f) { return bf16_to_float(bf16_from_float(f)); }

}  // namespace remat
