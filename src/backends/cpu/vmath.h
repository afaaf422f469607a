// Branch-free float math written so that GCC vectorises loops calling it (no libm calls,
// selects instead of branches). Same code on every thread and chunk, so results do not
// depend on the thread count.
//   exp:  Cody-Waite range reduction + degree-6 polynomial, max relative error ~2 ulp;
//         arguments are clamped to [-87.3, 88.3] (callers never need more), NaN propagates
//   tanh: 1 - 2 / (exp(2x) + 1), absolute error < 2e-7
//   erf:  Abramowitz & Stegun 7.1.26 (with the exp above), absolute error < 2e-7
#pragma once

#include <cstdint>
#include <cstring>

namespace remat::cpu {

inline float vexp(float x) {
  const float in = x;
  x = x != x ? 0.0f : x;        // NaN: computed on 0, returned as NaN below (no UB on the way)
  x = x < -87.3f ? -87.3f : x;  // plain selects: GCC if-converts them
  x = x > 88.3f ? 88.3f : x;    // keeps 2^n normal: n in [-126, 127]
  // Round to nearest with the 1.5 * 2^23 trick (SSE2 has no vector floor).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;  // ln2 split in two for an exact product
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  const float y = p * scale;
  return in != in ? in : y;
}

inline float vtanh(float x) { return 1.0f - 2.0f / (vexp(2.0f * x) + 1.0f); }

inline float verf(float x) {
  const float a = __builtin_fabsf(x);
  const float t = 1.0f / (1.0f + 0.3275911f * a);
  const float poly =
      t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  const float y = 1.0f - poly * vexp(-a * a);
  return __builtin_copysignf(y, x);
}

}  // namespace remat::cpu
