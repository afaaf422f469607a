// The CPU conv2d's fp32 forward pass (conv_internal.h): y_g [Kg, L] = w_g [Kg, Cg*R*S] @
// col_g [Cg*R*S, L] (+ bias) per group, over chunks of images, by the feed ConvGeom chose.
#include <algorithm>

#include "backends/cpu/conv_internal.h"

namespace remat::cpu_conv {

namespace {

// The direct path: w^T packed once into B panels; one parallel region in which each thread
// pads its images of a chunk and computes their tiles (the barrier ending each chunk's loop
// guards the padded copies).
void forward_direct(const ConvGeom& g, const ConvGeom::FwdLayout& lay, const float* xp, const float* wp,
                    const float* bp, float* yp, float* ws) {
  const MicroKernels& mk = micro_kernels();
  const int64_t kplane = g.k * g.plane;
  const int64_t b_stride = g.kblocks() * g.grows * NR;
  for (int64_t gi = 0; gi < g.groups; ++gi)
    pack_b(g.grows, g.kg, ws + lay.b + gi * b_stride,
           [&](int64_t kk, int64_t ch) { return wp[(gi * g.kg + ch) * g.grows + kk]; });
  float* xpad = ws + lay.xpad;
  const auto* off = reinterpret_cast<const int64_t*>(ws + lay.off);
  const Positions ps{g.plane, g.q, g.sh * g.wp, g.sw};
  const int64_t image_in = g.c * g.hp * g.wp;
#pragma omp parallel if (2 * g.n * g.k * g.grows * g.plane >= 64 * cpu::kParallelMinWork)
  for (int64_t n0 = 0; n0 < g.n; n0 += g.nb) {
    const int64_t nb = std::min(g.nb, g.n - n0);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < nb; ++i) {
      float* xs = xpad + i * image_in;
      for (int64_t ch = 0; ch < g.c; ++ch)
        pad_plane(xp + ((n0 + i) * g.c + ch) * g.h * g.w, g.h, g.w, g.hp, g.wp, g.ph, g.pw, xs + ch * g.hp * g.wp);
      direct_image(mk, ps, g.groups, g.kg, xs, g.cg * g.hp * g.wp, off, g.grows, ws + lay.b, /*forward=*/true, bp,
                   yp + (n0 + i) * kplane);
    }
  }
}

// The implicit path (stride 1): the packed w (pa, a_stride floats per group) against the
// padded chunk read through the offset table, outputs computed on the padded width and the
// columns past Q dropped.
void forward_implicit(const ConvGeom& g, const ConvGeom::FwdLayout& lay, const float* pa, int64_t a_stride,
                      const float* xp, const float* bp, float* yp, float* ws) {
  const MicroKernels& mk = micro_kernels();
  const int64_t kplane = g.k * g.plane, mp = ceil_div(g.kg, MR);
  const auto* off = reinterpret_cast<const int64_t*>(ws + lay.off);
  float* xpad = ws + lay.xpad;
  const int64_t ntl = ceil_div(g.limg, NR);
  for (int64_t n0 = 0; n0 < g.n; n0 += g.nb) {
    const int64_t nb = std::min(g.nb, g.n - n0);
    pad_planes(xp, n0, nb, g.c, g.h, g.w, g.hp, g.wp, g.ph, g.pw, xpad);
    for_tiles(g.groups * nb * ntl * mp, 2 * MR * NR * g.grows, [&](int64_t t) {
      const int64_t gi = t / (nb * ntl * mp), i = (t / (ntl * mp)) % nb, jt = (t / mp) % ntl, ip = t % mp;
      alignas(64) float tile[MR * NR];
      mk.offset_b(g.grows, PackedA{pa + gi * a_stride + ip * MR * g.grows},
                  OffsetB{xpad + (i * g.c + gi * g.cg) * g.hp * g.wp + jt * NR, off}, tile, false);
      const int64_t mr = std::min(MR, g.kg - ip * MR), nr = std::min(NR, g.limg - jt * NR);
      float* out = yp + (n0 + i) * kplane + (gi * g.kg + ip * MR) * g.plane;
      for (int64_t ii = 0; ii < mr; ++ii) {
        const float bias = bp ? bp[gi * g.kg + ip * MR + ii] : 0.0f;
        const float* tr = tile + ii * NR;
        float* orow = out + ii * g.plane;
        for_column_runs(jt * NR, nr, g.wp, g.q, [&](int64_t j, int64_t pp, int64_t qq, int64_t count) {
          float* d = orow + pp * g.q + qq;
          for (int64_t t = 0; t < count; ++t) d[t] = tr[j + t] + bias;
        });
      }
    });
  }
}

// The explicit path: per chunk, im2col into B panels, then the packed w (pa) against them.
void forward_im2col(const ConvGeom& g, const ConvGeom::FwdLayout& lay, const float* pa, int64_t a_stride,
                    const float* xp, const float* bp, float* yp, float* ws) {
  const MicroKernels& mk = micro_kernels();
  const int64_t kplane = g.k * g.plane, mp = ceil_div(g.kg, MR);
  float* pb = ws + lay.b;
  for (int64_t n0 = 0; n0 < g.n; n0 += g.nb) {
    const int64_t nb = std::min(g.nb, g.n - n0), len = nb * g.plane, len_pad = round_up(len, NR);
    im2col_panels(g, xp, n0, nb, pb);
    const int64_t np = len_pad / NR;
    float* out = yp + n0 * kplane;
    for_tiles(g.groups * np * mp, 2 * MR * NR * g.grows, [&](int64_t t) {
      const int64_t gi = t / (np * mp), jp = (t / mp) % np, ip = t % mp;
      alignas(64) float tile[MR * NR];
      mk.packed(g.grows, PackedA{pa + gi * a_stride + ip * MR * g.grows},
                PackedB{pb + gi * g.grows * len_pad + jp * NR * g.grows}, tile, false);
      const int64_t mr = std::min(MR, g.kg - ip * MR), nr = std::min(NR, len - jp * NR);
      const int64_t j0 = jp * NR;
      for (int64_t ii = 0; ii < mr; ++ii) {
        const int64_t m = gi * g.kg + ip * MR + ii;
        const float bias = bp ? bp[m] : 0.0f;
        const float* tr = tile + ii * NR;
        for_column_runs(j0, nr, g.plane, g.plane, [&](int64_t j, int64_t img, int64_t pos, int64_t count) {
          float* d = out + img * kplane + m * g.plane + pos;
          for (int64_t t = 0; t < count; ++t) d[t] = tr[j + t] + bias;
        });
      }
    });
  }
}

}  // namespace

void conv_forward(const ConvGeom& g, const float* xp, const float* wp, const float* bp, float* yp, float* ws) {
  if (g.trivial()) {  // y is the bias
    const int64_t units = g.n * g.k;
#pragma omp parallel for schedule(static) if (units * g.plane >= cpu::kParallelMinWork)
    for (int64_t u = 0; u < units; ++u) std::fill(yp + u * g.plane, yp + (u + 1) * g.plane, bp ? bp[u % g.k] : 0.0f);
    return;
  }
  const auto lay = g.fwd_layout();
  if (g.y_feed != Feed::im2col) fill_x_offsets(g, reinterpret_cast<int64_t*>(ws + lay.off));
  if (g.y_feed == Feed::direct) return forward_direct(g, lay, xp, wp, bp, yp, ws);

  // The implicit and explicit paths share w packed into MR-row A panels.
  float* pa = ws + lay.a;
  const int64_t a_stride = round_up(g.kg, MR) * g.grows;
  for (int64_t gi = 0; gi < g.groups; ++gi)
    pack_a(g.kg, g.grows, pa + gi * a_stride,
           [&](int64_t i, int64_t kk) { return wp[(gi * g.kg + i) * g.grows + kk]; });
  if (g.y_feed == Feed::implicit) return forward_implicit(g, lay, pa, a_stride, xp, bp, yp, ws);
  forward_im2col(g, lay, pa, a_stride, xp, bp, yp, ws);
}

}  // namespace remat::cpu_conv
