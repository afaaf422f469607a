#include "kernels/bias.cuh"
#include "kernels/launch.cuh"

#include <algorithm>

namespace remat::kernels {

namespace {

constexpr int kCols = 32;       // columns per block (threadIdx.x): coalesced row reads
constexpr int kRowGroups = 16;  // threadIdx.y: rows r = y, y + 16, y + 32, ...

// Block (bx, by) sums 32 columns over the rows of chunk by, [by * chunk_rows, ...):
// thread (x, y) sums rows y, y + 16, ... of the chunk in order, then the 16 partial sums
// of a column are added in y order. One chunk: the column's total (out, accumulate);
// several: the chunk's sum goes to partials[by * cols + c] for the second pass.
template <typename PX>
__global__ void column_sums_kernel(PX x, int64_t rows, int64_t cols, int64_t chunk_rows, float* out, bool accumulate,
                                   float* partials) {
  __shared__ float partial[kRowGroups][kCols + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kCols + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk_rows,
                r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  float s = 0.0f;
  if (c < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowGroups) s += ld(x, r * cols + c);
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.0f;
    for (int g = 0; g < kRowGroups; ++g) total += partial[g][threadIdx.x];
    if (gridDim.y == 1)
      out[c] = accumulate ? out[c] + total : total;
    else
      partials[blockIdx.y * cols + c] = total;
  }
}

// The second pass: out[c] (+)= the chunks' sums of column c, added in chunk order.
__global__ void add_chunk_sums_kernel(const float* partials, int64_t chunks, int64_t cols, float* out,
                                      bool accumulate) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float total = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) total += partials[k * cols + c];
  out[c] = accumulate ? out[c] + total : total;
}

template <typename PB, typename PY>
__global__ void bias_broadcast_kernel(PB b, int64_t rows, int64_t cols, PY y) {
  const int64_t n = rows * cols, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    st(y, i, ld(b, i % cols));
}

}  // namespace

void bias_broadcast(FloatBuf b, int64_t rows, int64_t cols, FloatBuf y, cudaStream_t stream) {
  constexpr int kBlock = 256;
  const int64_t n = rows * cols;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div<int64_t>(n, kBlock), 4096));
  with_types(
      [&](auto pb, auto py) {
        REMAT_LAUNCH((bias_broadcast_kernel<decltype(pb), decltype(py)>), dim3(blocks), dim3(kBlock), 0, stream, pb,
                     rows, cols, py);
      },
      b, y);
}

void column_sums(FloatBuf x, int64_t rows, int64_t cols, float* out, bool accumulate, float* partials,
                 size_t partial_bytes, cudaStream_t stream) {
  if (cols == 0) return;
  const int64_t col_blocks = ceil_div<int64_t>(cols, kCols);
  int64_t chunks = column_sum_chunks(rows, cols, partials ? partial_bytes : 0);
  const int64_t chunk_rows = std::max<int64_t>(ceil_div<int64_t>(rows, chunks), 1);
  chunks = std::max<int64_t>(ceil_div<int64_t>(rows, chunk_rows), 1);  // no empty chunk
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(chunks));
  with_types(
      [&](auto px) {
        REMAT_LAUNCH(column_sums_kernel<decltype(px)>, grid, dim3(kCols, kRowGroups), 0, stream, px, rows, cols,
                     chunk_rows, out, accumulate, partials);
      },
      x);
  if (chunks > 1) {
    constexpr int kBlock = 256;
    REMAT_LAUNCH(add_chunk_sums_kernel, dim3(static_cast<unsigned>(ceil_div<int64_t>(cols, kBlock))), dim3(kBlock), 0,
                 stream, partials, chunks, cols, out, accumulate);
  }
}

}  // namespace remat::kernels
