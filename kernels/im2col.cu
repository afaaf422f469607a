#include "kernels/im2col.cuh"

#include <algorithm>
#include <cstdint>

#include "kernels/launch.cuh"
#include "kernels/reduce.cuh"
#include "kernels/vec4.cuh"

namespace remat::kernels {

namespace {

constexpr int kBlock = 256;
constexpr int64_t kTargetBlocks = 2048;  // im2col: blocks over columns x channel slices
constexpr int64_t kMaxGridY = 65535;

// One thread per column l (image i, output p, q), for the channels c = blockIdx.y,
// blockIdx.y + gridDim.y, ...: it writes rows (c, r, s) of its column, so consecutive
// threads write consecutive addresses.
__global__ void im2col_kernel(const float* x, ConvShape g, int64_t n0, int64_t nb, float* col) {
  const int64_t plane = g.p * g.q, len = nb * plane, in_plane = g.h * g.w;
  const int64_t stride = grid_stride();
  for (int64_t l = grid_start(); l < len; l += stride) {
    const int64_t i = l / plane, o = l - i * plane, pp = o / g.q, qq = o - pp * g.q;
    const int64_t h0 = pp * g.sh - g.ph, w0 = qq * g.sw - g.pw;
    const float* img = x + (n0 + i) * g.c * in_plane;
    for (int64_t c = blockIdx.y; c < g.c; c += gridDim.y) {
      const float* src = img + c * in_plane;
      float* dst = col + c * g.r * g.s * len + l;
      for (int64_t r = 0; r < g.r; ++r) {
        const int64_t hh = h0 + r * g.dh;
        const bool row_inside = hh >= 0 && hh < g.h;
        for (int64_t s = 0; s < g.s; ++s, dst += len) {
          const int64_t ww = w0 + s * g.dw;
          *dst = row_inside && ww >= 0 && ww < g.w ? src[hh * g.w + ww] : 0.0f;
        }
      }
    }
  }
}

// One thread per input element (i, c, h, w): h = p * sh - ph + r * dh for the outputs p
// with (h + ph - r * dh) a non-negative multiple of sh below P * sh; likewise w.
__global__ void col2im_kernel(const float* col, ConvShape g, int64_t n0, int64_t nb, float* dx) {
  const int64_t plane = g.p * g.q, len = nb * plane, in_plane = g.h * g.w, n = nb * g.c * in_plane;
  float* out = dx + n0 * g.c * in_plane;
  const int64_t stride = grid_stride();
  for (int64_t e = grid_start(); e < n; e += stride) {
    const int64_t pl = e / in_plane, o = e - pl * in_plane, hh = o / g.w, ww = o - hh * g.w;
    const int64_t i = pl / g.c, c = pl - i * g.c;
    const float* src = col + c * g.r * g.s * len + i * plane;
    float acc = 0.0f;
    for (int64_t r = 0; r < g.r; ++r) {
      const int64_t th = hh + g.ph - r * g.dh;  // p * sh
      if (th < 0) break;                        // and for every later r
      const int64_t pp = th / g.sh;
      if (pp * g.sh != th || pp >= g.p) continue;
      for (int64_t s = 0; s < g.s; ++s) {
        const int64_t tw = ww + g.pw - s * g.dw;  // q * sw
        if (tw < 0) break;
        const int64_t qq = tw / g.sw;
        if (qq * g.sw != tw || qq >= g.q) continue;
        acc += src[(r * g.s + s) * len + pp * g.q + qq];
      }
    }
    out[e] = acc;
  }
}

// Units of V floats (float4 for V == 4: plane % 4 == 0 and both tensors 16-byte aligned).
template <int V>
struct Unit;
template <>
struct Unit<1> {
  using type = float;
  __device__ static float splat(float v) { return v; }
};
template <>
struct Unit<4> {
  using type = float4;
  __device__ static float4 splat(float v) { return make_float4(v, v, v, v); }
};

template <int V>
__global__ void nchw_to_cnhw_kernel(const float* src, int64_t n0, int64_t nb, int64_t c, int64_t plane, float* dst) {
  using T = typename Unit<V>::type;
  const T* s = reinterpret_cast<const T*>(src);
  T* d = reinterpret_cast<T*>(dst);
  const int64_t pv = plane / V, len = nb * pv, n = c * len;
  const int64_t stride = grid_stride();
  for (int64_t e = grid_start(); e < n; e += stride) {
    const int64_t ch = e / len, l = e - ch * len, i = l / pv, j = l - i * pv;
    store_unit(d + e, load_unit(s + ((n0 + i) * c + ch) * pv + j));
  }
}

template <int V>
__global__ void broadcast_channels_kernel(const float* b, int64_t n, int64_t c, int64_t plane, float* y) {
  using T = typename Unit<V>::type;
  T* d = reinterpret_cast<T*>(y);
  const int64_t pv = plane / V, total = n * c * pv;
  const int64_t stride = grid_stride();
  for (int64_t e = grid_start(); e < total; e += stride) store_unit(d + e, Unit<V>::splat(b[(e / pv) % c]));
}

// One block per channel: its threads sum the channel's planes in a fixed pattern (in
// double, as the CPU), then a block reduction.
__global__ void channel_sums_kernel(const float* dy, int64_t n, int64_t c, int64_t plane, float* db) {
  const int64_t ch = blockIdx.x;
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float* src = dy + (i * c + ch) * plane;
    for (int64_t j = threadIdx.x; j < plane; j += blockDim.x) s += src[j];
  }
  __shared__ double shared[kBlock / 32];
  s = block_sum<kBlock>(s, shared);
  if (threadIdx.x == 0) db[ch] += static_cast<float>(s);
}

}  // namespace

void im2col(const float* x, const ConvShape& g, int64_t n0, int64_t nb, float* col, cudaStream_t stream) {
  const unsigned gx = grid_stride_blocks(nb * g.p * g.q, kBlock);
  const auto gy = static_cast<unsigned>(std::min({g.c, kMaxGridY, std::max<int64_t>(1, kTargetBlocks / gx)}));
  REMAT_LAUNCH(im2col_kernel, dim3(gx, gy), dim3(kBlock), 0, stream, x, g, n0, nb, col);
}

void col2im(const float* col, const ConvShape& g, int64_t n0, int64_t nb, float* dx, cudaStream_t stream) {
  const dim3 grid(grid_stride_blocks(nb * g.c * g.h * g.w, kBlock));
  REMAT_LAUNCH(col2im_kernel, grid, dim3(kBlock), 0, stream, col, g, n0, nb, dx);
}

void nchw_to_cnhw(const float* src, int64_t n0, int64_t nb, int64_t c, int64_t plane, float* dst, cudaStream_t stream) {
  if (plane % 4 == 0 && aligned16(src) && aligned16(dst)) {
    const dim3 grid(grid_stride_blocks(c * nb * plane / 4, kBlock));
    REMAT_LAUNCH(nchw_to_cnhw_kernel<4>, grid, dim3(kBlock), 0, stream, src, n0, nb, c, plane, dst);
  } else {
    const dim3 grid(grid_stride_blocks(c * nb * plane, kBlock));
    REMAT_LAUNCH(nchw_to_cnhw_kernel<1>, grid, dim3(kBlock), 0, stream, src, n0, nb, c, plane, dst);
  }
}

void broadcast_channels(const float* b, int64_t n, int64_t c, int64_t plane, float* y, cudaStream_t stream) {
  if (plane % 4 == 0 && aligned16(y)) {
    const dim3 grid(grid_stride_blocks(n * c * plane / 4, kBlock));
    REMAT_LAUNCH(broadcast_channels_kernel<4>, grid, dim3(kBlock), 0, stream, b, n, c, plane, y);
  } else {
    const dim3 grid(grid_stride_blocks(n * c * plane, kBlock));
    REMAT_LAUNCH(broadcast_channels_kernel<1>, grid, dim3(kBlock), 0, stream, b, n, c, plane, y);
  }
}

void accumulate_channel_sums(const float* dy, int64_t n, int64_t c, int64_t plane, float* db, cudaStream_t stream) {
  REMAT_LAUNCH(channel_sums_kernel, dim3(static_cast<unsigned>(c)), dim3(kBlock), 0, stream, dy, n, c, plane, db);
}

}  // namespace remat::kernels
