#include "kernels/pool.cuh"

#include <math.h>

#include <cstdint>

#include "kernels/launch.cuh"
#include "kernels/reduce.cuh"
#include "kernels/vec4.cuh"

namespace remat::kernels {

namespace {

constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = kBlock / 32;
// maxpool2d_backward into bf16: fp32 sums of a tile of this many dx elements per warp.
constexpr int64_t kMaxPoolTile = 1024;

__device__ REMAT_INLINE int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
__device__ REMAT_INLINE int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// One thread per output element. The scan is the CPU's: the first strict maximum wins, so
// ties keep the earliest position; a window holding a NaN is scanned again for its last NaN.
template <typename PX, typename PY>
__global__ void maxpool2d_forward_kernel(PX x, PoolShape g, PY y, uint8_t* indices) {
  const int64_t out_plane = g.p * g.q, n = g.planes * out_plane;
  const int64_t stride = grid_stride();
  for (int64_t e = grid_start(); e < n; e += stride) {
    const int64_t pl = e / out_plane, o = e - pl * out_plane, pp = o / g.q, qq = o - pp * g.q;
    const auto src = x + pl * g.h * g.w;
    const int64_t h0 = pp * g.sh - g.ph, w0 = qq * g.sw - g.pw;
    const int64_t hs = imax(h0, 0), he = imin(h0 + g.kh, g.h);
    const int64_t ws = imax(w0, 0), we = imin(w0 + g.kw, g.w);
    int64_t best = hs * g.w + ws;
    float bv = -INFINITY;
    bool nan = false;
    for (int64_t hh = hs; hh < he; ++hh) {
      for (int64_t ww = ws; ww < we; ++ww) {
        const float v = ld(src, hh * g.w + ww);
        const bool take = v > bv;
        nan |= isnan(v);
        best = take ? hh * g.w + ww : best;
        bv = take ? v : bv;
      }
    }
    if (nan) {
      for (int64_t hh = hs; hh < he; ++hh)
        for (int64_t ww = ws; ww < we; ++ww)
          if (isnan(ld(src, hh * g.w + ww))) best = hh * g.w + ww;
    }
    st(y, e, ld(src, best));
    const int64_t bh = best / g.w, bw = best - bh * g.w;
    indices[e] = static_cast<uint8_t>((bh - h0) * g.kw + (bw - w0));  // the offset within the window
  }
}

// The flat position in its plane of output j's maximum, from its window offset; -1 for an
// offset outside the window or on its padding.
__device__ REMAT_INLINE int64_t maxpool_target(const PoolShape& g, int64_t j, int off) {
  if (off >= g.kh * g.kw) return -1;
  const int64_t pp = j / g.q, qq = j - pp * g.q;
  const int64_t hh = pp * g.sh - g.ph + off / g.kw, ww = qq * g.sw - g.pw + off % g.kw;
  return hh < 0 || hh >= g.h || ww < 0 || ww >= g.w ? -1 : hh * g.w + ww;
}

// The outputs j0 .. j0 + 31 of one plane (lane l takes j0 + l) added into acc[t - t0] for
// their targets t in [t0, t1). Lanes whose targets differ add their gradient directly;
// lanes that share a target (overlapping windows) leave it to the group's last lane, which
// adds the group's values in lane order. Either way every element receives its
// contributions in the order of j, as on the CPU. Called by the whole warp.
template <typename PDY>
__device__ REMAT_INLINE void maxpool_backward_chunk(PDY grad, const uint8_t* idx, const PoolShape& shape, int64_t j0,
                                                    int64_t t0, int64_t t1, float* acc) {
  const int lane = threadIdx.x % 32;
  const int64_t j = j0 + lane;
  int32_t target = -1;  // -1: no output here, or a target outside [t0, t1) or the input (skipped)
  float g = 0.0f;
  if (j < shape.p * shape.q) {
    const int64_t t = maxpool_target(shape, j, idx[j]);
    if (t >= 0 && t >= t0 && t < t1) {
      target = static_cast<int32_t>(t - t0);
      g = ld(grad, j);
    }
  }
  const unsigned peers = __match_any_sync(kFullMask, target);
  const bool alone = (peers & ((1u << lane) - 1u)) == 0;  // no earlier lane shares the target
  if (__all_sync(kFullMask, alone || target < 0)) {
    if (target >= 0) acc[target] += g;
  } else {
    const bool last = (peers >> lane) == 1u;
    float sum = last && target >= 0 ? acc[target] : 0.0f;
    for (int l = 0; l < 32; ++l) {
      const float gl = __shfl_sync(kFullMask, g, l);
      if ((peers >> l) & 1u) sum += gl;
    }
    if (last && target >= 0) acc[target] = sum;
  }
  __syncwarp();  // this chunk's writes are seen by the next chunk's reads
}

// One warp per plane: zero the plane of an f32 dx, then add the outputs 32 at a time into it.
template <typename PDY>
__global__ void maxpool2d_backward_kernel(PDY dy, const uint8_t* indices, PoolShape g, float* dx) {
  const int lane = threadIdx.x % 32;
  const int64_t in_plane = g.h * g.w, out_plane = g.p * g.q;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t pl = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; pl < g.planes; pl += warps) {
    float* dst = dx + pl * in_plane;
    for (int64_t i = lane; i < in_plane; i += 32) dst[i] = 0.0f;
    __syncwarp();
    for (int64_t j0 = 0; j0 < out_plane; j0 += 32)
      maxpool_backward_chunk(dy + pl * out_plane, indices + pl * out_plane, g, j0, 0, in_plane, dst);
  }
}

// The same into a bf16 dx: the sums of each tile of kMaxPoolTile elements of the plane in
// fp32 in shared memory (the warp's own tile), over all of the plane's outputs, then
// rounded once into dx: the bits of the f32 kernel's dx, rounded.
template <typename PDY>
__global__ void maxpool2d_backward_tiled_kernel(PDY dy, const uint8_t* indices, PoolShape g, bf16* dx) {
  __shared__ float tiles[kWarpsPerBlock][kMaxPoolTile];
  const int lane = threadIdx.x % 32;
  float* acc = tiles[threadIdx.x / 32];
  const int64_t in_plane = g.h * g.w, out_plane = g.p * g.q;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t pl = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; pl < g.planes; pl += warps) {
    for (int64_t t0 = 0; t0 < in_plane; t0 += kMaxPoolTile) {
      const int64_t t1 = imin(t0 + kMaxPoolTile, in_plane);
      for (int64_t i = lane; i < t1 - t0; i += 32) acc[i] = 0.0f;
      __syncwarp();
      for (int64_t j0 = 0; j0 < out_plane; j0 += 32)
        maxpool_backward_chunk(dy + pl * out_plane, indices + pl * out_plane, g, j0, t0, t1, acc);
      for (int64_t i = lane; i < t1 - t0; i += 32) dx[pl * in_plane + t0 + i] = __float2bfloat16_rn(acc[i]);
      __syncwarp();  // the tile is read before the next one is zeroed
    }
  }
}

template <typename PX, typename PY>
__global__ void avgpool2d_forward_kernel(PX x, PoolShape g, PY y) {
  const int64_t out_plane = g.p * g.q, n = g.planes * out_plane;
  const float div = static_cast<float>(g.kh * g.kw);
  const int64_t stride = grid_stride();
  for (int64_t e = grid_start(); e < n; e += stride) {
    const int64_t pl = e / out_plane, o = e - pl * out_plane, pp = o / g.q, qq = o - pp * g.q;
    const auto src = x + pl * g.h * g.w;
    const int64_t h0 = pp * g.sh - g.ph, w0 = qq * g.sw - g.pw;
    const int64_t hs = imax(h0, 0), he = imin(h0 + g.kh, g.h);
    const int64_t ws = imax(w0, 0), we = imin(w0 + g.kw, g.w);
    float sum = 0.0f;
    for (int64_t hh = hs; hh < he; ++hh)
      for (int64_t ww = ws; ww < we; ++ww) sum += ld(src, hh * g.w + ww);
    st(y, e, sum / div);
  }
}

// First and last output index (inclusive) whose window [o * stride, o * stride + k) in
// padded coordinates holds position t = input + pad.
__device__ REMAT_INLINE void windows_holding(int64_t t, int64_t k, int64_t stride, int64_t out, int64_t* lo,
                                             int64_t* hi) {
  *lo = t >= k ? (t - k) / stride + 1 : 0;
  *hi = imin(t / stride, out - 1);
}

// One thread per input element: the sum, in output order, of dy / div over the windows
// that hold it (the CPU adds the same values in the same order).
template <typename PDY, typename PDX>
__global__ void avgpool2d_backward_kernel(PDY dy, PoolShape g, PDX dx) {
  const int64_t in_plane = g.h * g.w, out_plane = g.p * g.q, n = g.planes * in_plane;
  const float div = static_cast<float>(g.kh * g.kw);
  const int64_t stride = grid_stride();
  for (int64_t e = grid_start(); e < n; e += stride) {
    const int64_t pl = e / in_plane, o = e - pl * in_plane, hh = o / g.w, ww = o - hh * g.w;
    int64_t p_lo, p_hi, q_lo, q_hi;
    windows_holding(hh + g.ph, g.kh, g.sh, g.p, &p_lo, &p_hi);
    windows_holding(ww + g.pw, g.kw, g.sw, g.q, &q_lo, &q_hi);
    const auto src = dy + pl * out_plane;
    float acc = 0.0f;
    for (int64_t pp = p_lo; pp <= p_hi; ++pp)
      for (int64_t qq = q_lo; qq <= q_hi; ++qq) acc += ld(src, pp * g.q + qq) / div;
    st(dx, e, acc);
  }
}

// Four consecutive elements of a plane (a float4, or four bf16: 8 bytes).
__device__ REMAT_INLINE void load_four(const float* p, int64_t q, float* v) {
  const float4 f = load4(p, q);
  v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
}
__device__ REMAT_INLINE void load_four(const bf16* p, int64_t q, float* v) { load4(p, q, v); }
__device__ REMAT_INLINE void store_four(float* p, int64_t q, const float* v) {
  store4(p, q, make_float4(v[0], v[1], v[2], v[3]));
}
__device__ REMAT_INLINE void store_four(bf16* p, int64_t q, const float* v) { store4(p, q, v); }
__device__ REMAT_INLINE void load_four(DynPtr p, int64_t q, float* v) {
  for (int k = 0; k < 4; ++k) v[k] = ld(p, 4 * q + k);
}
__device__ REMAT_INLINE void store_four(DynPtr p, int64_t q, const float* v) {
  for (int k = 0; k < 4; ++k) st(p, 4 * q + k, v[k]);
}

// One warp per plane; V = 4 reads four elements at a time (hw % 4 == 0 and x aligned to
// them), in the same order whatever the dtype.
template <int V, typename PX, typename PY>
__global__ void global_avgpool_forward_kernel(PX x, int64_t planes, int64_t hw, PY y) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t pl = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; pl < planes; pl += warps) {
    double s = 0.0;
    const auto src = x + pl * hw;
    if constexpr (V == 4) {
      for (int64_t j = lane; j < hw / 4; j += 32) {
        float v[4];
        load_four(src, j, v);
        s += (static_cast<double>(v[0]) + v[1]) + (static_cast<double>(v[2]) + v[3]);
      }
    } else {
      for (int64_t j = lane; j < hw; j += 32) s += ld(src, j);
    }
    s = warp_sum(s);
    if (lane == 0) st(y, pl, hw == 0 ? NAN : static_cast<float>(s / static_cast<double>(hw)));
  }
}

template <int V, typename PDY, typename PDX>
__global__ void global_avgpool_backward_kernel(PDY dy, int64_t planes, int64_t hw, PDX dx) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t pl = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; pl < planes; pl += warps) {
    const float v = ld(dy, pl) / static_cast<float>(hw);
    const auto dst = dx + pl * hw;
    if constexpr (V == 4) {
      const float four[4] = {v, v, v, v};
      for (int64_t j = lane; j < hw / 4; j += 32) store_four(dst, j, four);
    } else {
      for (int64_t j = lane; j < hw; j += 32) st(dst, j, v);
    }
  }
}

// Four elements per access when the array is f32 16-byte aligned or bf16 8-byte aligned.
bool aligned_four(const FloatBuf& b) { return reinterpret_cast<uintptr_t>(b.p) % (b.bf16 ? 8 : 16) == 0; }

}  // namespace

void maxpool2d_forward(FloatBuf x, const PoolShape& g, FloatBuf y, uint8_t* indices, cudaStream_t stream) {
  const dim3 grid(grid_stride_blocks(g.planes * g.p * g.q, kBlock));
  with_types(
      [&](auto px, auto py) {
        REMAT_LAUNCH((maxpool2d_forward_kernel<decltype(px), decltype(py)>), grid, dim3(kBlock), 0, stream, px, g, py,
                     indices);
      },
      x, y);
}

void maxpool2d_backward(FloatBuf dy, const uint8_t* indices, const PoolShape& g, FloatBuf dx, cudaStream_t stream) {
  const dim3 grid(grid_stride_blocks(g.planes, kWarpsPerBlock));
  with_types(
      [&](auto pdy) {
        using PDY = decltype(pdy);
        if (dx.bf16)
          REMAT_LAUNCH(maxpool2d_backward_tiled_kernel<PDY>, grid, dim3(kBlock), 0, stream, pdy, indices, g,
                       static_cast<bf16*>(dx.p));
        else
          REMAT_LAUNCH(maxpool2d_backward_kernel<PDY>, grid, dim3(kBlock), 0, stream, pdy, indices, g,
                       static_cast<float*>(dx.p));
      },
      dy);
}

void avgpool2d_forward(FloatBuf x, const PoolShape& g, FloatBuf y, cudaStream_t stream) {
  const dim3 grid(grid_stride_blocks(g.planes * g.p * g.q, kBlock));
  with_types(
      [&](auto px, auto py) {
        REMAT_LAUNCH((avgpool2d_forward_kernel<decltype(px), decltype(py)>), grid, dim3(kBlock), 0, stream, px, g, py);
      },
      x, y);
}

void avgpool2d_backward(FloatBuf dy, const PoolShape& g, FloatBuf dx, cudaStream_t stream) {
  const dim3 grid(grid_stride_blocks(g.planes * g.h * g.w, kBlock));
  with_types(
      [&](auto pdy, auto pdx) {
        REMAT_LAUNCH((avgpool2d_backward_kernel<decltype(pdy), decltype(pdx)>), grid, dim3(kBlock), 0, stream, pdy, g,
                     pdx);
      },
      dy, dx);
}

// x and y are typed separately (y, [N, C], may be f32 under a bf16 x or the other way round).
void global_avgpool_forward(FloatBuf x, int64_t planes, int64_t hw, FloatBuf y, cudaStream_t stream) {
  const dim3 grid(grid_stride_blocks(planes, kWarpsPerBlock));
  const bool vec = hw % 4 == 0 && aligned_four(x);
  with_types(
      [&](auto px) {
        with_types(
            [&](auto py) {
              using PX = decltype(px);
              using PY = decltype(py);
              if (vec)
                REMAT_LAUNCH((global_avgpool_forward_kernel<4, PX, PY>), grid, dim3(kBlock), 0, stream, px, planes, hw,
                             py);
              else
                REMAT_LAUNCH((global_avgpool_forward_kernel<1, PX, PY>), grid, dim3(kBlock), 0, stream, px, planes, hw,
                             py);
            },
            y);
      },
      x);
}

void global_avgpool_backward(FloatBuf dy, int64_t planes, int64_t hw, FloatBuf dx, cudaStream_t stream) {
  if (hw == 0) return;
  const dim3 grid(grid_stride_blocks(planes, kWarpsPerBlock));
  const bool vec = hw % 4 == 0 && aligned_four(dx);
  with_types(
      [&](auto pdy) {
        with_types(
            [&](auto pdx) {
              using PDY = decltype(pdy);
              using PDX = decltype(pdx);
              if (vec)
                REMAT_LAUNCH((global_avgpool_backward_kernel<4, PDY, PDX>), grid, dim3(kBlock), 0, stream, pdy, planes,
                             hw, pdx);
              else
                REMAT_LAUNCH((global_avgpool_backward_kernel<1, PDY, PDX>), grid, dim3(kBlock), 0, stream, pdy, planes,
                             hw, pdx);
            },
            dx);
      },
      dy);
}

}  // namespace remat::kernels
