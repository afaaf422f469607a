#include "backends/cpu/bf16.h"

#include "backends/cpu/parallel.h"
#include "backends/cpu/simd.h"
#include "remat/bf16.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define REMAT_X86 1
#endif

namespace remat::cpu {

void f32_to_bf16_portable(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_from_float(x[i]);
}

void bf16_to_f32_portable(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_float(x[i]);
}

#if defined(REMAT_X86)
// GCC 12 reports the intrinsics' deliberately undefined start values (_mm512_undefined_*)
// as maybe uninitialised.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace {

__attribute__((target("avx512f,avx512bf16"))) void f32_to_bf16_avx512(const float* x, uint16_t* y, int64_t n) {
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000), man_mask = _mm512_set1_epi32(0x007fffff);
  const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    __m256i h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
    const __m512i u = _mm512_castps_si512(v);
    // Subnormal lanes (exponent 0, mantissa not 0): the instruction gave a signed zero.
    const __mmask16 sub = _mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(u, exp_mask), u, man_mask);
    if (sub) {
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
      const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, bias), lsb), 16);
      const __m512i wide = _mm512_mask_blend_epi32(sub, _mm512_cvtepu16_epi32(h), r);
      h = _mm512_cvtepi32_epi16(wide);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), h);
  }
  f32_to_bf16_portable(x + i, y + i, n - i);
}

__attribute__((target("avx512f"))) void bf16_to_f32_avx512(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)));
    _mm512_storeu_si512(y + i, _mm512_slli_epi32(w, 16));
  }
  bf16_to_f32_portable(x + i, y + i, n - i);
}

}  // namespace
#pragma GCC diagnostic pop
#endif

bool detected_avx512_bf16() {
#if defined(REMAT_X86)
  static const bool d = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  return d;
#else
  return false;
#endif
}

bool use_avx512_bf16() { return detected_avx512_bf16() && simd() == Simd::avx512; }

void f32_to_bf16(const float* x, uint16_t* y, int64_t n) {
#if defined(REMAT_X86)
  if (use_avx512_bf16()) return f32_to_bf16_avx512(x, y, n);
#endif
  f32_to_bf16_portable(x, y, n);
}

void bf16_to_f32(const uint16_t* x, float* y, int64_t n) {
#if defined(REMAT_X86)
  if (simd() == Simd::avx512) return bf16_to_f32_avx512(x, y, n);
#endif
  bf16_to_f32_portable(x, y, n);
}

void f32_to_bf16_parallel(const float* x, uint16_t* y, int64_t n) {
  parallel_for(n, kParallelMinWork, [&](int64_t a, int64_t b) { f32_to_bf16(x + a, y + a, b - a); });
}

void bf16_to_f32_parallel(const uint16_t* x, float* y, int64_t n) {
  parallel_for(n, kParallelMinWork, [&](int64_t a, int64_t b) { bf16_to_f32(x + a, y + a, b - a); });
}

}  // namespace remat::cpu
