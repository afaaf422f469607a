// Deterministic parallel loops for the CPU backend.
//
// Work is split into fixed-size chunks that depend only on the problem size, never on
// the thread count, and every reduction combines its partial results in chunk order:
// outputs are bitwise identical with any number of threads.
#pragma once

#include <omp.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace remat::cpu {

// The one parallel threshold of the CPU backend: a loop runs on the thread pool once it
// does at least this much work (elements, or multiply-adds); below it, waking the pool
// costs more than it saves. Also the chunk size of the pointwise loops. Results never
// depend on it: every loop splits its work by problem size alone (above).
constexpr int64_t kParallelMinWork = int64_t{1} << 14;

// Calls fn(begin, end) over [0, n) in chunks of `grain`, in parallel.
template <typename Fn>
void parallel_for(int64_t n, int64_t grain, const Fn& fn) {
  if (n <= 0) return;
  const int64_t chunks = (n + grain - 1) / grain;
  if (chunks == 1) {
    fn(int64_t{0}, n);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = c * grain, e = b + grain < n ? b + grain : n;
    fn(b, e);
  }
}

// out[j] (+)= sum over rows r of x[r * cols + j], summed in a fixed order: rows are taken
// in blocks of kRowBlock, each block's partial sums are computed in parallel, then added
// in block order.
void column_sums(const float* x, int64_t rows, int64_t cols, float* out, bool accumulate);

// Sums in double over n floats, with 16 partial sums: element j goes to partial sum
// j % 16, in order of j, and the partial sums are combined pairwise ((0 + 1) + (2 + 3))
// + ...: the same bits on every machine, whether the AVX-512 version (checked at run
// time) or the portable one runs.
double sum_f64(const float* s, int64_t n);                                        // sum of s
double sum_sq_dev_f64(const float* s, int64_t n, double mean);                    // sum of (s - mean)^2
double sum_dev_dot_f64(const float* x, const float* dy, int64_t n, double mean);  // sum of (x - mean) * dy

// Sum of f(i) over [0, n) in double, chunked (fixed chunk size) and combined in order.
template <typename F>
double chunked_sum(int64_t n, const F& f) {
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks > 0 ? chunks : 0), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0.0;
    const int64_t e = (c + 1) * kChunk < n ? (c + 1) * kChunk : n;
    for (int64_t i = c * kChunk; i < e; ++i) s += f(i);
    partial[static_cast<size_t>(c)] = s;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace remat::cpu
