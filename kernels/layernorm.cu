#include "kernels/layernorm.cuh"

#include <math.h>

#include <algorithm>

#include "kernels/launch.cuh"
#include "kernels/rows.cuh"

namespace remat::kernels {

namespace {

using rows::Group;
using rows::Pack;

// ---- kernels -----------------------------------------------------------------------------

template <int kThreads, bool kVec, typename PX, typename PG, typename PB, typename PY>
__global__ void layernorm_forward_kernel(PX x, PG gamma, PB beta, int64_t rows, int64_t c, float eps, PY y, float* mean,
                                         float* rstd) {
  using P = Pack<kVec>;
  using G = Group<kThreads>;
  __shared__ double shared[G::kWarps];
  const int64_t first = int64_t{G::lane()} * P::kWidth, step = int64_t{kThreads} * P::kWidth;
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    const auto xr = x + r * c;
    // Two passes in double, as the CPU: the variance never goes negative.
    double s = 0.0;
    for (int64_t j = first; j < c; j += step) {
      const P v = P::load(xr + j);
      for (int k = 0; k < P::kWidth; ++k) s += v.v[k];
    }
    const double mu = G::sum(s, shared) / static_cast<double>(c);
    double ss = 0.0;
    for (int64_t j = first; j < c; j += step) {
      const P v = P::load(xr + j);
      for (int k = 0; k < P::kWidth; ++k) {
        const double d = v.v[k] - mu;
        ss += d * d;
      }
    }
    const double var = G::sum(ss, shared) / static_cast<double>(c);
    const float m = static_cast<float>(mu);
    const float rs = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
    if (G::lane() == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
    const auto yr = y + r * c;
    for (int64_t j = first; j < c; j += step) {
      P v = P::load(xr + j);
      const P g = P::load(gamma + j), b = P::load(beta + j);
      for (int k = 0; k < P::kWidth; ++k) v.v[k] = (v.v[k] - m) * rs * g.v[k] + b.v[k];
      v.store(yr + j);
    }
  }
}

template <int kThreads, bool kVec, typename PDY, typename PX, typename PG, typename PDX>
__global__ void layernorm_backward_dx_kernel(PDY dy, PX x, PG gamma, const float* mean, const float* rstd, int64_t rows,
                                             int64_t c, PDX dx) {
  using P = Pack<kVec>;
  using G = Group<kThreads>;
  __shared__ double shared[G::kWarps];
  const int64_t first = int64_t{G::lane()} * P::kWidth, step = int64_t{kThreads} * P::kWidth;
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    const auto xr = x + r * c;
    const auto dyr = dy + r * c;
    const float m = mean[r], rs = rstd[r];
    double sum_g = 0.0, sum_gx = 0.0;  // g = dy * gamma
    for (int64_t j = first; j < c; j += step) {
      const P xv = P::load(xr + j), d = P::load(dyr + j), w = P::load(gamma + j);
      for (int k = 0; k < P::kWidth; ++k) {
        const float g = d.v[k] * w.v[k];
        const float xhat = (xv.v[k] - m) * rs;
        sum_g += g;
        sum_gx += static_cast<double>(g) * xhat;
      }
    }
    const float mean_g = static_cast<float>(G::sum(sum_g, shared) / static_cast<double>(c));
    const float mean_gx = static_cast<float>(G::sum(sum_gx, shared) / static_cast<double>(c));
    const auto dxr = dx + r * c;
    for (int64_t j = first; j < c; j += step) {
      const P xv = P::load(xr + j), w = P::load(gamma + j);
      P d = P::load(dyr + j);
      for (int k = 0; k < P::kWidth; ++k) {
        const float xhat = (xv.v[k] - m) * rs;
        d.v[k] = rs * (d.v[k] * w.v[k] - mean_g - xhat * mean_gx);
      }
      d.store(dxr + j);
    }
  }
}

// dgamma and dbeta: a block sums kColumns columns over one chunk of rows. Thread (x, y)
// sums rows y, y + kRowGroups, ... of the chunk in order (each warp reads 32 consecutive
// floats of a row); then the kRowGroups partial sums of a column are added in y order.
// With one chunk the block adds its sums to dgamma/dbeta; otherwise it stores them to
// partial[chunk][0 or 1][column] for layernorm_param_grads_finish.
constexpr int kColumns = 32;
constexpr int kRowGroups = 16;

template <typename PDY, typename PX>
__global__ void layernorm_param_grads_kernel(PDY dy, PX x, const float* mean, const float* rstd, int64_t rows,
                                             int64_t c, int64_t chunk_rows, float* dgamma, float* dbeta,
                                             double* partial) {
  __shared__ double sum_g[kRowGroups][kColumns + 1];
  __shared__ double sum_b[kRowGroups][kColumns + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  double acc_g = 0.0, acc_b = 0.0;
  if (col < c) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowGroups) {
      const float d = ld(dy, r * c + col);
      const float xhat = (ld(x, r * c + col) - mean[r]) * rstd[r];
      acc_g += static_cast<double>(d) * xhat;
      acc_b += d;
    }
  }
  sum_g[threadIdx.y][threadIdx.x] = acc_g;
  sum_b[threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y != 0 || col >= c) return;
  double tg = 0.0, tb = 0.0;
  for (int g = 0; g < kRowGroups; ++g) {
    tg += sum_g[g][threadIdx.x];
    tb += sum_b[g][threadIdx.x];
  }
  if (gridDim.y == 1) {
    if (dgamma) dgamma[col] += static_cast<float>(tg);
    if (dbeta) dbeta[col] += static_cast<float>(tb);
  } else {
    double* chunk = partial + static_cast<int64_t>(blockIdx.y) * 2 * c;
    chunk[col] = tg;
    chunk[c + col] = tb;
  }
}

// Adds the chunks' sums of each column in chunk order.
__global__ void layernorm_param_grads_finish_kernel(const double* partial, int64_t chunks, int64_t c, float* dgamma,
                                                    float* dbeta) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; col < c; col += stride) {
    double tg = 0.0, tb = 0.0;
    for (int64_t k = 0; k < chunks; ++k) {
      tg += partial[k * 2 * c + col];
      tb += partial[k * 2 * c + c + col];
    }
    if (dgamma) dgamma[col] += static_cast<float>(tg);
    if (dbeta) dbeta[col] += static_cast<float>(tb);
  }
}

}  // namespace

// ---- launchers ---------------------------------------------------------------------------

void layernorm_forward(FloatBuf x, FloatBuf gamma, FloatBuf beta, int64_t rows, int64_t c, float eps, FloatBuf y,
                       float* mean, float* rstd, cudaStream_t stream) {
  if (rows == 0) return;
  const bool vec = rows::can_vectorise_bufs(c, x, gamma, beta, y);
  with_types(
      [&](auto px, auto pg, auto pb, auto py) {
        REMAT_LAUNCH_ROWS_T(layernorm_forward_kernel, (decltype(px), decltype(pg), decltype(pb), decltype(py)), rows, c,
                            vec, stream, px, pg, pb, rows, c, eps, py, mean, rstd);
      },
      x, gamma, beta, y);
}

void layernorm_param_grads(FloatBuf dy, FloatBuf x, const float* mean, const float* rstd, int64_t rows, int64_t c,
                           float* dgamma, float* dbeta, double* partial, cudaStream_t stream) {
  if (rows == 0 || c == 0 || (!dgamma && !dbeta)) return;
  const int64_t chunks = layernorm_param_grad_chunks(rows, c);
  const int64_t chunk_rows = ceil_div<int64_t>(rows, chunks);
  const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(c, kColumns)), static_cast<unsigned>(chunks));
  with_types(
      [&](auto pdy, auto px) {
        REMAT_LAUNCH((layernorm_param_grads_kernel<decltype(pdy), decltype(px)>), grid, dim3(kColumns, kRowGroups), 0,
                     stream, pdy, px, mean, rstd, rows, c, chunk_rows, dgamma, dbeta, partial);
      },
      dy, x);
  if (chunks > 1) {
    constexpr int kBlock = 256;
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div<int64_t>(c, kBlock), 4096));
    REMAT_LAUNCH(layernorm_param_grads_finish_kernel, dim3(blocks), dim3(kBlock), 0, stream, partial, chunks, c, dgamma,
                 dbeta);
  }
}

void layernorm_backward_dx(FloatBuf dy, FloatBuf x, FloatBuf gamma, const float* mean, const float* rstd, int64_t rows,
                           int64_t c, FloatBuf dx, cudaStream_t stream) {
  if (rows == 0) return;
  const bool vec = rows::can_vectorise_bufs(c, dy, x, gamma, dx);
  with_types(
      [&](auto pdy, auto px, auto pg, auto pdx) {
        REMAT_LAUNCH_ROWS_T(layernorm_backward_dx_kernel, (decltype(pdy), decltype(px), decltype(pg), decltype(pdx)),
                            rows, c, vec, stream, pdy, px, pg, mean, rstd, rows, c, pdx);
      },
      dy, x, gamma, dx);
}

}  // namespace remat::kernels
