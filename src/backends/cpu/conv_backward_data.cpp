// The CPU conv2d's fp32 input gradient (conv_internal.h): dx_g = col2im(w_g^T @ dy_g) per
// group, chunk by chunk, by the feed ConvGeom chose for dx: the explicit path's GEMM and
// col2im; or, for stride 1, the same kind of convolution of the padded dy with the flipped,
// transposed filters (implicit and direct paths, no col2im). Each chunk's dx is its own.
#include <algorithm>
#include <cstring>

#include "backends/cpu/conv_internal.h"

namespace remat::cpu_conv {

namespace {

// The direct path, in one parallel region: per chunk each thread pads its images of dy and
// computes their dx tiles against the flipped filters (B panels of input channels); the
// barrier ending each chunk's loop guards the padded copies.
void data_direct(const ConvGeom& g, const ConvGeom::BwdLayout& lay, const float* dyp, float* dxp, float* ws) {
  const MicroKernels& mk = micro_kernels();
  const auto* offdx = reinterpret_cast<const int64_t*>(ws + lay.offdx);
  float* dypad = ws + lay.dypad;
  const Positions dxpos{g.h * g.w, g.w, g.wq, 1};
#pragma omp parallel if (2 * g.n * g.k * g.grows * g.plane >= 64 * cpu::kParallelMinWork)
  for (int64_t n0 = 0; n0 < g.n; n0 += g.nb) {
    const int64_t nb = std::min(g.nb, g.n - n0);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < nb; ++i) {
      float* ds = dypad + i * g.k * g.hq * g.wq;
      for (int64_t ch = 0; ch < g.k; ++ch)
        pad_plane(dyp + ((n0 + i) * g.k + ch) * g.plane, g.p, g.q, g.hq, g.wq, g.dy_top, g.dy_left,
                  ds + ch * g.hq * g.wq);
      direct_image(mk, dxpos, g.groups, g.cg, ds, g.kg * g.hq * g.wq, offdx, g.krows, ws + lay.wflip,
                   /*forward=*/false, nullptr, dxp + (n0 + i) * g.c * g.h * g.w);
    }
  }
}

// The implicit path (stride 1), one chunk: dx_g [Cg, H x Wq] = flipped w_g^T [Cg, Kg*R*S]
// (A panels, wf_stride floats per group) @ rows of the padded dy, the columns past W dropped.
void data_implicit_chunk(const ConvGeom& g, const ConvGeom::BwdLayout& lay, int64_t wf_stride, int64_t n0, int64_t nb,
                         const float* dyp, float* dxp, float* ws) {
  const MicroKernels& mk = micro_kernels();
  const auto* offdx = reinterpret_cast<const int64_t*>(ws + lay.offdx);
  float* dypad = ws + lay.dypad;
  pad_planes(dyp, n0, nb, g.k, g.p, g.q, g.hq, g.wq, g.dy_top, g.dy_left, dypad);
  const int64_t ntl = ceil_div(g.ldx, NR), mp = ceil_div(g.cg, MR);
  for_tiles(g.groups * nb * ntl * mp, 2 * MR * NR * g.krows, [&](int64_t t) {
    const int64_t gi = t / (nb * ntl * mp), i = (t / (ntl * mp)) % nb, jt = (t / mp) % ntl, ip = t % mp;
    alignas(64) float tile[MR * NR];
    mk.offset_b(g.krows, PackedA{ws + lay.wflip + gi * wf_stride + ip * MR * g.krows},
                OffsetB{dypad + (i * g.k + gi * g.kg) * g.hq * g.wq + jt * NR, offdx}, tile, false);
    const int64_t mr = std::min(MR, g.cg - ip * MR), nr = std::min(NR, g.ldx - jt * NR);
    float* out = dxp + ((n0 + i) * g.c + gi * g.cg + ip * MR) * g.h * g.w;
    for (int64_t ii = 0; ii < mr; ++ii) {
      const float* tr = tile + ii * NR;
      float* orow = out + ii * g.h * g.w;
      for_column_runs(jt * NR, nr, g.wq, g.w, [&](int64_t j, int64_t hh, int64_t ww, int64_t count) {
        std::memcpy(orow + hh * g.w + ww, tr + j, static_cast<size_t>(count) * sizeof(float));
      });
    }
  });
}

// The explicit path, one chunk: col_g [Cg*R*S, L] = w_g^T (A panels, wt_stride floats per
// group) @ dy_g (B panels), then col2im's gather into dx.
void data_im2col_chunk(const ConvGeom& g, const ConvGeom::BwdLayout& lay, int64_t wt_stride, int64_t n0, int64_t nb,
                       const float* dyp, float* dxp, float* ws) {
  const MicroKernels& mk = micro_kernels();
  const int64_t len = nb * g.plane, len_pad = round_up(len, NR);
  float* dyb = ws + lay.dyb;
  float* col = ws + lay.col;
  pack_dy_b(g, dyp, n0, nb, dyb);
  const int64_t mp = ceil_div(g.grows, MR), np = len_pad / NR;
  for_tiles(g.groups * np * mp, 2 * MR * NR * g.kg, [&](int64_t t) {
    const int64_t gi = t / (np * mp), jp = (t / mp) % np, ip = t % mp;
    alignas(64) float tile[MR * NR];
    mk.packed(g.kg, PackedA{ws + lay.wt + gi * wt_stride + ip * MR * g.kg},
              PackedB{dyb + gi * g.kg * len_pad + jp * NR * g.kg}, tile, false);
    const int64_t mr = std::min(MR, g.grows - ip * MR), nr = std::min(NR, len - jp * NR);
    for (int64_t ii = 0; ii < mr; ++ii)
      std::memcpy(col + (gi * g.grows + ip * MR + ii) * len + jp * NR, tile + ii * NR,
                  static_cast<size_t>(nr) * sizeof(float));
  });
  col2im(g, col, n0, nb, dxp);
}

}  // namespace

void conv_backward_data(const ConvGeom& g, const float* dyp, const float* wp, float* dxp, float* ws) {
  const auto lay = g.bwd_layout();
  // The filters, packed once for every chunk: w_g flipped and transposed for the implicit
  // ([Cg, Kg*R*S] A panels) and direct ([Kg*R*S, Cg] B panels) paths, w_g^T [Cg*R*S, Kg]
  // for the explicit one.
  const int64_t wt_stride = round_up(g.grows, MR) * g.kg;
  const int64_t wf_stride = round_up(g.cg, MR) * g.krows;
  const int64_t wfb_stride = g.cblocks() * g.krows * NR;
  auto flipped = [&](int64_t gi, int64_t d, int64_t cc) {
    const int64_t kk = d / (g.r * g.s), rr = g.r - 1 - (d / g.s) % g.r, ss = g.s - 1 - d % g.s;
    return wp[(((gi * g.kg + kk) * g.cg + cc) * g.r + rr) * g.s + ss];
  };
  if (g.dx_feed != Feed::im2col) fill_dy_offsets(g, reinterpret_cast<int64_t*>(ws + lay.offdx));
  if (g.dx_feed == Feed::direct) {
    for (int64_t gi = 0; gi < g.groups; ++gi)
      pack_b(g.krows, g.cg, ws + lay.wflip + gi * wfb_stride,
             [&](int64_t d, int64_t cc) { return flipped(gi, d, cc); });
    return data_direct(g, lay, dyp, dxp, ws);
  }
  if (g.dx_feed == Feed::implicit) {
    for (int64_t gi = 0; gi < g.groups; ++gi)
      pack_a(g.cg, g.krows, ws + lay.wflip + gi * wf_stride, [&](int64_t cc, int64_t d) { return flipped(gi, d, cc); });
  } else {
    for (int64_t gi = 0; gi < g.groups; ++gi)
      pack_a(g.grows, g.kg, ws + lay.wt + gi * wt_stride,
             [&](int64_t kk, int64_t m) { return wp[(gi * g.kg + m) * g.grows + kk]; });
  }
  for (int64_t n0 = 0; n0 < g.n; n0 += g.nb) {
    const int64_t nb = std::min(g.nb, g.n - n0);
    if (g.dx_feed == Feed::implicit)
      data_implicit_chunk(g, lay, wf_stride, n0, nb, dyp, dxp, ws);
    else
      data_im2col_chunk(g, lay, wt_stride, n0, nb, dyp, dxp, ws);
  }
}

}  // namespace remat::cpu_conv
