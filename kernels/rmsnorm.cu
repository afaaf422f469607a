#include "kernels/rmsnorm.cuh"

#include <math.h>

#include <algorithm>

#include "kernels/launch.cuh"
#include "kernels/rows.cuh"

namespace remat::kernels {

namespace {

using rows::Group;
using rows::Pack;

// ---- kernels -----------------------------------------------------------------------------

template <int kThreads, bool kVec, typename PX, typename PG, typename PY>
__global__ void rmsnorm_forward_kernel(PX x, PG gamma, int64_t rows, int64_t c, float eps, PY y, float* rstd) {
  using P = Pack<kVec>;
  using G = Group<kThreads>;
  __shared__ double shared[G::kWarps];
  const int64_t first = int64_t{G::lane()} * P::kWidth, step = int64_t{kThreads} * P::kWidth;
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    const auto xr = x + r * c;
    double ss = 0.0;
    for (int64_t j = first; j < c; j += step) {
      const P v = P::load(xr + j);
      for (int k = 0; k < P::kWidth; ++k) ss += static_cast<double>(v.v[k]) * v.v[k];
    }
    const double ms = G::sum(ss, shared) / static_cast<double>(c);
    const float rs = static_cast<float>(1.0 / sqrt(ms + static_cast<double>(eps)));
    if (G::lane() == 0) rstd[r] = rs;
    const auto yr = y + r * c;
    for (int64_t j = first; j < c; j += step) {
      P v = P::load(xr + j);
      const P g = P::load(gamma + j);
      for (int k = 0; k < P::kWidth; ++k) v.v[k] = v.v[k] * rs * g.v[k];
      v.store(yr + j);
    }
  }
}

template <int kThreads, bool kVec, typename PDY, typename PX, typename PG, typename PDX>
__global__ void rmsnorm_backward_dx_kernel(PDY dy, PX x, PG gamma, const float* rstd, int64_t rows, int64_t c, PDX dx) {
  using P = Pack<kVec>;
  using G = Group<kThreads>;
  __shared__ double shared[G::kWarps];
  const int64_t first = int64_t{G::lane()} * P::kWidth, step = int64_t{kThreads} * P::kWidth;
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    const auto xr = x + r * c;
    const auto dyr = dy + r * c;
    const float rs = rstd[r];
    double sum_gx = 0.0;
    for (int64_t j = first; j < c; j += step) {
      const P xv = P::load(xr + j), d = P::load(dyr + j), w = P::load(gamma + j);
      for (int k = 0; k < P::kWidth; ++k) sum_gx += static_cast<double>(d.v[k] * w.v[k]) * (xv.v[k] * rs);
    }
    const float mean_gx = static_cast<float>(G::sum(sum_gx, shared) / static_cast<double>(c));
    const auto dxr = dx + r * c;
    for (int64_t j = first; j < c; j += step) {
      const P xv = P::load(xr + j), w = P::load(gamma + j);
      P d = P::load(dyr + j);
      for (int k = 0; k < P::kWidth; ++k) d.v[k] = rs * (d.v[k] * w.v[k] - (xv.v[k] * rs) * mean_gx);
      d.store(dxr + j);
    }
  }
}

template <typename PDY, typename PX>
__global__ void rmsnorm_dgamma_kernel(PDY dy, PX x, const float* rstd, int64_t rows, int64_t c, float* dgamma) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; col < c; col += stride) {
    double acc = 0.0;
    for (int64_t r = 0; r < rows; ++r) acc += static_cast<double>(ld(dy, r * c + col)) * (ld(x, r * c + col) * rstd[r]);
    dgamma[col] += static_cast<float>(acc);
  }
}

}  // namespace

// ---- launchers ---------------------------------------------------------------------------

void rmsnorm_forward(FloatBuf x, FloatBuf gamma, int64_t rows, int64_t c, float eps, FloatBuf y, float* rstd,
                     cudaStream_t stream) {
  if (rows == 0) return;
  const bool vec = rows::can_vectorise_bufs(c, x, gamma, y);
  with_types(
      [&](auto px, auto pg, auto py) {
        REMAT_LAUNCH_ROWS_T(rmsnorm_forward_kernel, (decltype(px), decltype(pg), decltype(py)), rows, c, vec, stream,
                            px, pg, rows, c, eps, py, rstd);
      },
      x, gamma, y);
}

void rmsnorm_dgamma(FloatBuf dy, FloatBuf x, const float* rstd, int64_t rows, int64_t c, float* dgamma,
                    cudaStream_t stream) {
  if (rows == 0 || c == 0) return;
  constexpr int kBlock = 128;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div<int64_t>(c, kBlock), 4096));
  with_types(
      [&](auto pdy, auto px) {
        REMAT_LAUNCH((rmsnorm_dgamma_kernel<decltype(pdy), decltype(px)>), dim3(blocks), dim3(kBlock), 0, stream, pdy,
                     px, rstd, rows, c, dgamma);
      },
      dy, x);
}

void rmsnorm_backward_dx(FloatBuf dy, FloatBuf x, FloatBuf gamma, const float* rstd, int64_t rows, int64_t c,
                         FloatBuf dx, cudaStream_t stream) {
  if (rows == 0) return;
  const bool vec = rows::can_vectorise_bufs(c, dy, x, gamma, dx);
  with_types(
      [&](auto pdy, auto px, auto pg, auto pdx) {
        REMAT_LAUNCH_ROWS_T(rmsnorm_backward_dx_kernel, (decltype(pdy), decltype(px), decltype(pg), decltype(pdx)),
                            rows, c, vec, stream, pdy, px, pg, rstd, rows, c, pdx);
      },
      dy, x, gamma, dx);
}

}  // namespace remat::kernels
