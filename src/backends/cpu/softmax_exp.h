// exp(x) for x <= 0, the exponentials of a softmax (x = s - max), in scalar, SSE2 and
// AVX-512 versions that perform the same float operations, so they agree bit for bit
// (the CPU backend is built without floating-point contraction). Shared by the
// materialised attention's softmax (attention.cpp) and the fused attention's online
// softmax (flash_attention.cpp).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace remat::cpu {

// exp(x) for the softmax's x = s - max <= 0, to 2.5e-7 relative: x = n ln2 + r with
// |r| <= ln2 / 2 (Cody-Waite split of ln2), a degree-6 Taylor polynomial for exp(r), and
// 2^n built in the exponent bits. x below -87.3 gives about 1e-38 instead of a denormal or
// 0 (nothing next to the row maximum's exp(0) = 1); NaN propagates. The scalar and SSE2
// versions perform the same float operations, so they agree bit for bit.
constexpr float kExpMin = -87.3f;
constexpr float kShifter = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693145751953125f;
constexpr float kLn2Lo = 1.42860682030941723e-6f;

inline float exp_nonpositive(float x) {
  x = kExpMin > x ? kExpMin : x;
  const float n = (x * kLog2e + kShifter) - kShifter;
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float q = 1.0f / 720.0f;
  q = q * r + 1.0f / 120.0f;
  q = q * r + 1.0f / 24.0f;
  q = q * r + 1.0f / 6.0f;
  q = q * r + 0.5f;
  q = q * r + 1.0f;
  q = q * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) * (1 << 23);
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return q * scale;
}

#if defined(__SSE2__)
inline __m128 exp_nonpositive4(__m128 x) {
  x = _mm_max_ps(_mm_set1_ps(kExpMin), x);  // returns x when x is NaN
  const __m128 shifter = _mm_set1_ps(kShifter);
  const __m128 n = _mm_sub_ps(_mm_add_ps(_mm_mul_ps(x, _mm_set1_ps(kLog2e)), shifter), shifter);
  const __m128 r = _mm_sub_ps(_mm_sub_ps(x, _mm_mul_ps(n, _mm_set1_ps(kLn2Hi))), _mm_mul_ps(n, _mm_set1_ps(kLn2Lo)));
  __m128 q = _mm_set1_ps(1.0f / 720.0f);
  q = _mm_add_ps(_mm_mul_ps(q, r), _mm_set1_ps(1.0f / 120.0f));
  q = _mm_add_ps(_mm_mul_ps(q, r), _mm_set1_ps(1.0f / 24.0f));
  q = _mm_add_ps(_mm_mul_ps(q, r), _mm_set1_ps(1.0f / 6.0f));
  q = _mm_add_ps(_mm_mul_ps(q, r), _mm_set1_ps(0.5f));
  q = _mm_add_ps(_mm_mul_ps(q, r), _mm_set1_ps(1.0f));
  q = _mm_add_ps(_mm_mul_ps(q, r), _mm_set1_ps(1.0f));
  const __m128i bits = _mm_slli_epi32(_mm_add_epi32(_mm_cvttps_epi32(n), _mm_set1_epi32(127)), 23);
  return _mm_mul_ps(q, _mm_castsi128_ps(bits));
}
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// (GCC 12's AVX-512 headers trip -W[maybe-]uninitialized on their own _mm512_undefined_*
// pass-through operands, GCC bug 105593.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
__attribute__((target("avx512f"))) inline __m512 exp_nonpositive16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(kExpMin), x);  // returns x when x is NaN
  const __m512 shifter = _mm512_set1_ps(kShifter);
  const __m512 n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), shifter), shifter);
  const __m512 r = _mm512_sub_ps(_mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(kLn2Hi))),
                                 _mm512_mul_ps(n, _mm512_set1_ps(kLn2Lo)));
  __m512 q = _mm512_set1_ps(1.0f / 720.0f);
  q = _mm512_add_ps(_mm512_mul_ps(q, r), _mm512_set1_ps(1.0f / 120.0f));
  q = _mm512_add_ps(_mm512_mul_ps(q, r), _mm512_set1_ps(1.0f / 24.0f));
  q = _mm512_add_ps(_mm512_mul_ps(q, r), _mm512_set1_ps(1.0f / 6.0f));
  q = _mm512_add_ps(_mm512_mul_ps(q, r), _mm512_set1_ps(0.5f));
  q = _mm512_add_ps(_mm512_mul_ps(q, r), _mm512_set1_ps(1.0f));
  q = _mm512_add_ps(_mm512_mul_ps(q, r), _mm512_set1_ps(1.0f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(q, _mm512_castsi512_ps(bits));
}
#pragma GCC diagnostic pop
#endif

}  // namespace remat::cpu
