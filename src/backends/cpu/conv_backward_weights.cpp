// The CPU conv2d's fp32 filter gradient (conv_internal.h): dw_g [Kg, Cg*R*S] += dy_g [Kg, L]
// @ col_g^T per group, chunk by chunk in order, by the feed ConvGeom chose for y (the
// forward pass's GEMM, transposed). Each dw element is one FMA chain per chunk over the
// chunk's positions in order, added to dw chunk by chunk: the same bits for every feed.
#include <omp.h>

#include <algorithm>

#include "backends/cpu/conv_internal.h"

namespace remat::cpu_conv {

namespace {

// The direct dw sums a chunk's output positions in blocks of this many, so that the block
// of dy^T a tile reads (kDwBlock x NR floats) stays in the L1 cache across tiles.
constexpr int64_t kDwBlock = 192;

// Direct dw: dw_g[ch][kk] += sum over the chunk's positions l of x_pad[pos_off[l] + off[kk]]
// * dy[l][ch], as tiles of MR rows kk by NR channels, each one FMA chain over the chunk in
// position order (the im2col path's order). Called by every thread of a parallel region
// (or outside one): each thread takes a fixed range of tiles and walks the positions in
// blocks of kDwBlock, all its tiles per block, so that the block of dy^T stays in cache;
// the chains continue across blocks through `acc`.
void direct_dw(const MicroKernels& mk, const ConvGeom& g, int64_t len, const float* xpad, const int64_t* off,
               const int64_t* pos_off, const float* dyt, float* acc, float* dw) {
  const int64_t mp = ceil_div(g.grows, MR), blocks = g.kblocks(), tiles = g.dw_tiles();
  const int64_t group_in = g.cg * g.hp * g.wp;
  {
    const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t t0 = tiles * tid / nth, t1 = tiles * (tid + 1) / nth;
    for (int64_t l0 = 0; l0 < len; l0 += kDwBlock) {
      const int64_t depth = std::min(kDwBlock, len - l0);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t gi = t / (blocks * mp), jb = (t / mp) % blocks, ip = t % mp;
        TableA a;
        for (int64_t i = 0; i < MR; ++i) a.rows[i] = xpad + gi * group_in + off[std::min(ip * MR + i, g.grows - 1)];
        a.off = pos_off + l0;
        mk.table_a(depth, a, PackedB{dyt + ((gi * blocks + jb) * len + l0) * NR}, acc + t * MR * NR, l0 > 0);
      }
    }
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t gi = t / (blocks * mp), jb = (t / mp) % blocks, ip = t % mp;
      const int64_t mr = std::min(MR, g.grows - ip * MR), nr = std::min(NR, g.kg - jb * NR);
      const float* tile = acc + t * MR * NR;
      for (int64_t j = 0; j < nr; ++j) {
        float* d = dw + (gi * g.kg + jb * NR + j) * g.grows + ip * MR;
        for (int64_t i = 0; i < mr; ++i) d[i] += tile[i * NR + j];
      }
    }
  }
}

// The direct path, in one parallel region: per chunk each thread pads its images of x and
// packs their dy^T and position offsets; after the barrier that ends that loop, its range
// of dw tiles over the whole chunk; the last barrier guards the chunk's buffers against the
// next chunk.
void weights_direct(const ConvGeom& g, const ConvGeom::BwdLayout& lay, const float* dyp, const float* xp, float* dwp,
                    float* ws) {
  const MicroKernels& mk = micro_kernels();
  const int64_t kplane = g.k * g.plane;
  const auto* off = reinterpret_cast<const int64_t*>(ws + lay.off);
  float* xpad = ws + lay.xpad;
  auto* pos = reinterpret_cast<int64_t*>(ws + lay.pos);
  const Positions xpos{g.plane, g.q, g.sh * g.wp, g.sw};
#pragma omp parallel if (2 * g.n * g.k * g.grows * g.plane >= 64 * cpu::kParallelMinWork)
  for (int64_t n0 = 0; n0 < g.n; n0 += g.nb) {
    const int64_t nb = std::min(g.nb, g.n - n0), len = nb * g.plane;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < nb; ++i) {
      float* xs = xpad + i * g.c * g.hp * g.wp;
      for (int64_t ch = 0; ch < g.c; ++ch)
        pad_plane(xp + ((n0 + i) * g.c + ch) * g.h * g.w, g.h, g.w, g.hp, g.wp, g.ph, g.pw, xs + ch * g.hp * g.wp);
      pack_dy_direct(g, dyp + (n0 + i) * kplane, i, len, ws + lay.dyt);
      for (int64_t l = 0; l < g.plane; l += MR) {
        int64_t in_off[MR], out_off[MR];
        xpos.tile(l, in_off, out_off);
        for (int64_t t = 0; t < std::min(MR, g.plane - l); ++t)
          pos[i * g.plane + l + t] = i * g.c * g.hp * g.wp + in_off[t];
      }
    }
    direct_dw(mk, g, len, xpad, off, pos, ws + lay.dyt, ws + lay.acc, dwp);
#pragma omp barrier
  }
}

// The implicit path (stride 1), one chunk: dw_g^T [Cg*R*S, Kg] = sum over images of x_pad
// rows [Cg*R*S, limg] @ dy^T [limg, Kg].
void weights_implicit_chunk(const ConvGeom& g, const ConvGeom::BwdLayout& lay, int64_t n0, int64_t nb, const float* dyp,
                            const float* xp, float* dwp, float* ws) {
  const MicroKernels& mk = micro_kernels();
  const auto* off = reinterpret_cast<const int64_t*>(ws + lay.off);
  float* xpad = ws + lay.xpad;
  float* dyt = ws + lay.dyt;
  pad_planes(xp, n0, nb, g.c, g.h, g.w, g.hp, g.wp, g.ph, g.pw, xpad);
  pack_dy_t(g, dyp, n0, nb, dyt);
  const int64_t mpc = ceil_div(g.grows, MR), nk = ceil_div(g.kg, NR);
  for_tiles(g.groups * mpc * nk, 2 * MR * NR * nb * g.limg, [&](int64_t t) {
    const int64_t gi = t / (mpc * nk), ip = (t / nk) % mpc, jk = t % nk;
    alignas(64) float tile[MR * NR];
    for (int64_t i = 0; i < nb; ++i) {
      RowsA rows;
      const float* base = xpad + (i * g.c + gi * g.cg) * g.hp * g.wp;
      for (int64_t ii = 0; ii < MR; ++ii) rows.rows[ii] = base + off[std::min(ip * MR + ii, g.grows - 1)];
      mk.rows_a(g.limg, rows, PackedB{dyt + ((gi * nk + jk) * nb + i) * g.limg * NR}, tile, i > 0);
    }
    const int64_t mr = std::min(MR, g.grows - ip * MR), nr = std::min(NR, g.kg - jk * NR);
    for (int64_t j = 0; j < nr; ++j) {
      float* d = dwp + (gi * g.kg + jk * NR + j) * g.grows + ip * MR;
      for (int64_t ii = 0; ii < mr; ++ii) d[ii] += tile[ii * NR + j];
    }
  });
}

// The explicit path, one chunk: dy packed as A panels against im2col^T's B panels.
void weights_im2col_chunk(const ConvGeom& g, const ConvGeom::BwdLayout& lay, int64_t n0, int64_t nb, const float* dyp,
                          const float* xp, float* dwp, float* ws) {
  const MicroKernels& mk = micro_kernels();
  const int64_t len = nb * g.plane;
  float* dya = ws + lay.dya;
  float* colt = ws + lay.colt;
  pack_dy_a(g, dyp, n0, nb, dya);
  im2col_t_panels(g, xp, n0, nb, colt);
  const int64_t mp = ceil_div(g.kg, MR), np = ceil_div(g.grows, NR);
  for_tiles(g.groups * np * mp, 2 * MR * NR * len, [&](int64_t t) {
    const int64_t gi = t / (np * mp), jp = (t / mp) % np, ip = t % mp;
    alignas(64) float tile[MR * NR];
    mk.packed(len, PackedA{dya + (gi * mp + ip) * MR * len}, PackedB{colt + (gi * np + jp) * NR * len}, tile, false);
    const int64_t mr = std::min(MR, g.kg - ip * MR), nr = std::min(NR, g.grows - jp * NR);
    for (int64_t ii = 0; ii < mr; ++ii) {
      float* d = dwp + (gi * g.kg + ip * MR + ii) * g.grows + jp * NR;
      for (int64_t j = 0; j < nr; ++j) d[j] += tile[ii * NR + j];
    }
  });
}

}  // namespace

void conv_backward_weights(const ConvGeom& g, const float* dyp, const float* xp, float* dwp, float* ws) {
  const auto lay = g.bwd_layout();
  if (g.y_feed != Feed::im2col) fill_x_offsets(g, reinterpret_cast<int64_t*>(ws + lay.off));
  if (g.y_feed == Feed::direct) return weights_direct(g, lay, dyp, xp, dwp, ws);
  for (int64_t n0 = 0; n0 < g.n; n0 += g.nb) {
    const int64_t nb = std::min(g.nb, g.n - n0);
    if (g.y_feed == Feed::implicit)
      weights_implicit_chunk(g, lay, n0, nb, dyp, xp, dwp, ws);
    else
      weights_im2col_chunk(g, lay, n0, nb, dyp, xp, dwp, ws);
  }
}

}  // namespace remat::cpu_conv
