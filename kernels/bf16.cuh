// bf16 storage for the kernels (training.precision bf16, docs/memory.md): a float array a
// kernel reads or writes may be f32 or bf16 (__nv_bfloat16), and the kernel computes in
// fp32 whatever the storage, rounding to bf16 (round to nearest even, the CUDA intrinsic)
// where it stores a bf16 element. On the emulator <cuda_bf16.h> is kernels/emu/include's.
//
// Host side, a launcher takes its float arrays as FloatBuf (pointer + dtype) and calls
// with_types(f, bufs...), which calls f with each buffer as a typed pointer:
//   - every buffer f32:  float*  (the fp32 kernel, instruction for instruction as before);
//   - every buffer bf16: bf16*   (the bf16 kernel, vector loads of bf16);
//   - a mix:             DynPtr  (the dtype of each array checked per access, scalar).
// Absent (null) buffers take whichever type the others have. Device side, ld/st read and
// write element i of any of the three as a float.
#pragma once

#if !defined(REMAT_EMULATE)
#include <cuda_runtime.h>
#endif
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common.cuh"
#if defined(__CUDACC__) || defined(REMAT_EMULATE)
#include "kernels/vec4.cuh"  // load_unit, store_unit
#endif

namespace remat::kernels {

using bf16 = __nv_bfloat16;

// A float array of a launcher: device memory of f32 or bf16 elements.
struct FloatBuf {
  void* p = nullptr;
  bool bf16 = false;
};

// A float array whose element type is known at run time only (a launch whose arrays mix
// f32 and bf16).
struct DynPtr {
  void* p;
  bool h;  // bf16 elements
  __device__ REMAT_INLINE DynPtr operator+(int64_t i) const {
    return DynPtr{h ? static_cast<void*>(static_cast<bf16*>(p) + i) : static_cast<void*>(static_cast<float*>(p) + i),
                  h};
  }
  __device__ REMAT_INLINE explicit operator bool() const { return p != nullptr; }
};

__device__ REMAT_INLINE float to_f32(bf16 v) { return __bfloat162float(v); }

__device__ REMAT_INLINE float ld(const float* p, int64_t i) { return p[i]; }
__device__ REMAT_INLINE float ld(const bf16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ REMAT_INLINE float ld(DynPtr p, int64_t i) {
  return p.h ? __bfloat162float(static_cast<const bf16*>(p.p)[i]) : static_cast<const float*>(p.p)[i];
}
__device__ REMAT_INLINE void st(float* p, int64_t i, float v) { p[i] = v; }
__device__ REMAT_INLINE void st(bf16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
__device__ REMAT_INLINE void st(DynPtr p, int64_t i, float v) {
  if (p.h)
    static_cast<bf16*>(p.p)[i] = __float2bfloat16_rn(v);
  else
    static_cast<float*>(p.p)[i] = v;
}

// The value a float keeps when stored in bf16.
__device__ REMAT_INLINE float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// The vector helpers use device intrinsics: only for code nvcc or the emulator compiles
// (the CUDA backend's host sources, built by the host compiler, see FloatBuf only).
#if defined(__CUDACC__) || defined(REMAT_EMULATE)

// ---- Vector access to bf16: two per 32-bit word, the lower address in the low half ------

__device__ REMAT_INLINE float bf16_lo(unsigned int w) { return __uint_as_float(w << 16); }
__device__ REMAT_INLINE float bf16_hi(unsigned int w) { return __uint_as_float(w & 0xffff0000u); }
__device__ REMAT_INLINE unsigned int pack_bf16x2(float lo, float hi) {
  return static_cast<unsigned int>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (static_cast<unsigned int>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

// Eight bf16 (16 bytes; p 16-byte aligned): elements 8q .. 8q + 7.
__device__ REMAT_INLINE void load8(const bf16* p, int64_t q, float* v) {
  const uint4 u = load_unit(reinterpret_cast<const uint4*>(p) + q);
  v[0] = bf16_lo(u.x), v[1] = bf16_hi(u.x), v[2] = bf16_lo(u.y), v[3] = bf16_hi(u.y);
  v[4] = bf16_lo(u.z), v[5] = bf16_hi(u.z), v[6] = bf16_lo(u.w), v[7] = bf16_hi(u.w);
}
__device__ REMAT_INLINE void store8(bf16* p, int64_t q, const float* v) {
  store_unit(reinterpret_cast<uint4*>(p) + q, make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]),
                                                         pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7])));
}
// Four bf16 (8 bytes; p 8-byte aligned): elements 4q .. 4q + 3.
__device__ REMAT_INLINE void load4(const bf16* p, int64_t q, float* v) {
  const uint2 u = load_unit(reinterpret_cast<const uint2*>(p) + q);
  v[0] = bf16_lo(u.x), v[1] = bf16_hi(u.x), v[2] = bf16_lo(u.y), v[3] = bf16_hi(u.y);
}
__device__ REMAT_INLINE void store4(bf16* p, int64_t q, const float* v) {
  store_unit(reinterpret_cast<uint2*>(p) + q, make_uint2(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3])));
}

#endif  // defined(__CUDACC__) || defined(REMAT_EMULATE)

// ---- Host side ----------------------------------------------------------------------------

// Calls f with every buffer as float* (all f32), bf16* (all bf16) or DynPtr (a mix).
template <typename F, typename... B>
void with_types(F&& f, B... bufs) {
  const bool all_f32 = ((!bufs.p || !bufs.bf16) && ...);
  const bool all_bf16 = ((!bufs.p || bufs.bf16) && ...);
  if (all_f32)
    f(static_cast<float*>(bufs.p)...);
  else if (all_bf16)
    f(static_cast<bf16*>(bufs.p)...);
  else
    f(DynPtr{bufs.p, bufs.bf16}...);
}

// The element type of a typed pointer of with_types (DynPtr: none; vector paths skip it).
template <typename P>
constexpr bool is_f32_ptr = false;
template <>
constexpr bool is_f32_ptr<float*> = true;
template <>
constexpr bool is_f32_ptr<const float*> = true;
template <typename P>
constexpr bool is_bf16_ptr = false;
template <>
constexpr bool is_bf16_ptr<bf16*> = true;
template <>
constexpr bool is_bf16_ptr<const bf16*> = true;

}  // namespace remat::kernels
