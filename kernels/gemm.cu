#include "kernels/gemm.cuh"

#include <math.h>

#include <algorithm>

#include "kernels/launch.cuh"

namespace remat::kernels {

namespace {

constexpr int kTile = 16;
constexpr int64_t kMaxGridY = 65535, kMaxGridZ = 65535;

struct GemmShape {
  int64_t m, n, k, lda, sa, ldb, sb, ldc, sc, batch;
  bool ta, tb;
  float alpha, beta;
};

// Block (x, y) of batch z: outputs rows blockIdx.y * 16 + threadIdx.y, columns
// blockIdx.x * 16 + threadIdx.x. The k loop goes tile by tile, each thread adding its
// row's and column's products in k order. Row and column tiles and the batch go
// grid-stride when the grid is capped.
template <typename PA, typename PB, typename PC>
__global__ void gemm_fma_kernel(PA a, PB b, PC c, GemmShape s) {
  __shared__ float as[kTile][kTile + 1];  // as[row][p] = op(a)[row][k0 + p]
  __shared__ float bs[kTile][kTile + 1];  // bs[p][col] = op(b)[k0 + p][col]
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  for (int64_t z = blockIdx.z; z < s.batch; z += gridDim.z) {
    const auto az = a + z * s.sa;
    const auto bz = b + z * s.sb;
    const auto cz = c + z * s.sc;
    for (int64_t i0 = static_cast<int64_t>(blockIdx.y) * kTile; i0 < s.m; i0 += static_cast<int64_t>(gridDim.y) * kTile)
      for (int64_t j0 = static_cast<int64_t>(blockIdx.x) * kTile; j0 < s.n;
           j0 += static_cast<int64_t>(gridDim.x) * kTile) {
        const int64_t i = i0 + ty, j = j0 + tx;
        float acc = 0.0f;
        for (int64_t k0 = 0; k0 < s.k; k0 += kTile) {
          // Thread (tx, ty) loads op(a)[i0 + ty][k0 + tx] and op(b)[k0 + ty][j0 + tx].
          const int64_t ka = k0 + tx, kb = k0 + ty;
          as[ty][tx] = i < s.m && ka < s.k ? ld(az, s.ta ? ka * s.lda + i : i * s.lda + ka) : 0.0f;
          bs[ty][tx] = kb < s.k && j < s.n ? ld(bz, s.tb ? j * s.ldb + kb : kb * s.ldb + j) : 0.0f;
          __syncthreads();
          const int64_t depth = s.k - k0 < kTile ? s.k - k0 : kTile;
          for (int p = 0; p < depth; ++p) acc = fmaf(as[ty][p], bs[p][tx], acc);
          __syncthreads();
        }
        if (i < s.m && j < s.n) {
          const int64_t at = i * s.ldc + j;
          const float v = s.beta == 0.0f ? s.alpha * acc : s.alpha * acc + s.beta * ld(cz, at);
          st(cz, at, v);
        }
      }
  }
}

}  // namespace

void gemm_fma(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, FloatBuf a, int64_t lda, int64_t sa,
              FloatBuf b, int64_t ldb, int64_t sb, float beta, FloatBuf c, int64_t ldc, int64_t sc, int64_t batch,
              cudaStream_t stream) {
  if (m == 0 || n == 0 || batch == 0) return;
  const GemmShape s{m, n, k, lda, sa, ldb, sb, ldc, sc, batch, ta, tb, alpha, beta};
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(ceil_div<int64_t>(n, kTile), 4096)),
                  static_cast<unsigned>(std::min<int64_t>(ceil_div<int64_t>(m, kTile), kMaxGridY)),
                  static_cast<unsigned>(std::min<int64_t>(batch, kMaxGridZ)));
  with_types(
      [&](auto pa, auto pb, auto pc) {
        REMAT_LAUNCH((gemm_fma_kernel<decltype(pa), decltype(pb), decltype(pc)>), grid, dim3(kTile, kTile), 0, stream,
                     pa, pb, pc, s);
      },
      a, b, c);
}

}  // namespace remat::kernels
