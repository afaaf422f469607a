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
template <typename PX, typename PC>
__global__ void im2col_kernel(PX x, ConvShape g, int64_t n0, int64_t nb, PC col) {
  const int64_t plane = g.p * g.q, len = nb * plane, in_plane = g.h * g.w;
  const int64_t stride = grid_stride();
  for (int64_t l = grid_start(); l < len; l += stride) {
    const int64_t i = l / plane, o = l - i * plane, pp = o / g.q, qq = o - pp * g.q;
    const int64_t h0 = pp * g.sh - g.ph, w0 = qq * g.sw - g.pw;
    const auto img = x + (n0 + i) * g.c * in_plane;
    for (int64_t c = blockIdx.y; c < g.c; c += gridDim.y) {
      const auto src = img + c * in_plane;
      int64_t dst = c * g.r * g.s * len + l;
      for (int64_t r = 0; r < g.r; ++r) {
        const int64_t hh = h0 + r * g.dh;
        const bool row_inside = hh >= 0 && hh < g.h;
        for (int64_t s = 0; s < g.s; ++s, dst += len) {
          const int64_t ww = w0 + s * g.dw;
          st(col, dst, row_inside && ww >= 0 && ww < g.w ? ld(src, hh * g.w + ww) : 0.0f);
        }
      }
    }
  }
}

// One thread per input element (i, c, h, w): h = p * sh - ph + r * dh for the outputs p
// with (h + ph - r * dh) a non-negative multiple of sh below P * sh; likewise w.
template <typename PC, typename PDX>
__global__ void col2im_kernel(PC col, ConvShape g, int64_t n0, int64_t nb, PDX dx) {
  const int64_t plane = g.p * g.q, len = nb * plane, in_plane = g.h * g.w, n = nb * g.c * in_plane;
  const auto out = dx + n0 * g.c * in_plane;
  const int64_t stride = grid_stride();
  for (int64_t e = grid_start(); e < n; e += stride) {
    const int64_t pl = e / in_plane, o = e - pl * in_plane, hh = o / g.w, ww = o - hh * g.w;
    const int64_t i = pl / g.c, c = pl - i * g.c;
    const auto src = col + (c * g.r * g.s * len + i * plane);
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
        acc += ld(src, (r * g.s + s) * len + pp * g.q + qq);
      }
    }
    st(out, e, acc);
  }
}

// Units of V elements: V = 4 moves a float4 (f32 to f32) or four bf16 (bf16 to bf16, 8
// bytes) when plane % 4 == 0 and both arrays are aligned to them; V = 1 one element through
// ld/st (any dtypes: an f32 source into a bf16 destination is rounded).
template <int V, typename T>
struct Unit;
template <>
struct Unit<4, float*> {
  using type = float4;
  __device__ static float4 splat(float v) { return make_float4(v, v, v, v); }
};
template <>
struct Unit<4, bf16*> {
  using type = uint2;
  __device__ static uint2 splat(float v) {
    const unsigned int w = pack_bf16x2(v, v);
    return make_uint2(w, w);
  }
};

template <int V, typename PS, typename PD>
__global__ void nchw_to_cnhw_kernel(PS src, int64_t n0, int64_t nb, int64_t c, int64_t plane, PD dst) {
  const int64_t pv = plane / V, len = nb * pv, n = c * len;
  const int64_t stride = grid_stride();
  for (int64_t e = grid_start(); e < n; e += stride) {
    const int64_t ch = e / len, l = e - ch * len, i = l / pv, j = l - i * pv;
    const int64_t from = ((n0 + i) * c + ch) * pv + j;
    if constexpr (V == 1) {
      st(dst, e, ld(src, from));
    } else {
      using T = typename Unit<V, PD>::type;
      store_unit(reinterpret_cast<T*>(dst) + e, load_unit(reinterpret_cast<const T*>(src) + from));
    }
  }
}

template <int V, typename PB, typename PY>
__global__ void broadcast_channels_kernel(PB b, int64_t n, int64_t c, int64_t plane, PY y) {
  const int64_t pv = plane / V, total = n * c * pv;
  const int64_t stride = grid_stride();
  for (int64_t e = grid_start(); e < total; e += stride) {
    const float v = ld(b, (e / pv) % c);
    if constexpr (V == 1)
      st(y, e, v);
    else
      store_unit(reinterpret_cast<typename Unit<V, PY>::type*>(y) + e, Unit<V, PY>::splat(v));
  }
}

// One block per channel: its threads sum the channel's planes in a fixed pattern (in
// double, as the CPU), then a block reduction.
template <typename PDY>
__global__ void channel_sums_kernel(PDY dy, int64_t n, int64_t c, int64_t plane, float* db) {
  const int64_t ch = blockIdx.x;
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const auto src = dy + (i * c + ch) * plane;
    for (int64_t j = threadIdx.x; j < plane; j += blockDim.x) s += ld(src, j);
  }
  __shared__ double shared[kBlock / 32];
  s = block_sum<kBlock>(s, shared);
  if (threadIdx.x == 0) db[ch] += static_cast<float>(s);
}

// Units of four: plane % 4 == 0 and both arrays of one dtype, aligned to four elements.
bool four_units(int64_t plane, const FloatBuf& a, const FloatBuf& b) {
  if (plane % 4 != 0 || a.bf16 != b.bf16) return false;
  const uintptr_t align = a.bf16 ? 8 : 16;
  return reinterpret_cast<uintptr_t>(a.p) % align == 0 && reinterpret_cast<uintptr_t>(b.p) % align == 0;
}

}  // namespace

void im2col(FloatBuf x, const ConvShape& g, int64_t n0, int64_t nb, FloatBuf col, cudaStream_t stream) {
  const unsigned gx = grid_stride_blocks(nb * g.p * g.q, kBlock);
  const auto gy = static_cast<unsigned>(std::min({g.c, kMaxGridY, std::max<int64_t>(1, kTargetBlocks / gx)}));
  with_types(
      [&](auto px, auto pc) {
        REMAT_LAUNCH((im2col_kernel<decltype(px), decltype(pc)>), dim3(gx, gy), dim3(kBlock), 0, stream, px, g, n0, nb,
                     pc);
      },
      x, col);
}

void col2im(FloatBuf col, const ConvShape& g, int64_t n0, int64_t nb, FloatBuf dx, cudaStream_t stream) {
  const dim3 grid(grid_stride_blocks(nb * g.c * g.h * g.w, kBlock));
  with_types(
      [&](auto pc, auto pdx) {
        REMAT_LAUNCH((col2im_kernel<decltype(pc), decltype(pdx)>), grid, dim3(kBlock), 0, stream, pc, g, n0, nb, pdx);
      },
      col, dx);
}

void nchw_to_cnhw(FloatBuf src, int64_t n0, int64_t nb, int64_t c, int64_t plane, FloatBuf dst, cudaStream_t stream) {
  const bool four = four_units(plane, src, dst);
  with_types(
      [&](auto ps, auto pd) {
        using PS = decltype(ps);
        using PD = decltype(pd);
        if constexpr (is_f32_ptr<PD> || is_bf16_ptr<PD>) {
          if (four) {
            const dim3 grid(grid_stride_blocks(c * nb * plane / 4, kBlock));
            REMAT_LAUNCH((nchw_to_cnhw_kernel<4, PS, PD>), grid, dim3(kBlock), 0, stream, ps, n0, nb, c, plane, pd);
            return;
          }
        }
        const dim3 grid(grid_stride_blocks(c * nb * plane, kBlock));
        REMAT_LAUNCH((nchw_to_cnhw_kernel<1, PS, PD>), grid, dim3(kBlock), 0, stream, ps, n0, nb, c, plane, pd);
      },
      src, dst);
}

void broadcast_channels(FloatBuf b, int64_t n, int64_t c, int64_t plane, FloatBuf y, cudaStream_t stream) {
  const bool four = plane % 4 == 0 && reinterpret_cast<uintptr_t>(y.p) % (y.bf16 ? 8 : 16) == 0;
  with_types(
      [&](auto pb) {
        with_types(
            [&](auto py) {
              using PB = decltype(pb);
              using PY = decltype(py);
              if constexpr (is_f32_ptr<PY> || is_bf16_ptr<PY>) {
                if (four) {
                  const dim3 grid(grid_stride_blocks(n * c * plane / 4, kBlock));
                  REMAT_LAUNCH((broadcast_channels_kernel<4, PB, PY>), grid, dim3(kBlock), 0, stream, pb, n, c, plane,
                               py);
                  return;
                }
              }
              const dim3 grid(grid_stride_blocks(n * c * plane, kBlock));
              REMAT_LAUNCH((broadcast_channels_kernel<1, PB, PY>), grid, dim3(kBlock), 0, stream, pb, n, c, plane, py);
            },
            y);
      },
      b);
}

void accumulate_channel_sums(FloatBuf dy, int64_t n, int64_t c, int64_t plane, float* db, cudaStream_t stream) {
  with_types(
      [&](auto pdy) {
        REMAT_LAUNCH((channel_sums_kernel<decltype(pdy)>), dim3(static_cast<unsigned>(c)), dim3(kBlock), 0, stream, pdy,
                     n, c, plane, db);
      },
      dy);
}

}  // namespace remat::kernels
