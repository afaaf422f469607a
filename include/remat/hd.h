// The host/device qualifiers of code that compiles for the CPU and for CUDA alike (Philox,
// small helpers): __host__ __device__ under nvcc, nothing in a plain C++ compiler (the
// CPU backend, the CUDA emulator).
#pragma once

#if defined(__CUDACC__)
#define REMAT_HD __host__ __device__
#define REMAT_INLINE __forceinline__
#else
#define REMAT_HD
#define REMAT_INLINE inline
#endif
