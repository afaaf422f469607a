#include "backends/cpu/philox_cpu.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define REMAT_PHILOX_X86 1
#endif

#include "backends/cpu/simd.h"

namespace remat::cpu {

namespace {

void philox_blocks_scalar(uint64_t seed, uint64_t b0, int64_t nblocks, uint32_t* words) {
  for (int64_t l = 0; l < nblocks; ++l) {
    const philox::Bits4 v = philox::block(seed, b0 + static_cast<uint64_t>(l));
    words[4 * l] = v.x;
    words[4 * l + 1] = v.y;
    words[4 * l + 2] = v.z;
    words[4 * l + 3] = v.w;
  }
}

// The counters of blocks b0 .. b0 + L - 1 (philox::counter), one per lane.
template <int L>
inline void counters(uint64_t b0, uint32_t* c0, uint32_t* c1, uint32_t* c2) {
  for (int l = 0; l < L; ++l) {
    const philox::Bits4 c = philox::counter(b0 + static_cast<uint64_t>(l));
    c0[l] = c.x;
    c1[l] = c.y;
    c2[l] = c.z;
  }
}

#ifdef REMAT_PHILOX_X86
// (GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_*
// pass-through operands, GCC bug 105593.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// (hi, lo) halves of the 64-bit products a * m, lane by lane.
__attribute__((target("avx2"))) inline void mulhilo8(const __m256i& a, const __m256i& m, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(a, m);                        // lanes 0, 2, 4, 6
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);  // lanes 1, 3, 5, 7
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

// The rounds of philox::philox4x32_10 on eight counters at once (one per 32-bit lane).
__attribute__((target("avx2"))) void philox_blocks_avx2(uint64_t seed, uint64_t b0, int64_t nblocks, uint32_t* words) {
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(philox::kM0));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(philox::kM1));
  int64_t l0 = 0;
  for (; l0 + 8 <= nblocks; l0 += 8) {
    alignas(32) uint32_t c0[8], c1[8], c2[8], out[4][8];
    counters<8>(b0 + static_cast<uint64_t>(l0), c0, c1, c2);
    __m256i x = _mm256_load_si256(reinterpret_cast<const __m256i*>(c0));
    __m256i y = _mm256_load_si256(reinterpret_cast<const __m256i*>(c1));
    __m256i z = _mm256_load_si256(reinterpret_cast<const __m256i*>(c2));
    __m256i w = _mm256_setzero_si256();
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int r = 0; r < 10; ++r) {
      __m256i hi0, lo0, hi1, lo1;
      mulhilo8(x, m0, hi0, lo0);
      mulhilo8(z, m1, hi1, lo1);
      x = _mm256_xor_si256(_mm256_xor_si256(hi1, y), _mm256_set1_epi32(static_cast<int>(k0)));
      z = _mm256_xor_si256(_mm256_xor_si256(hi0, w), _mm256_set1_epi32(static_cast<int>(k1)));
      y = lo1;
      w = lo0;
      k0 += philox::kW0;
      k1 += philox::kW1;
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(out[0]), x);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out[1]), y);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out[2]), z);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out[3]), w);
    for (int l = 0; l < 8; ++l)
      for (int c = 0; c < 4; ++c) words[4 * (l0 + l) + c] = out[c][l];
  }
  philox_blocks_scalar(seed, b0 + static_cast<uint64_t>(l0), nblocks - l0, words + 4 * l0);
}

__attribute__((target("avx512f"))) inline void mulhilo16(const __m512i& a, const __m512i& m, __m512i& hi, __m512i& lo) {
  const __m512i even = _mm512_mul_epu32(a, m);                        // lanes 0, 2, ..., 14
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);  // lanes 1, 3, ..., 15
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
  lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
}

// Sixteen 64-bit values (eight in lo, eight in hi) -> their low 32 bits, in order.
__attribute__((target("avx512f"))) inline __m512i narrow16(const __m512i& lo, const __m512i& hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(lo)), _mm512_cvtepi64_epi32(hi), 1);
}

// The same on sixteen counters at once. The counters are formed from two vectors of
// eight 64-bit block indices; the results are transposed in registers so that the four
// words of each block land next to each other.
__attribute__((target("avx512f"))) void philox_blocks_avx512(uint64_t seed, uint64_t b0, int64_t nblocks,
                                                             uint32_t* words) {
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(philox::kM0));
  const __m512i m1 = _mm512_set1_epi32(static_cast<int>(philox::kM1));
  const __m512i step_lo = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0),
                step_hi = _mm512_set_epi64(15, 14, 13, 12, 11, 10, 9, 8);
  const __m512i low16 = _mm512_set1_epi64(0xffff);
  int64_t l0 = 0;
  for (; l0 + 16 <= nblocks; l0 += 16) {
    const __m512i base = _mm512_set1_epi64(static_cast<long long>(b0 + static_cast<uint64_t>(l0)));
    const __m512i blo = _mm512_add_epi64(base, step_lo), bhi = _mm512_add_epi64(base, step_hi);
    __m512i x = narrow16(_mm512_srli_epi64(blo, 16), _mm512_srli_epi64(bhi, 16));
    __m512i y = narrow16(_mm512_srli_epi64(blo, 48), _mm512_srli_epi64(bhi, 48));
    __m512i z = narrow16(_mm512_and_si512(blo, low16), _mm512_and_si512(bhi, low16));
    __m512i w = _mm512_setzero_si512();
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int r = 0; r < 10; ++r) {
      __m512i hi0, lo0, hi1, lo1;
      mulhilo16(x, m0, hi0, lo0);
      mulhilo16(z, m1, hi1, lo1);
      x = _mm512_xor_si512(_mm512_xor_si512(hi1, y), _mm512_set1_epi32(static_cast<int>(k0)));
      z = _mm512_xor_si512(_mm512_xor_si512(hi0, w), _mm512_set1_epi32(static_cast<int>(k1)));
      y = lo1;
      w = lo0;
      k0 += philox::kW0;
      k1 += philox::kW1;
    }
    // Per 128-bit lane i (blocks 4i .. 4i+3): u_k holds block 4i+k's (x, y, z, w).
    const __m512i t0 = _mm512_unpacklo_epi32(x, y), t1 = _mm512_unpackhi_epi32(x, y);
    const __m512i t2 = _mm512_unpacklo_epi32(z, w), t3 = _mm512_unpackhi_epi32(z, w);
    const __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);
    const __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);
    // Output vector i: lane i of u0, u1, u2, u3 (a 4x4 transpose of 128-bit lanes).
    const __m512i v0 = _mm512_shuffle_i32x4(u0, u1, 0x44), v1 = _mm512_shuffle_i32x4(u2, u3, 0x44);
    const __m512i v2 = _mm512_shuffle_i32x4(u0, u1, 0xEE), v3 = _mm512_shuffle_i32x4(u2, u3, 0xEE);
    uint32_t* out = words + 4 * l0;
    _mm512_storeu_si512(out, _mm512_shuffle_i32x4(v0, v1, 0x88));
    _mm512_storeu_si512(out + 16, _mm512_shuffle_i32x4(v0, v1, 0xDD));
    _mm512_storeu_si512(out + 32, _mm512_shuffle_i32x4(v2, v3, 0x88));
    _mm512_storeu_si512(out + 48, _mm512_shuffle_i32x4(v2, v3, 0xDD));
  }
  philox_blocks_scalar(seed, b0 + static_cast<uint64_t>(l0), nblocks - l0, words + 4 * l0);
}

// dropout_factors' conversion, sixteen words at a time: u32 -> float is exact rounding
// either way, then the same multiply, add and compare as philox::uniform.
__attribute__((target("avx512f"))) void factors_avx512(const uint32_t* words, int64_t n, float keep_prob, float scale,
                                                       float* factor) {
  const __m512 lo = _mm512_set1_ps(2.3283064365386963e-10f), half = _mm512_set1_ps(1.1641532182693481e-10f);
  const __m512 kp = _mm512_set1_ps(keep_prob), s = _mm512_set1_ps(scale);
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    const __m512 u = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepu32_ps(_mm512_loadu_si512(words + k)), lo), half);
    _mm512_storeu_ps(factor + k, _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(u, kp, _CMP_LT_OQ), s));
  }
  for (; k < n; ++k) factor[k] = philox::uniform(words[k]) < keep_prob ? scale : 0.0f;
}

#pragma GCC diagnostic pop
#endif

}  // namespace

void dropout_factors(uint64_t seed, uint64_t w, int64_t n, float keep_prob, float scale, float* factor) {
  // Room for whole vectors of 16 blocks: the vector paths compute the last few blocks in
  // a full vector instead of one by one (short rows of causal attention are common).
  constexpr int64_t kMaxBlocks = (kDropoutChunk + 3 + 3) / 4;
  alignas(64) uint32_t words[4 * ((kMaxBlocks + 15) / 16 * 16)];
  const int64_t skip = static_cast<int64_t>(w & 3u);
  const int64_t nblocks = (skip + n + 3) / 4;
#ifdef REMAT_PHILOX_X86
  switch (simd()) {
    case Simd::avx512:
      philox_blocks_avx512(seed, w >> 2, (nblocks + 15) / 16 * 16, words);
      return factors_avx512(words + skip, n, keep_prob, scale, factor);
    case Simd::avx2: philox_blocks_avx2(seed, w >> 2, (nblocks + 7) / 8 * 8, words); break;
    default: philox_blocks_scalar(seed, w >> 2, nblocks, words);
  }
#else
  philox_blocks_scalar(seed, w >> 2, nblocks, words);
#endif
  for (int64_t k = 0; k < n; ++k) factor[k] = philox::uniform(words[skip + k]) < keep_prob ? scale : 0.0f;
}

void philox_blocks(uint64_t seed, uint64_t b0, int64_t nblocks, uint32_t* words) {
#ifdef REMAT_PHILOX_X86
  switch (simd()) {
    case Simd::avx512: return philox_blocks_avx512(seed, b0, nblocks, words);
    case Simd::avx2: return philox_blocks_avx2(seed, b0, nblocks, words);
    default: break;
  }
#endif
  philox_blocks_scalar(seed, b0, nblocks, words);
}

}  // namespace remat::cpu
