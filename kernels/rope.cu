#include "kernels/rope.cuh"

#include <math.h>

#include <algorithm>

#include "kernels/launch.cuh"

namespace remat::kernels {

namespace {

template <typename PX, typename PY>
__global__ void rope_kernel(PX x, int64_t rows, int64_t t_len, int heads, int rotated, int64_t d, double theta,
                            RopeScaling scaling, double sign, PY y) {
  const int64_t half = d / 2, c = heads * d, pairs = rows * rotated * half;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < pairs; k += stride) {
    const int64_t r = k / (rotated * half), rem = k % (rotated * half), h = rem / half, i = rem % half;
    const double inv_freq = rope_inv_freq(theta, i, d, scaling);
    const double angle = static_cast<double>(r % t_len) * inv_freq;
    const double cs = cos(angle), sn = sign * sin(angle);
    const int64_t at = r * c + h * d + i;
    const double u = ld(x, at), v = ld(x, at + half);
    st(y, at, static_cast<float>(u * cs - v * sn));
    st(y, at + half, static_cast<float>(v * cs + u * sn));
  }
}

template <typename PX, typename PY>
__global__ void rope_copy_kernel(PX x, int64_t rows, int heads, int rotated, int64_t d, PY y) {
  const int64_t rest = (heads - rotated) * d, n = rows * rest;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += stride) {
    const int64_t at = (k / rest) * heads * d + rotated * d + k % rest;
    st(y, at, ld(x, at));
  }
}

}  // namespace

void rope(FloatBuf x, int64_t rows, int64_t t_len, int heads, int rotated, int64_t d, double theta, RopeScaling scaling,
          double sign, FloatBuf y, cudaStream_t stream) {
  if (rows == 0 || d == 0) return;
  constexpr int kBlock = 256;
  auto blocks = [](int64_t n) {
    return dim3(static_cast<unsigned>(std::min<int64_t>(ceil_div<int64_t>(n, kBlock), 65536)));
  };
  with_types(
      [&](auto px, auto py) {
        const int64_t pairs = rows * rotated * (d / 2);
        if (pairs > 0)
          REMAT_LAUNCH((rope_kernel<decltype(px), decltype(py)>), blocks(pairs), dim3(kBlock), 0, stream, px, rows,
                       t_len, heads, rotated, d, theta, scaling, sign, py);
        const int64_t rest = rows * (heads - rotated) * d;
        if (rest > 0 && x.p != y.p)
          REMAT_LAUNCH((rope_copy_kernel<decltype(px), decltype(py)>), blocks(rest), dim3(kBlock), 0, stream, px, rows,
                       heads, rotated, d, py);
      },
      x, y);
}

}  // namespace remat::kernels
