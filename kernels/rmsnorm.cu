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

template <int kThreads, bool kVec>
__global__ void rmsnorm_forward_kernel(const float* x, const float* gamma, int64_t rows, int64_t c, float eps, float* y,
                                       float* rstd) {
  using P = Pack<kVec>;
  using G = Group<kThreads>;
  __shared__ double shared[G::kWarps];
  const int64_t first = int64_t{G::lane()} * P::kWidth, step = int64_t{kThreads} * P::kWidth;
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    const float* xr = x + r * c;
    double ss = 0.0;
    for (int64_t j = first; j < c; j += step) {
      const P v = P::load(xr + j);
      for (int k = 0; k < P::kWidth; ++k) ss += static_cast<double>(v.v[k]) * v.v[k];
    }
    const double ms = G::sum(ss, shared) / static_cast<double>(c);
    const float rs = static_cast<float>(1.0 / sqrt(ms + static_cast<double>(eps)));
    if (G::lane() == 0) rstd[r] = rs;
    float* yr = y + r * c;
    for (int64_t j = first; j < c; j += step) {
      P v = P::load(xr + j);
      const P g = P::load(gamma + j);
      for (int k = 0; k < P::kWidth; ++k) v.v[k] = v.v[k] * rs * g.v[k];
      v.store(yr + j);
    }
  }
}

template <int kThreads, bool kVec>
__global__ void rmsnorm_backward_dx_kernel(const float* dy, const float* x, const float* gamma, const float* rstd,
                                           int64_t rows, int64_t c, float* dx) {
  using P = Pack<kVec>;
  using G = Group<kThreads>;
  __shared__ double shared[G::kWarps];
  const int64_t first = int64_t{G::lane()} * P::kWidth, step = int64_t{kThreads} * P::kWidth;
  for (int64_t r = G::first_row(); r < rows; r += G::row_stride()) {
    const float *xr = x + r * c, *dyr = dy + r * c;
    const float rs = rstd[r];
    double sum_gx = 0.0;
    for (int64_t j = first; j < c; j += step) {
      const P xv = P::load(xr + j), d = P::load(dyr + j), w = P::load(gamma + j);
      for (int k = 0; k < P::kWidth; ++k) sum_gx += static_cast<double>(d.v[k] * w.v[k]) * (xv.v[k] * rs);
    }
    const float mean_gx = static_cast<float>(G::sum(sum_gx, shared) / static_cast<double>(c));
    float* dxr = dx + r * c;
    for (int64_t j = first; j < c; j += step) {
      const P xv = P::load(xr + j), w = P::load(gamma + j);
      P d = P::load(dyr + j);
      for (int k = 0; k < P::kWidth; ++k) d.v[k] = rs * (d.v[k] * w.v[k] - (xv.v[k] * rs) * mean_gx);
      d.store(dxr + j);
    }
  }
}

__global__ void rmsnorm_dgamma_kernel(const float* dy, const float* x, const float* rstd, int64_t rows, int64_t c,
                                      float* dgamma) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; col < c; col += stride) {
    double acc = 0.0;
    for (int64_t r = 0; r < rows; ++r) acc += static_cast<double>(dy[r * c + col]) * (x[r * c + col] * rstd[r]);
    dgamma[col] += static_cast<float>(acc);
  }
}

}  // namespace

// ---- launchers ---------------------------------------------------------------------------

void rmsnorm_forward(const float* x, const float* gamma, int64_t rows, int64_t c, float eps, float* y, float* rstd,
                     cudaStream_t stream) {
  if (rows == 0) return;
  const bool vec = rows::can_vectorise(c, x, gamma, y);
  REMAT_LAUNCH_ROWS(rmsnorm_forward_kernel, rows, c, vec, stream, x, gamma, rows, c, eps, y, rstd);
}

void rmsnorm_dgamma(const float* dy, const float* x, const float* rstd, int64_t rows, int64_t c, float* dgamma,
                    cudaStream_t stream) {
  if (rows == 0 || c == 0) return;
  constexpr int kBlock = 128;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div<int64_t>(c, kBlock), 4096));
  REMAT_LAUNCH(rmsnorm_dgamma_kernel, dim3(blocks), dim3(kBlock), 0, stream, dy, x, rstd, rows, c, dgamma);
}

void rmsnorm_backward_dx(const float* dy, const float* x, const float* gamma, const float* rstd, int64_t rows,
                         int64_t c, float* dx, cudaStream_t stream) {
  if (rows == 0) return;
  const bool vec = rows::can_vectorise(c, dy, x, gamma, dx);
  REMAT_LAUNCH_ROWS(rmsnorm_backward_dx_kernel, rows, c, vec, stream, dy, x, gamma, rstd, rows, c, dx);
}

}  // namespace remat::kernels
