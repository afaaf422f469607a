// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11),
// shared by every backend: the CPU ops, the CUDA kernels and the emulator all include
// this one header, so they draw the same bits.
//
// Stream layout. For a seed s, the random stream is a sequence of 32-bit words; word w is
// component w % 4 of philox4x32_10(counter(b), key(s)) with b = w / 4,
//   counter(b) = (b >> 16, b >> 48, b & 0xffff, 0)   (32-bit parts),   key(s) = (lo32(s), hi32(s)).
// For b < 2^48 this is exactly the stream of cuRAND's host generator
// CURAND_RNG_PSEUDO_PHILOX4_32_10 seeded with s, which the tests use as an oracle.
//
// A random op owns a range of the stream, RngState{seed, offset} (offset in words), and
// element i of its output uses word offset + i: the bits depend only on (seed, offset, i),
// never on the grid, block or thread count that computes them.
#pragma once

#include <cstdint>

#include "remat/hd.h"

namespace remat::philox {

struct Bits4 {
  uint32_t x, y, z, w;
};

constexpr uint32_t kM0 = 0xD2511F53u;
constexpr uint32_t kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u;  // key bump: golden ratio
constexpr uint32_t kW1 = 0xBB67AE85u;  // key bump: sqrt(3) - 1

REMAT_HD REMAT_INLINE void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

REMAT_HD REMAT_INLINE Bits4 round(Bits4 c, uint32_t k0, uint32_t k1) {
  uint32_t hi0, lo0, hi1, lo1;
  mulhilo(kM0, c.x, hi0, lo0);
  mulhilo(kM1, c.z, hi1, lo1);
  return Bits4{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
}

// Ten rounds; the key is bumped between rounds (nine bumps).
REMAT_HD REMAT_INLINE Bits4 philox4x32_10(Bits4 counter, uint32_t k0, uint32_t k1) {
#if defined(__CUDA_ARCH__)  // device pass only: the host compiler would warn
#pragma unroll
#endif
  for (int r = 0; r < 9; ++r) {
    counter = round(counter, k0, k1);
    k0 += kW0;
    k1 += kW1;
  }
  return round(counter, k0, k1);
}

// The counter of block b (the layout above; its last part is always 0). Vectorised code
// that runs the rounds itself (the CPU's SIMD dropout) forms counters with this too.
REMAT_HD REMAT_INLINE Bits4 counter(uint64_t b) {
  return Bits4{static_cast<uint32_t>(b >> 16), static_cast<uint32_t>(b >> 48), static_cast<uint32_t>(b & 0xffffu), 0u};
}

// The four words of block b (words 4b .. 4b+3) of seed's stream.
REMAT_HD REMAT_INLINE Bits4 block(uint64_t seed, uint64_t b) {
  return philox4x32_10(counter(b), static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

REMAT_HD REMAT_INLINE uint32_t component(const Bits4& v, unsigned i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Word w of seed's stream.
REMAT_HD REMAT_INLINE uint32_t word(uint64_t seed, uint64_t w) { return component(block(seed, w >> 2), w & 3u); }

// curand_uniform's conversion: x * 2^-32 + 2^-33 in float arithmetic, range (0, 1].
// The product is exact (a power-of-two scale), so fused or not, the result is the same.
REMAT_HD REMAT_INLINE float uniform(uint32_t x) {
  return static_cast<float>(x) * 2.3283064365386963e-10f + 1.1641532182693481e-10f;
}

// Dropout keep rule for element i of an op whose range starts at `offset`:
// kept when uniform(word) < keep_prob. keep_prob >= 1 keeps everything (p = 0: the
// uniform can be exactly 1.0f, which must not drop); keep_prob <= 0 keeps nothing.
REMAT_HD REMAT_INLINE bool keep(uint64_t seed, uint64_t offset, uint64_t i, float keep_prob) {
  if (keep_prob >= 1.0f) return true;
  if (keep_prob <= 0.0f) return false;
  return uniform(word(seed, offset + i)) < keep_prob;
}

}  // namespace remat::philox
