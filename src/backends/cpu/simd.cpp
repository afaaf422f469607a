#include "backends/cpu/simd.h"

namespace remat::cpu {

namespace {

Simd& limit() {
  static Simd l = Simd::avx512;
  return l;
}

}  // namespace

Simd detected_simd() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const Simd d = __builtin_cpu_supports("avx512f") ? Simd::avx512
                        : __builtin_cpu_supports("avx2")  ? Simd::avx2
                                                          : Simd::baseline;
  return d;
#else
  return Simd::baseline;
#endif
}

Simd simd() {
  const Simd d = detected_simd();
  return static_cast<int>(d) < static_cast<int>(limit()) ? d : limit();
}

void set_simd_limit(Simd l) { limit() = l; }

const char* simd_name(Simd s) {
  switch (s) {
    case Simd::avx512: return "avx512";
    case Simd::avx2: return "avx2";
    default: return "baseline";
  }
}

}  // namespace remat::cpu
