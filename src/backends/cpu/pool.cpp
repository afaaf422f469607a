// Pooling on the CPU: max, average (count_include_pad) and global average, NCHW.
// Every loop is parallel over (image, channel) planes and sequential within a plane, so
// each output element is computed by one thread in a fixed order: results are identical
// for any thread count.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/parallel.h"
#include "remat/error.h"

namespace remat {

namespace {

// Below this many elements touched a loop runs on the calling thread (the results are the
// same either way; it saves the fork/join on small tensors).
constexpr int64_t kMinParallelWork = int64_t{1} << 15;

struct PoolGeom {
  int64_t planes, h, w, p, q;
  int64_t kh, kw, sh, sw, ph, pw;

  PoolGeom(const Shape& x, const Shape& y, const Pool2dParams& prm) {
    planes = x[0] * x[1], h = x[2], w = x[3], p = y[2], q = y[3];
    kh = prm.kernel_h, kw = prm.kernel_w, sh = prm.stride_h, sw = prm.stride_w, ph = prm.pad_h, pw = prm.pad_w;
  }
};

using cpu::sum_f64;

}  // namespace

void CpuBackend::maxpool2d_forward_impl(const Tensor& x, const Pool2dParams& prm, const Tensor& y,
                                        const Tensor& indices) {
  const PoolGeom g(x.shape(), y.shape(), prm);
  const float* xp = x.f32();
  float* yp = y.f32();
  int32_t* ip = indices.i32();
  REMAT_CHECK(g.h * g.w <= std::numeric_limits<int32_t>::max(), "maxpool2d_forward: x ", x.str(),
              ": a plane is too large for i32 indices");
#pragma omp parallel for schedule(static) if (g.planes * g.p * g.q * g.kh * g.kw >= kMinParallelWork)
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    const float* src = xp + pl * g.h * g.w;
    float* dst = yp + pl * g.p * g.q;
    int32_t* idx = ip + pl * g.p * g.q;
    for (int64_t pp = 0; pp < g.p; ++pp) {
      const int64_t h0 = pp * g.sh - g.ph;
      const int64_t hs = std::max<int64_t>(h0, 0), he = std::min(h0 + g.kh, g.h);
      for (int64_t qq = 0; qq < g.q; ++qq) {
        const int64_t w0 = qq * g.sw - g.pw;
        const int64_t ws = std::max<int64_t>(w0, 0), we = std::min(w0 + g.kw, g.w);
        // As PyTorch: the first maximum in scan order wins; a NaN wins (the last NaN);
        // padding never does (the window always holds an input element, as pad <= k / 2).
        // Without NaNs, a branch-free scan (random data mispredicts every branch); a window
        // holding a NaN is scanned again with PyTorch's rule.
        int64_t best = hs * g.w + ws;
        float bv = -std::numeric_limits<float>::infinity();
        bool nan = false;
        for (int64_t hh = hs; hh < he; ++hh) {
          for (int64_t ww = ws; ww < we; ++ww) {
            const float v = src[hh * g.w + ww];
            const bool take = v > bv;
            nan |= v != v;
            best = take ? hh * g.w + ww : best;
            bv = take ? v : bv;
          }
        }
        if (nan) {
          for (int64_t hh = hs; hh < he; ++hh)
            for (int64_t ww = ws; ww < we; ++ww)
              if (std::isnan(src[hh * g.w + ww])) best = hh * g.w + ww;
        }
        dst[pp * g.q + qq] = src[best];
        idx[pp * g.q + qq] = static_cast<int32_t>(best);
      }
    }
  }
}

void CpuBackend::maxpool2d_backward_impl(const Tensor& dy, const Tensor& indices, const Tensor& dx) {
  const int64_t planes = dx.size(0) * dx.size(1), in_plane = dx.size(2) * dx.size(3);
  const int64_t out_plane = dy.size(2) * dy.size(3);
  const float* dyp = dy.f32();
  const int32_t* ip = indices.i32();
  float* dxp = dx.f32();
  std::atomic<int64_t> bad{-1};  // the first flat position of an out-of-range index, if any
#pragma omp parallel for schedule(static) if (planes * (in_plane + out_plane) >= kMinParallelWork)
  for (int64_t pl = 0; pl < planes; ++pl) {
    float* dst = dxp + pl * in_plane;
    const float* g = dyp + pl * out_plane;
    const int32_t* idx = ip + pl * out_plane;
    std::fill(dst, dst + in_plane, 0.0f);
    for (int64_t j = 0; j < out_plane; ++j) {
      const int64_t i = idx[j];
      if (i < 0 || i >= in_plane) {
        const int64_t at = pl * out_plane + j;
        int64_t seen = bad.load();
        while ((seen < 0 || at < seen) && !bad.compare_exchange_weak(seen, at)) {
        }
        continue;
      }
      dst[i] += g[j];
    }
  }
  const int64_t at = bad.load();
  if (at >= 0)
    REMAT_THROW("maxpool2d_backward: indices ", indices.str(), " hold ", ip[at], " at flat position ", at,
                ", outside the input plane of dx ", dx.str(), " (", in_plane, " elements)");
}

void CpuBackend::avgpool2d_forward_impl(const Tensor& x, const Pool2dParams& prm, const Tensor& y) {
  const PoolGeom g(x.shape(), y.shape(), prm);
  const float* xp = x.f32();
  float* yp = y.f32();
  // count_include_pad: the padded window always fits (no ceil mode), so every window
  // divides by kh * kw.
  const float div = static_cast<float>(g.kh * g.kw);
#pragma omp parallel for schedule(static) if (g.planes * g.p * g.q * g.kh * g.kw >= kMinParallelWork)
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    const float* src = xp + pl * g.h * g.w;
    float* dst = yp + pl * g.p * g.q;
    for (int64_t pp = 0; pp < g.p; ++pp) {
      const int64_t h0 = pp * g.sh - g.ph;
      const int64_t hs = std::max<int64_t>(h0, 0), he = std::min(h0 + g.kh, g.h);
      for (int64_t qq = 0; qq < g.q; ++qq) {
        const int64_t w0 = qq * g.sw - g.pw;
        const int64_t ws = std::max<int64_t>(w0, 0), we = std::min(w0 + g.kw, g.w);
        float sum = 0.0f;
        for (int64_t hh = hs; hh < he; ++hh)
          for (int64_t ww = ws; ww < we; ++ww) sum += src[hh * g.w + ww];
        dst[pp * g.q + qq] = sum / div;
      }
    }
  }
}

void CpuBackend::avgpool2d_backward_impl(const Tensor& dy, const Pool2dParams& prm, const Tensor& dx) {
  const PoolGeom g(dx.shape(), dy.shape(), prm);
  const float* dyp = dy.f32();
  float* dxp = dx.f32();
  const float div = static_cast<float>(g.kh * g.kw);
#pragma omp parallel for schedule(static) if (g.planes * (g.h * g.w + g.p * g.q * g.kh * g.kw) >= kMinParallelWork)
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    float* dst = dxp + pl * g.h * g.w;
    const float* src = dyp + pl * g.p * g.q;
    std::fill(dst, dst + g.h * g.w, 0.0f);
    for (int64_t pp = 0; pp < g.p; ++pp) {
      const int64_t h0 = pp * g.sh - g.ph;
      const int64_t hs = std::max<int64_t>(h0, 0), he = std::min(h0 + g.kh, g.h);
      for (int64_t qq = 0; qq < g.q; ++qq) {
        const int64_t w0 = qq * g.sw - g.pw;
        const int64_t ws = std::max<int64_t>(w0, 0), we = std::min(w0 + g.kw, g.w);
        const float v = src[pp * g.q + qq] / div;
        for (int64_t hh = hs; hh < he; ++hh)
          for (int64_t ww = ws; ww < we; ++ww) dst[hh * g.w + ww] += v;
      }
    }
  }
}

void CpuBackend::global_avgpool_forward_impl(const Tensor& x, const Tensor& y) {
  const int64_t planes = x.size(0) * x.size(1), hw = x.size(2) * x.size(3);
  const float* xp = x.f32();
  float* yp = y.f32();
#pragma omp parallel for schedule(static) if (planes * hw >= kMinParallelWork)
  for (int64_t pl = 0; pl < planes; ++pl)
    yp[pl] = hw == 0 ? std::numeric_limits<float>::quiet_NaN()
                     : static_cast<float>(sum_f64(xp + pl * hw, hw) / static_cast<double>(hw));
}

void CpuBackend::global_avgpool_backward_impl(const Tensor& dy, const Tensor& dx) {
  const int64_t planes = dx.size(0) * dx.size(1), hw = dx.size(2) * dx.size(3);
  const float* dyp = dy.f32();
  float* dxp = dx.f32();
#pragma omp parallel for schedule(static) if (planes * hw >= kMinParallelWork)
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float v = dyp[pl] / static_cast<float>(hw);
    std::fill(dxp + pl * hw, dxp + (pl + 1) * hw, v);
  }
}

}  // namespace remat
