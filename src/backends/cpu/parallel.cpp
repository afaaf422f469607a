#include "backends/cpu/parallel.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backends/cpu/simd.h"

namespace remat::cpu {

namespace {

constexpr int64_t kLanes = 16;

double combine(double* acc) {
  for (int64_t width = kLanes; width > 1; width /= 2)
    for (int64_t i = 0; i < width / 2; ++i) acc[i] = acc[2 * i] + acc[2 * i + 1];
  return acc[0];
}

// term(j) of element j, added to partial sum j % 16; the portable versions.
template <class Term>
double lane_sum(int64_t n, int64_t from, double* acc, const Term& term) {
  for (int64_t j = from; j < n; ++j) acc[j % kLanes] += term(j);
  return combine(acc);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define REMAT_SUM_AVX512 1
// Eight floats widened to double (the zero-masking form: GCC 12 warns about the undefined
// pass-through of _mm512_cvtps_pd).
__attribute__((target("avx512f"))) inline __m512d widen(const float* p) {
  return _mm512_maskz_cvtps_pd(static_cast<__mmask8>(0xFF), _mm256_loadu_ps(p));
}

// The first n / 16 * 16 elements into acc[16], eight partial sums per register.
__attribute__((target("avx512f"))) void sum_avx512(const float* s, int64_t n, double* acc) {
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  for (int64_t j = 0; j + kLanes <= n; j += kLanes) {
    a0 = _mm512_add_pd(a0, widen(s + j));
    a1 = _mm512_add_pd(a1, widen(s + j + 8));
  }
  _mm512_storeu_pd(acc, a0);
  _mm512_storeu_pd(acc + 8, a1);
}

__attribute__((target("avx512f"))) void sum_sq_dev_avx512(const float* s, int64_t n, double mean, double* acc) {
  const __m512d m = _mm512_set1_pd(mean);
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  for (int64_t j = 0; j + kLanes <= n; j += kLanes) {
    const __m512d d0 = _mm512_sub_pd(widen(s + j), m);
    const __m512d d1 = _mm512_sub_pd(widen(s + j + 8), m);
    a0 = _mm512_add_pd(a0, _mm512_mul_pd(d0, d0));
    a1 = _mm512_add_pd(a1, _mm512_mul_pd(d1, d1));
  }
  _mm512_storeu_pd(acc, a0);
  _mm512_storeu_pd(acc + 8, a1);
}

__attribute__((target("avx512f"))) void sum_dev_dot_avx512(const float* x, const float* dy, int64_t n, double mean,
                                                           double* acc) {
  const __m512d m = _mm512_set1_pd(mean);
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  for (int64_t j = 0; j + kLanes <= n; j += kLanes) {
    const __m512d d0 = _mm512_sub_pd(widen(x + j), m);
    const __m512d d1 = _mm512_sub_pd(widen(x + j + 8), m);
    a0 = _mm512_add_pd(a0, _mm512_mul_pd(d0, widen(dy + j)));
    a1 = _mm512_add_pd(a1, _mm512_mul_pd(d1, widen(dy + j + 8)));
  }
  _mm512_storeu_pd(acc, a0);
  _mm512_storeu_pd(acc + 8, a1);
}
#endif

}  // namespace

double sum_f64(const float* s, int64_t n) {
  double acc[kLanes] = {};
  int64_t from = 0;
#ifdef REMAT_SUM_AVX512
  if (simd() == Simd::avx512) sum_avx512(s, n, acc), from = n / kLanes * kLanes;
#endif
  return lane_sum(n, from, acc, [&](int64_t j) { return static_cast<double>(s[j]); });
}

double sum_sq_dev_f64(const float* s, int64_t n, double mean) {
  double acc[kLanes] = {};
  int64_t from = 0;
#ifdef REMAT_SUM_AVX512
  if (simd() == Simd::avx512) sum_sq_dev_avx512(s, n, mean, acc), from = n / kLanes * kLanes;
#endif
  return lane_sum(n, from, acc, [&](int64_t j) {
    const double d = static_cast<double>(s[j]) - mean;
    return d * d;
  });
}

double sum_dev_dot_f64(const float* x, const float* dy, int64_t n, double mean) {
  double acc[kLanes] = {};
  int64_t from = 0;
#ifdef REMAT_SUM_AVX512
  if (simd() == Simd::avx512) sum_dev_dot_avx512(x, dy, n, mean, acc), from = n / kLanes * kLanes;
#endif
  return lane_sum(n, from, acc,
                  [&](int64_t j) { return (static_cast<double>(x[j]) - mean) * static_cast<double>(dy[j]); });
}

void column_sums(const float* x, int64_t rows, int64_t cols, float* out, bool accumulate) {
  constexpr int64_t kRowBlock = 256;
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  std::vector<float> partial(static_cast<size_t>(std::max<int64_t>(blocks, 1) * cols), 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    float* acc = partial.data() + blk * cols;
    const int64_t r1 = std::min(rows, (blk + 1) * kRowBlock);
    for (int64_t r = blk * kRowBlock; r < r1; ++r) {
      const float* row = x + r * cols;
      for (int64_t j = 0; j < cols; ++j) acc[j] += row[j];
    }
  }
  for (int64_t j = 0; j < cols; ++j) {
    float s = 0.0f;
    for (int64_t blk = 0; blk < blocks; ++blk) s += partial[static_cast<size_t>(blk * cols + j)];
    out[j] = accumulate ? out[j] + s : s;
  }
}

}  // namespace remat::cpu
