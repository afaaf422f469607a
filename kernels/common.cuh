// Definitions shared by host and device code: the host/device qualifier and small helpers.
// This header compiles with nvcc, with a plain C++ compiler, and with a plain C++
// compiler on the CUDA emulator (REMAT_EMULATE: kernels/emu/emu.h).
#pragma once

#include <cstdint>

#if defined(REMAT_EMULATE)
#include "kernels/emu/emu.h"
#endif

#include "remat/hd.h"  // REMAT_HD, REMAT_INLINE

// Dynamic shared memory of a kernel, as a `T*` named `name` (16-byte aligned), sized by
// the launch's shared-memory argument. `extern __shared__` cannot be expressed in host
// C++, so kernels declare it with this macro: REMAT_DYNAMIC_SHARED(float, smem);
#if defined(__CUDACC__)
#define REMAT_DYNAMIC_SHARED(T, name)                                    \
  extern __shared__ __align__(16) unsigned char remat_dynamic_shared_[]; \
  T* name = reinterpret_cast<T*>(remat_dynamic_shared_)
#elif defined(REMAT_EMULATE)
#define REMAT_DYNAMIC_SHARED(T, name) T* name = static_cast<T*>(::remat::emu::dynamic_shared())
#endif

// Host functions of remat's CUDA code that take no cudaStream_t (whose type differs
// between the builds) get their own inline namespace in an emulated build, so an emulated
// and a CUDA build of the kernels and of the CUDA backend can be linked into one program.
#if defined(REMAT_EMULATE)
#define REMAT_KERNELS_ABI_BEGIN inline namespace emulated {
#define REMAT_KERNELS_ABI_END }
#else
#define REMAT_KERNELS_ABI_BEGIN
#define REMAT_KERNELS_ABI_END
#endif

namespace remat {

template <typename T>
REMAT_HD constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

}  // namespace remat
