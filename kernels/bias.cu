#include "kernels/bias.cuh"
#include "kernels/launch.cuh"

#include <algorithm>

namespace remat::kernels {

namespace {

constexpr int kCols = 32;       // columns per block (threadIdx.x): coalesced row reads
constexpr int kRowGroups = 16;  // threadIdx.y: rows r = y, y + 16, y + 32, ...

// A block sums 32 columns: thread (x, y) sums rows y, y + 16, ... of column x in order,
// then the 16 partial sums of a column are added in y order.
__global__ void column_sums_kernel(const float* x, int64_t rows, int64_t cols, float* out, bool accumulate) {
  __shared__ float partial[kRowGroups][kCols + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kCols + threadIdx.x;
  float s = 0.0f;
  if (c < cols)
    for (int64_t r = threadIdx.y; r < rows; r += kRowGroups) s += x[r * cols + c];
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.0f;
    for (int g = 0; g < kRowGroups; ++g) total += partial[g][threadIdx.x];
    out[c] = accumulate ? out[c] + total : total;
  }
}

__global__ void bias_broadcast_kernel(const float* b, int64_t rows, int64_t cols, float* y) {
  const int64_t n = rows * cols, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = b[i % cols];
}

}  // namespace

void bias_broadcast(const float* b, int64_t rows, int64_t cols, float* y, cudaStream_t stream) {
  constexpr int kBlock = 256;
  const int64_t n = rows * cols;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div<int64_t>(n, kBlock), 4096));
  REMAT_LAUNCH(bias_broadcast_kernel, dim3(blocks), dim3(kBlock), 0, stream, b, rows, cols, y);
}

void column_sums(const float* x, int64_t rows, int64_t cols, float* out, bool accumulate, cudaStream_t stream) {
  if (cols == 0) return;
  const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(cols, kCols));
  REMAT_LAUNCH(column_sums_kernel, dim3(blocks), dim3(kCols, kRowGroups), 0, stream, x, rows, cols, out, accumulate);
}

}  // namespace remat::kernels
