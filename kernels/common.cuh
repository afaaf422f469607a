// Definitions shared by host and device code: the host/device qualifier and small helpers.
// This header compiles with nvcc and with a plain C++ compiler.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define REMAT_HD __host__ __device__
#define REMAT_INLINE __forceinline__
#else
#define REMAT_HD
#define REMAT_INLINE inline
#endif

namespace remat {

template <typename T>
REMAT_HD constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

}  // namespace remat
