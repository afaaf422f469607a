// Stands in for CUDA's <cuda_bf16.h> in an emulated build (this folder comes first on the
// include path of emulated targets): the bfloat16 types and the conversions remat's
// kernels use, with the results of the CUDA intrinsics on an sm_80+ GPU.
//
// __float2bfloat16_rn (and __float2bfloat16, the same conversion) is PTX cvt.rn.bf16.f32:
// round to nearest, ties to even, on the float's bit pattern; subnormals kept (no .ftz),
// overflow to infinity; any NaN becomes the canonical NaN 0x7FFF (CUDA's own host
// fallback in cuda_bf16.hpp does the same). That is include/remat/bf16.h's rounding but
// for NaN, whose payload remat's host conversion keeps (both are NaN; tests compare NaN
// by class). bf16 -> float is exact (the bits shifted up by 16).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/emu/emu.h"

struct __nv_bfloat16_raw {
  unsigned short x;
};

struct __nv_bfloat162_raw {
  unsigned short x, y;
};

// As in CUDA: 2 bytes, 2-aligned, trivially constructible (so it can live in shared memory
// and in device buffers as raw bits).
struct __attribute__((aligned(2))) __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  constexpr __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}
  constexpr operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
};

struct __attribute__((aligned(4))) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

static_assert(sizeof(__nv_bfloat16) == 2 && alignof(__nv_bfloat16) == 2, "__nv_bfloat16 as in CUDA");
static_assert(sizeof(__nv_bfloat162) == 4 && alignof(__nv_bfloat162) == 4, "__nv_bfloat162 as in CUDA");

inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16(__nv_bfloat16_raw{u}); }

// cvt.rn.bf16.f32.
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  const unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __ushort_as_bfloat16(0x7fffu);
  // The dropped low half rounds up when above the halfway point, or at it with the kept
  // part odd: adding 0x7fff plus the kept part's lowest bit carries exactly then.
  return __ushort_as_bfloat16(static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16));
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }

inline float __bfloat162float(__nv_bfloat16 h) { return __uint_as_float(static_cast<unsigned int>(h.__x) << 16); }
inline float __low2float(__nv_bfloat162 h) { return __bfloat162float(h.x); }
inline float __high2float(__nv_bfloat162 h) { return __bfloat162float(h.y); }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return make_float2(__low2float(h), __high2float(h)); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return __floats2bfloat162_rn(f.x, f.y); }
