// Pooling on the CPU: max, average (count_include_pad) and global average, NCHW.
// Every loop is parallel over (image, channel) planes and sequential within a plane, so
// each output element is computed by one thread in a fixed order: results are identical
// for any thread count.
//
// bf16 storage (training.precision bf16): each plane of x, y, dy or dx is read or written
// through fp32 staging (mixed.h) and the fp32 code runs on it: the fp32 op's results on the
// same values, then rounded (dx sums in fp32 and is rounded once).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/mixed.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/simd.h"
#include "remat/error.h"

namespace remat {

namespace {

struct PoolGeom {
  int64_t planes, h, w, p, q;
  int64_t kh, kw, sh, sw, ph, pw;

  PoolGeom(const Shape& x, const Shape& y, const Pool2dParams& prm) {
    planes = x[0] * x[1], h = x[2], w = x[3], p = y[2], q = y[3];
    kh = prm.kernel_h, kw = prm.kernel_w, sh = prm.stride_h, sw = prm.stride_w, ph = prm.pad_h, pw = prm.pad_w;
  }
};

using cpu::sum_f64;

// Max pooling over 2 x 2 windows of stride 2 without padding (the usual pooling layer), a
// row of outputs at a time: the same results as the general loop below (the first maximum
// in scan order wins; a window holding a NaN gives its last NaN). Window offsets: 0 and 1
// on the top row, 2 and 3 on the bottom one.
void maxpool2x2_row(const float* r0, const float* r1, int64_t q, float* d, uint8_t* o) {
  for (int64_t qq = 0; qq < q; ++qq) {
    const float a = r0[2 * qq], b = r0[2 * qq + 1], c = r1[2 * qq], e = r1[2 * qq + 1];
    float best = a;
    uint8_t at = 0;
    if (b > best) best = b, at = 1;
    if (c > best) best = c, at = 2;
    if (e > best) best = e, at = 3;
    if (a != a || b != b || c != c || e != e) {  // the last NaN
      if (a != a) best = a, at = 0;
      if (b != b) best = b, at = 1;
      if (c != c) best = c, at = 2;
      if (e != e) best = e, at = 3;
    }
    d[qq] = best;
    o[qq] = at;
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define REMAT_POOL_AVX512 1
// The same, 16 outputs per step: even and odd columns of both rows deinterleaved, then the
// scalar version's comparisons as masks.
__attribute__((target("avx512f"))) void maxpool2x2_row_avx512(const float* r0, const float* r1, int64_t q, float* d,
                                                              uint8_t* o) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512i ia = _mm512_setzero_si512(), ib = _mm512_set1_epi32(1);
  const __m512i ic = _mm512_set1_epi32(2), ie = _mm512_set1_epi32(3);
  for (int64_t q0 = 0; q0 < q; q0 += 16) {
    const int64_t m = std::min<int64_t>(16, q - q0), in = 2 * m;
    const auto lo = static_cast<__mmask16>(in >= 16 ? 0xFFFF : (1u << in) - 1);
    const auto hi = static_cast<__mmask16>(in >= 32 ? 0xFFFF : in > 16 ? (1u << (in - 16)) - 1 : 0);
    const auto out = static_cast<__mmask16>(m == 16 ? 0xFFFF : (1u << m) - 1);
    const float* p0 = r0 + 2 * q0;
    const float* p1 = r1 + 2 * q0;
    const __m512 t0 = _mm512_maskz_loadu_ps(lo, p0), t1 = _mm512_maskz_loadu_ps(hi, p0 + 16);
    const __m512 u0 = _mm512_maskz_loadu_ps(lo, p1), u1 = _mm512_maskz_loadu_ps(hi, p1 + 16);
    const __m512 a = _mm512_permutex2var_ps(t0, even, t1), b = _mm512_permutex2var_ps(t0, odd, t1);
    const __m512 c = _mm512_permutex2var_ps(u0, even, u1), e = _mm512_permutex2var_ps(u0, odd, u1);
    __m512 best = a;
    __m512i at = ia;
    __mmask16 k = _mm512_cmp_ps_mask(b, best, _CMP_GT_OQ);
    best = _mm512_mask_mov_ps(best, k, b), at = _mm512_mask_mov_epi32(at, k, ib);
    k = _mm512_cmp_ps_mask(c, best, _CMP_GT_OQ);
    best = _mm512_mask_mov_ps(best, k, c), at = _mm512_mask_mov_epi32(at, k, ic);
    k = _mm512_cmp_ps_mask(e, best, _CMP_GT_OQ);
    best = _mm512_mask_mov_ps(best, k, e), at = _mm512_mask_mov_epi32(at, k, ie);
    k = _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    best = _mm512_mask_mov_ps(best, k, a), at = _mm512_mask_mov_epi32(at, k, ia);
    k = _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
    best = _mm512_mask_mov_ps(best, k, b), at = _mm512_mask_mov_epi32(at, k, ib);
    k = _mm512_cmp_ps_mask(c, c, _CMP_UNORD_Q);
    best = _mm512_mask_mov_ps(best, k, c), at = _mm512_mask_mov_epi32(at, k, ic);
    k = _mm512_cmp_ps_mask(e, e, _CMP_UNORD_Q);
    best = _mm512_mask_mov_ps(best, k, e), at = _mm512_mask_mov_epi32(at, k, ie);
    _mm512_mask_storeu_ps(d + q0, out, best);
    _mm512_mask_cvtepi32_storeu_epi8(o + q0, out, at);  // each offset narrowed to its byte
  }
}
#endif

// One plane: src [h, w] -> dst [p, q] and its window offsets.
void maxpool2x2_plane(const PoolGeom& g, const float* src, float* dst, uint8_t* idx) {
#ifdef REMAT_POOL_AVX512
  auto* row = cpu::simd() == cpu::Simd::avx512 ? &maxpool2x2_row_avx512 : &maxpool2x2_row;
#else
  auto* row = &maxpool2x2_row;
#endif
  for (int64_t pp = 0; pp < g.p; ++pp) {
    const float* r0 = src + 2 * pp * g.w;
    row(r0, r0 + g.w, g.q, dst + pp * g.q, idx + pp * g.q);
  }
}

// The general window scan of one plane.
void maxpool_plane(const PoolGeom& g, const float* src, float* dst, uint8_t* idx) {
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
      // The offset within the window, from its top-left corner in padded coordinates.
      const int64_t bh = best / g.w, bw = best - bh * g.w;
      idx[pp * g.q + qq] = static_cast<uint8_t>((bh - h0) * g.kw + (bw - w0));
    }
  }
}

}  // namespace

void CpuBackend::maxpool2d_forward_impl(const Tensor& x, const Pool2dParams& prm, const Tensor& y,
                                        const Tensor& indices) {
  const PoolGeom g(x.shape(), y.shape(), prm);
  uint8_t* ip = indices.u8();
  const bool two = g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2 && g.ph == 0 && g.pw == 0;
  const int64_t window = two ? 4 : g.kh * g.kw, in_plane = g.h * g.w, out_plane = g.p * g.q;
#pragma omp parallel for schedule(static) if (g.planes * out_plane * window >= cpu::kParallelMinWork)
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    cpu::F32Reader rx(x, 0);
    cpu::F32Writer wy(y, 2);
    const float* src = rx.get(pl * in_plane, in_plane);
    float* dst = wy.get(pl * out_plane, out_plane);
    if (two)
      maxpool2x2_plane(g, src, dst, ip + pl * out_plane);
    else
      maxpool_plane(g, src, dst, ip + pl * out_plane);
    wy.put();
  }
}

void CpuBackend::maxpool2d_backward_impl(const Tensor& dy, const Tensor& indices, const Pool2dParams& prm,
                                         const Tensor& dx) {
  const PoolGeom g(dx.shape(), dy.shape(), prm);
  const int64_t in_plane = g.h * g.w, out_plane = g.p * g.q, window = g.kh * g.kw;
  const uint8_t* ip = indices.u8();
  std::atomic<int64_t> bad{-1};  // the first flat position of an offset outside the input, if any
#pragma omp parallel for schedule(static) if (g.planes * (in_plane + out_plane) >= cpu::kParallelMinWork)
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    cpu::F32Reader rdy(dy, 0);
    cpu::F32Writer wdx(dx, 2);
    float* dst = wdx.get(pl * in_plane, in_plane);
    const float* grad = rdy.get(pl * out_plane, out_plane);
    const uint8_t* idx = ip + pl * out_plane;
    std::fill(dst, dst + in_plane, 0.0f);
    // In the order of the outputs, as the flat indices were added before: the same sums.
    for (int64_t pp = 0; pp < g.p; ++pp) {
      for (int64_t qq = 0; qq < g.q; ++qq) {
        const int64_t j = pp * g.q + qq, off = idx[j];
        const int64_t hh = pp * g.sh - g.ph + off / g.kw, ww = qq * g.sw - g.pw + off % g.kw;
        if (off >= window || hh < 0 || hh >= g.h || ww < 0 || ww >= g.w) {
          const int64_t at = pl * out_plane + j;
          int64_t seen = bad.load();
          while ((seen < 0 || at < seen) && !bad.compare_exchange_weak(seen, at)) {
          }
          continue;
        }
        dst[hh * g.w + ww] += grad[j];
      }
    }
    wdx.put();
  }
  const int64_t at = bad.load();
  if (at >= 0)
    REMAT_THROW("maxpool2d_backward: indices ", indices.str(), " hold ", int{ip[at]}, " at flat position ", at,
                ", not an input element of its ", g.kh, "x", g.kw, " window (stride ", g.sh, "x", g.sw, ", padding ",
                g.ph, "x", g.pw, ") in dx ", dx.str());
}

void CpuBackend::avgpool2d_forward_impl(const Tensor& x, const Pool2dParams& prm, const Tensor& y) {
  const PoolGeom g(x.shape(), y.shape(), prm);
  // count_include_pad: the padded window always fits (no ceil mode), so every window
  // divides by kh * kw.
  const float div = static_cast<float>(g.kh * g.kw);
#pragma omp parallel for schedule(static) if (g.planes * g.p * g.q * g.kh * g.kw >= cpu::kParallelMinWork)
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    cpu::F32Reader rx(x, 0);
    cpu::F32Writer wy(y, 2);
    const float* src = rx.get(pl * g.h * g.w, g.h * g.w);
    float* dst = wy.get(pl * g.p * g.q, g.p * g.q);
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
    wy.put();
  }
}

void CpuBackend::avgpool2d_backward_impl(const Tensor& dy, const Pool2dParams& prm, const Tensor& dx) {
  const PoolGeom g(dx.shape(), dy.shape(), prm);
  const float div = static_cast<float>(g.kh * g.kw);
#pragma omp parallel for schedule(static) if (g.planes * (g.h * g.w + g.p * g.q * g.kh * g.kw) >= cpu::kParallelMinWork)
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    cpu::F32Reader rdy(dy, 0);
    cpu::F32Writer wdx(dx, 2);
    float* dst = wdx.get(pl * g.h * g.w, g.h * g.w);
    const float* src = rdy.get(pl * g.p * g.q, g.p * g.q);
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
    wdx.put();
  }
}

void CpuBackend::global_avgpool_forward_impl(const Tensor& x, const Tensor& y) {
  const int64_t planes = x.size(0) * x.size(1), hw = x.size(2) * x.size(3);
#pragma omp parallel for schedule(static) if (planes * hw >= cpu::kParallelMinWork)
  for (int64_t pl = 0; pl < planes; ++pl) {
    cpu::F32Reader rx(x, 0);
    cpu::store_f32(y, pl,
                   hw == 0 ? std::numeric_limits<float>::quiet_NaN()
                           : static_cast<float>(sum_f64(rx.get(pl * hw, hw), hw) / static_cast<double>(hw)));
  }
}

void CpuBackend::global_avgpool_backward_impl(const Tensor& dy, const Tensor& dx) {
  const int64_t planes = dx.size(0) * dx.size(1), hw = dx.size(2) * dx.size(3);
#pragma omp parallel for schedule(static) if (planes * hw >= cpu::kParallelMinWork)
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float v = cpu::load_f32(dy, pl) / static_cast<float>(hw);
    cpu::F32Writer wdx(dx, 2);
    float* d = wdx.get(pl * hw, hw);
    std::fill(d, d + hw, v);
    wdx.put();
  }
}

}  // namespace remat
