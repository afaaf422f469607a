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

__device__ REMAT_INLINE int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
__device__ REMAT_INLINE int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// One thread per output element. The scan is the CPU's: the first strict maximum wins, so
// ties keep the earliest position; a window holding a NaN is scanned again for its last NaN.
__global__ void maxpool2d_forward_kernel(const float* x, PoolShape g, float* y, int32_t* indices) {
  const int64_t out_plane = g.p * g.q, n = g.planes * out_plane;
  const int64_t stride = grid_stride();
  for (int64_t e = grid_start(); e < n; e += stride) {
    const int64_t pl = e / out_plane, o = e - pl * out_plane, pp = o / g.q, qq = o - pp * g.q;
    const float* src = x + pl * g.h * g.w;
    const int64_t h0 = pp * g.sh - g.ph, w0 = qq * g.sw - g.pw;
    const int64_t hs = imax(h0, 0), he = imin(h0 + g.kh, g.h);
    const int64_t ws = imax(w0, 0), we = imin(w0 + g.kw, g.w);
    int64_t best = hs * g.w + ws;
    float bv = -INFINITY;
    bool nan = false;
    for (int64_t hh = hs; hh < he; ++hh) {
      for (int64_t ww = ws; ww < we; ++ww) {
        const float v = src[hh * g.w + ww];
        const bool take = v > bv;
        nan |= isnan(v);
        best = take ? hh * g.w + ww : best;
        bv = take ? v : bv;
      }
    }
    if (nan) {
      for (int64_t hh = hs; hh < he; ++hh)
        for (int64_t ww = ws; ww < we; ++ww)
          if (isnan(src[hh * g.w + ww])) best = hh * g.w + ww;
    }
    y[e] = src[best];
    indices[e] = static_cast<int32_t>(best);
  }
}

// One warp per plane: zero the plane, then take the outputs 32 at a time. Lanes whose
// indices differ add their gradient directly; lanes that share an index (overlapping
// windows) leave it to the group's last lane, which adds the group's values in lane order.
// Either way every dx element receives its contributions in the order of j, as on the CPU.
__global__ void maxpool2d_backward_kernel(const float* dy, const int32_t* indices, int64_t planes, int64_t in_plane,
                                          int64_t out_plane, float* dx) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t pl = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; pl < planes; pl += warps) {
    float* dst = dx + pl * in_plane;
    const float* grad = dy + pl * out_plane;
    const int32_t* idx = indices + pl * out_plane;
    for (int64_t i = lane; i < in_plane; i += 32) dst[i] = 0.0f;
    __syncwarp();
    for (int64_t j0 = 0; j0 < out_plane; j0 += 32) {
      const int64_t j = j0 + lane;
      int32_t target = -1;  // -1: no output here, or an index outside the plane (skipped)
      float g = 0.0f;
      if (j < out_plane) {
        const int32_t t = idx[j];
        if (t >= 0 && t < in_plane) {
          target = t;
          g = grad[j];
        }
      }
      const unsigned peers = __match_any_sync(kFullMask, target);
      const bool alone = (peers & ((1u << lane) - 1u)) == 0;  // no earlier lane shares the index
      if (__all_sync(kFullMask, alone || target < 0)) {
        if (target >= 0) dst[target] += g;
      } else {
        const bool last = (peers >> lane) == 1u;
        float acc = last && target >= 0 ? dst[target] : 0.0f;
        for (int l = 0; l < 32; ++l) {
          const float gl = __shfl_sync(kFullMask, g, l);
          if ((peers >> l) & 1u) acc += gl;
        }
        if (last && target >= 0) dst[target] = acc;
      }
      __syncwarp();  // this chunk's writes are seen by the next chunk's reads
    }
  }
}

__global__ void avgpool2d_forward_kernel(const float* x, PoolShape g, float* y) {
  const int64_t out_plane = g.p * g.q, n = g.planes * out_plane;
  const float div = static_cast<float>(g.kh * g.kw);
  const int64_t stride = grid_stride();
  for (int64_t e = grid_start(); e < n; e += stride) {
    const int64_t pl = e / out_plane, o = e - pl * out_plane, pp = o / g.q, qq = o - pp * g.q;
    const float* src = x + pl * g.h * g.w;
    const int64_t h0 = pp * g.sh - g.ph, w0 = qq * g.sw - g.pw;
    const int64_t hs = imax(h0, 0), he = imin(h0 + g.kh, g.h);
    const int64_t ws = imax(w0, 0), we = imin(w0 + g.kw, g.w);
    float sum = 0.0f;
    for (int64_t hh = hs; hh < he; ++hh)
      for (int64_t ww = ws; ww < we; ++ww) sum += src[hh * g.w + ww];
    y[e] = sum / div;
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
__global__ void avgpool2d_backward_kernel(const float* dy, PoolShape g, float* dx) {
  const int64_t in_plane = g.h * g.w, out_plane = g.p * g.q, n = g.planes * in_plane;
  const float div = static_cast<float>(g.kh * g.kw);
  const int64_t stride = grid_stride();
  for (int64_t e = grid_start(); e < n; e += stride) {
    const int64_t pl = e / in_plane, o = e - pl * in_plane, hh = o / g.w, ww = o - hh * g.w;
    int64_t p_lo, p_hi, q_lo, q_hi;
    windows_holding(hh + g.ph, g.kh, g.sh, g.p, &p_lo, &p_hi);
    windows_holding(ww + g.pw, g.kw, g.sw, g.q, &q_lo, &q_hi);
    const float* src = dy + pl * out_plane;
    float acc = 0.0f;
    for (int64_t pp = p_lo; pp <= p_hi; ++pp)
      for (int64_t qq = q_lo; qq <= q_hi; ++qq) acc += src[pp * g.q + qq] / div;
    dx[e] = acc;
  }
}

// One warp per plane; V = 4 reads float4s (hw % 4 == 0 and x 16-byte aligned).
template <int V>
__global__ void global_avgpool_forward_kernel(const float* x, int64_t planes, int64_t hw, float* y) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t pl = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; pl < planes; pl += warps) {
    double s = 0.0;
    if constexpr (V == 4) {
      const float4* src = reinterpret_cast<const float4*>(x + pl * hw);
      for (int64_t j = lane; j < hw / 4; j += 32) {
        const float4 v = load_unit(src + j);
        s += (static_cast<double>(v.x) + v.y) + (static_cast<double>(v.z) + v.w);
      }
    } else {
      const float* src = x + pl * hw;
      for (int64_t j = lane; j < hw; j += 32) s += src[j];
    }
    s = warp_sum(s);
    if (lane == 0) y[pl] = hw == 0 ? NAN : static_cast<float>(s / static_cast<double>(hw));
  }
}

template <int V>
__global__ void global_avgpool_backward_kernel(const float* dy, int64_t planes, int64_t hw, float* dx) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t pl = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; pl < planes; pl += warps) {
    const float v = dy[pl] / static_cast<float>(hw);
    if constexpr (V == 4) {
      float4* dst = reinterpret_cast<float4*>(dx + pl * hw);
      for (int64_t j = lane; j < hw / 4; j += 32) store_unit(dst + j, make_float4(v, v, v, v));
    } else {
      float* dst = dx + pl * hw;
      for (int64_t j = lane; j < hw; j += 32) dst[j] = v;
    }
  }
}

}  // namespace

void maxpool2d_forward(const float* x, const PoolShape& g, float* y, int32_t* indices, cudaStream_t stream) {
  const dim3 grid(grid_stride_blocks(g.planes * g.p * g.q, kBlock));
  REMAT_LAUNCH(maxpool2d_forward_kernel, grid, dim3(kBlock), 0, stream, x, g, y, indices);
}

void maxpool2d_backward(const float* dy, const int32_t* indices, int64_t planes, int64_t in_plane, int64_t out_plane,
                        float* dx, cudaStream_t stream) {
  const dim3 grid(grid_stride_blocks(planes, kWarpsPerBlock));
  REMAT_LAUNCH(maxpool2d_backward_kernel, grid, dim3(kBlock), 0, stream, dy, indices, planes, in_plane, out_plane, dx);
}

void avgpool2d_forward(const float* x, const PoolShape& g, float* y, cudaStream_t stream) {
  const dim3 grid(grid_stride_blocks(g.planes * g.p * g.q, kBlock));
  REMAT_LAUNCH(avgpool2d_forward_kernel, grid, dim3(kBlock), 0, stream, x, g, y);
}

void avgpool2d_backward(const float* dy, const PoolShape& g, float* dx, cudaStream_t stream) {
  const dim3 grid(grid_stride_blocks(g.planes * g.h * g.w, kBlock));
  REMAT_LAUNCH(avgpool2d_backward_kernel, grid, dim3(kBlock), 0, stream, dy, g, dx);
}

void global_avgpool_forward(const float* x, int64_t planes, int64_t hw, float* y, cudaStream_t stream) {
  const dim3 grid(grid_stride_blocks(planes, kWarpsPerBlock));
  if (hw % 4 == 0 && aligned16(x))
    REMAT_LAUNCH(global_avgpool_forward_kernel<4>, grid, dim3(kBlock), 0, stream, x, planes, hw, y);
  else
    REMAT_LAUNCH(global_avgpool_forward_kernel<1>, grid, dim3(kBlock), 0, stream, x, planes, hw, y);
}

void global_avgpool_backward(const float* dy, int64_t planes, int64_t hw, float* dx, cudaStream_t stream) {
  if (hw == 0) return;
  const dim3 grid(grid_stride_blocks(planes, kWarpsPerBlock));
  if (hw % 4 == 0 && aligned16(dx))
    REMAT_LAUNCH(global_avgpool_backward_kernel<4>, grid, dim3(kBlock), 0, stream, dy, planes, hw, dx);
  else
    REMAT_LAUNCH(global_avgpool_backward_kernel<1>, grid, dim3(kBlock), 0, stream, dy, planes, hw, dx);
}

}  // namespace remat::kernels
