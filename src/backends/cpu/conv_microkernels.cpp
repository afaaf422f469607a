// The CPU conv2d's SIMD code (conv_internal.h): the GEMM micro-kernels, tile[MR][NR] = (or
// +=) sum_k a(k, i) * b(k)[j], one FMA chain per element, k in order, in an AVX-512, an
// AVX2 and a portable version chosen at run time (all compute the same FMA chains, so they
// agree bit for bit); and the 8 x 8 transposes of the direct path.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define REMAT_CONV_X86 1
#endif

#include "backends/cpu/conv_internal.h"
#include "backends/cpu/simd.h"
#include "remat/error.h"

namespace remat::cpu_conv {

namespace {

template <class A, class B>
void tile_portable(int64_t kdim, const A& a, const B& b, float* tile, bool accumulate) {
  float acc[MR][NR];
  for (int64_t i = 0; i < MR; ++i)
    for (int64_t j = 0; j < NR; ++j) acc[i][j] = accumulate ? tile[i * NR + j] : 0.0f;
  for (int64_t k = 0; k < kdim; ++k) {
    const float* bk = b(k);
    for (int64_t i = 0; i < MR; ++i) {
      const float av = a(k, i);
      for (int64_t j = 0; j < NR; ++j) acc[i][j] = std::fma(av, bk[j], acc[i][j]);
    }
  }
  std::memcpy(tile, acc, sizeof(acc));
}

#ifdef REMAT_CONV_X86
template <class A, class B>
__attribute__((target("avx512f"))) void tile_avx512(int64_t kdim, const A& a, const B& b, float* tile,
                                                    bool accumulate) {
  __m512 acc[MR][2];
  for (int64_t i = 0; i < MR; ++i) {
    acc[i][0] = accumulate ? _mm512_loadu_ps(tile + i * NR) : _mm512_setzero_ps();
    acc[i][1] = accumulate ? _mm512_loadu_ps(tile + i * NR + 16) : _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < kdim; ++k) {
    const float* bk = b(k);
    const __m512 b0 = _mm512_loadu_ps(bk), b1 = _mm512_loadu_ps(bk + 16);
    for (int64_t i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(a(k, i));
      acc[i][0] = _mm512_fmadd_ps(av, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(av, b1, acc[i][1]);
    }
  }
  for (int64_t i = 0; i < MR; ++i) {
    _mm512_storeu_ps(tile + i * NR, acc[i][0]);
    _mm512_storeu_ps(tile + i * NR + 16, acc[i][1]);
  }
}

// 16 ymm registers: the tile in four 4 x 16 quarters (8 accumulators each).
template <class A, class B>
__attribute__((target("avx2,fma"))) void tile_avx2(int64_t kdim, const A& a, const B& b, float* tile, bool accumulate) {
  for (int64_t i0 = 0; i0 < MR; i0 += 4)
    for (int64_t j0 = 0; j0 < NR; j0 += 16) {
      __m256 acc[4][2];
      for (int64_t i = 0; i < 4; ++i) {
        float* t = tile + (i0 + i) * NR + j0;
        acc[i][0] = accumulate ? _mm256_loadu_ps(t) : _mm256_setzero_ps();
        acc[i][1] = accumulate ? _mm256_loadu_ps(t + 8) : _mm256_setzero_ps();
      }
      for (int64_t k = 0; k < kdim; ++k) {
        const float* bk = b(k) + j0;
        const __m256 b0 = _mm256_loadu_ps(bk), b1 = _mm256_loadu_ps(bk + 8);
        for (int64_t i = 0; i < 4; ++i) {
          const __m256 av = _mm256_set1_ps(a(k, i0 + i));
          acc[i][0] = _mm256_fmadd_ps(av, b0, acc[i][0]);
          acc[i][1] = _mm256_fmadd_ps(av, b1, acc[i][1]);
        }
      }
      for (int64_t i = 0; i < 4; ++i) {
        float* t = tile + (i0 + i) * NR + j0;
        _mm256_storeu_ps(t, acc[i][0]);
        _mm256_storeu_ps(t + 8, acc[i][1]);
      }
    }
}
#endif

const MicroKernels kPortable{"portable", &tile_portable<PackedA, PackedB>, &tile_portable<PackedA, OffsetB>,
                             &tile_portable<RowsA, PackedB>, &tile_portable<TableA, PackedB>};
#ifdef REMAT_CONV_X86
const MicroKernels kAvx512{"avx512", &tile_avx512<PackedA, PackedB>, &tile_avx512<PackedA, OffsetB>,
                           &tile_avx512<RowsA, PackedB>, &tile_avx512<TableA, PackedB>};
const MicroKernels kAvx2{"avx2", &tile_avx2<PackedA, PackedB>, &tile_avx2<PackedA, OffsetB>, &tile_avx2<RowsA, PackedB>,
                         &tile_avx2<TableA, PackedB>};
#endif

std::vector<const MicroKernels*> supported_kernels() {
  std::vector<const MicroKernels*> out;
#ifdef REMAT_CONV_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) out.push_back(&kAvx512);
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) out.push_back(&kAvx2);
#endif
  out.push_back(&kPortable);
  return out;
}

const MicroKernels* g_kernels = supported_kernels().front();

// dst[j * ds + i] = src[i * ss + j] (+ add[j] when add is given), for i, j < 8: copies, and
// the same float additions, whichever version runs.
void transpose8_portable(const float* src, int64_t ss, float* dst, int64_t ds, const float* add) {
  for (int64_t j = 0; j < 8; ++j)
    for (int64_t i = 0; i < 8; ++i) dst[j * ds + i] = add ? src[i * ss + j] + add[j] : src[i * ss + j];
}

#ifdef REMAT_CONV_X86
__attribute__((target("avx"))) void transpose8_avx(const float* src, int64_t ss, float* dst, int64_t ds,
                                                   const float* add) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * ss);
  for (int i = 0; i < 8; i += 2) {  // pairs of rows interleaved
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {  // then quads: each 128-bit lane holds 4 x 4 transposed
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {  // and the lanes of rows 0-3 with those of rows 4-7
    t[j] = _mm256_permute2f128_ps(r[j], r[j + 4], 0x20);
    t[j + 4] = _mm256_permute2f128_ps(r[j], r[j + 4], 0x31);
  }
  for (int j = 0; j < 8; ++j) {
    const __m256 v = add ? _mm256_add_ps(t[j], _mm256_set1_ps(add[j])) : t[j];
    _mm256_storeu_ps(dst + j * ds, v);
  }
}

#endif

}  // namespace

void transpose8(const float* src, int64_t ss, float* dst, int64_t ds, const float* add) {
#ifdef REMAT_CONV_X86
  if (cpu::simd() != cpu::Simd::baseline) return transpose8_avx(src, ss, dst, ds, add);
#endif
  transpose8_portable(src, ss, dst, ds, add);
}

const MicroKernels& micro_kernels() { return *g_kernels; }

std::vector<std::string> available_micro_kernels() {
  std::vector<std::string> out;
  for (const MicroKernels* k : supported_kernels()) out.emplace_back(k->name);
  return out;
}

std::string micro_kernel() { return g_kernels->name; }

void use_micro_kernel(const std::string& name) {
  for (const MicroKernels* k : supported_kernels())
    if (name == k->name) {
      g_kernels = k;
      return;
    }
  REMAT_THROW("conv2d: micro-kernel \"", name, "\" is unknown or not supported by this CPU");
}

}  // namespace remat::cpu_conv
