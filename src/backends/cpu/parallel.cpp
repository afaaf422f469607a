#include "backends/cpu/parallel.h"

#include <algorithm>

namespace remat::cpu {

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
