// How the CPU conv2d's GEMMs get their operands (conv_internal.h; conv.cpp's overview):
// - explicit: im2col into the micro-kernel's B panels, col2im back, dy packed as A or B;
// - implicit (stride 1): zero-padded copies the micro-kernel reads through offset tables,
//   and dy transposed for dw;
// - direct: tiles of MR output positions by NR channels over the padded input, and dy^T
//   packed for dw.
// Every loop is an OpenMP loop over disjoint outputs (bitwise the same for any thread count).
#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cpu/conv_internal.h"

namespace remat::cpu_conv {

namespace {

// First output index o >= 0 with o * stride >= t.
inline int64_t first_at_least(int64_t t, int64_t stride) { return t <= 0 ? 0 : (t + stride - 1) / stride; }

// Output range [lo, hi) whose input coordinate o * stride + off lies in [0, size).
inline void valid_range(int64_t off, int64_t stride, int64_t size, int64_t out, int64_t* lo, int64_t* hi) {
  *lo = std::min(out, first_at_least(-off, stride));
  *hi = std::min(out, std::max(*lo, first_at_least(size - off, stride)));
}

}  // namespace

// ---- Explicit path: im2col / col2im and packing ------------------------------------------

// im2col into B panels: B_g[kk][l] = x[n0 + i, g*Cg + c, p*sh - ph + r*dh, q*sw - pw + s*dw]
// for kk = (c, r, s) and l = (i, p, q), 0 in the padding and past the chunk's columns.
// One panel (NR columns, every row) per iteration: the writes are sequential.
void im2col_panels(const ConvGeom& g, const float* x, int64_t n0, int64_t nb, float* b) {
  const int64_t len = nb * g.plane, np = ceil_div(len, NR), units = g.groups * np;
  std::vector<int64_t> qrange_v(static_cast<size_t>(2 * g.s));  // valid q range of each s
  for (int64_t ss = 0; ss < g.s; ++ss)
    valid_range(ss * g.dw - g.pw, g.sw, g.w, g.q, &qrange_v[static_cast<size_t>(2 * ss)],
                &qrange_v[static_cast<size_t>(2 * ss + 1)]);
  const int64_t* qrange = qrange_v.data();
#pragma omp parallel for schedule(static) if (units * NR * g.grows >= cpu::kParallelMinWork)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t gi = u / np, jp = u % np;
    float* panel = b + (gi * np + jp) * NR * g.grows;
    // The panel's columns as runs within one output row: (image, p, first q, count, slot).
    struct Run {
      int64_t i, p, q0, count, slot;
    };
    Run runs[NR];
    int64_t nruns = 0;
    for (int64_t l = jp * NR, end = std::min(len, jp * NR + NR); l < end;) {
      const int64_t i = l / g.plane, pos = l % g.plane, pp = pos / g.q, qq = pos % g.q;
      const int64_t count = std::min(end - l, g.q - qq);
      runs[nruns++] = Run{i, pp, qq, count, l - jp * NR};
      l += count;
    }
    const int64_t filled = std::min(len - jp * NR, NR);
    float* d = panel;  // row kk = (c, r, s), in order
    for (int64_t cc = 0; cc < g.cg; ++cc) {
      const int64_t ch = gi * g.cg + cc;
      for (int64_t rr = 0; rr < g.r; ++rr) {
        const int64_t hoff = rr * g.dh - g.ph;
        for (int64_t ss = 0; ss < g.s; ++ss, d += NR) {
          const int64_t woff = ss * g.dw - g.pw;
          const int64_t q_lo = qrange[2 * ss], q_hi = qrange[2 * ss + 1];
          for (int64_t t = 0; t < nruns; ++t) {
            const Run& run = runs[t];
            float* dr = d + run.slot;
            const int64_t hh = run.p * g.sh + hoff;
            if (hh < 0 || hh >= g.h) {
              for (int64_t j = 0; j < run.count; ++j) dr[j] = 0.0f;
              continue;
            }
            const float* srow = x + (((n0 + run.i) * g.c + ch) * g.h + hh) * g.w + woff;
            const int64_t lo = std::clamp(q_lo - run.q0, int64_t{0}, run.count);
            const int64_t hi = std::clamp(q_hi - run.q0, lo, run.count);
            for (int64_t j = 0; j < lo; ++j) dr[j] = 0.0f;
            if (g.sw == 1) {
              const float* sr = srow + run.q0;
              for (int64_t j = lo; j < hi; ++j) dr[j] = sr[j];
            } else {
              for (int64_t j = lo; j < hi; ++j) dr[j] = srow[(run.q0 + j) * g.sw];
            }
            for (int64_t j = hi; j < run.count; ++j) dr[j] = 0.0f;
          }
          for (int64_t j = filled; j < NR; ++j) d[j] = 0.0f;  // past the chunk's last column
        }
      }
    }
  }
}

// im2col transposed into B panels over the column-matrix rows: B_g[l][kk] (depth L, width
// Cg*R*S), for the dw GEMM; rows past Cg*R*S are zero. One (group, panel, image) per
// iteration, position by position, so that each position's NR values are written together.
void im2col_t_panels(const ConvGeom& g, const float* x, int64_t n0, int64_t nb, float* b) {
  const int64_t len = nb * g.plane, np = ceil_div(g.grows, NR), units = g.groups * np * nb;
  const int64_t group_stride = np * NR * len;
#pragma omp parallel for schedule(static) if (units * NR * g.plane >= cpu::kParallelMinWork)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t gi = u / (np * nb), jp = (u / nb) % np, i = u % nb;
    float* panel = b + gi * group_stride + jp * NR * len + i * g.plane * NR;  // row l = i * plane
    const float* src = x + (n0 + i) * g.c * g.h * g.w;
    const int64_t jn = std::min(NR, g.grows - jp * NR);  // real rows in this panel
    // Per row: the input offset of output position (0, 0), and its valid output ranges.
    int64_t off[NR], p_lo[NR], p_hi[NR], q_lo[NR], q_hi[NR];
    int64_t in_p_lo = 0, in_p_hi = g.p, in_q_lo = 0, in_q_hi = g.q;  // where every row is valid
    for (int64_t j = 0; j < jn; ++j) {
      const int64_t kk = jp * NR + j;
      const int64_t ch = gi * g.cg + kk / (g.r * g.s), rr = (kk / g.s) % g.r, ss = kk % g.s;
      const int64_t hoff = rr * g.dh - g.ph, woff = ss * g.dw - g.pw;
      off[j] = ch * g.h * g.w + hoff * g.w + woff;
      valid_range(hoff, g.sh, g.h, g.p, &p_lo[j], &p_hi[j]);
      valid_range(woff, g.sw, g.w, g.q, &q_lo[j], &q_hi[j]);
      in_p_lo = std::max(in_p_lo, p_lo[j]), in_p_hi = std::min(in_p_hi, p_hi[j]);
      in_q_lo = std::max(in_q_lo, q_lo[j]), in_q_hi = std::min(in_q_hi, q_hi[j]);
    }
    for (int64_t pp = 0; pp < g.p; ++pp) {
      const bool row_inside = pp >= in_p_lo && pp < in_p_hi;
      for (int64_t qq = 0; qq < g.q; ++qq) {
        float* d = panel + (pp * g.q + qq) * NR;
        const int64_t pos = pp * g.sh * g.w + qq * g.sw;
        if (row_inside && qq >= in_q_lo && qq < in_q_hi) {
          for (int64_t j = 0; j < jn; ++j) d[j] = src[off[j] + pos];
        } else {
          for (int64_t j = 0; j < jn; ++j)
            d[j] = pp >= p_lo[j] && pp < p_hi[j] && qq >= q_lo[j] && qq < q_hi[j] ? src[off[j] + pos] : 0.0f;
        }
        for (int64_t j = jn; j < NR; ++j) d[j] = 0.0f;
      }
    }
  }
}

// dx[n0 + i, c] = sum over (r, s, p, q) of the plain column matrix col [C*R*S, L] at the
// positions im2col read from; one (image, channel) plane per iteration, in a fixed order.
void col2im(const ConvGeom& g, const float* col, int64_t n0, int64_t nb, float* dx) {
  const int64_t len = nb * g.plane, units = nb * g.c;
#pragma omp parallel for schedule(static) if (units * g.r * g.s * g.plane >= cpu::kParallelMinWork)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t i = u / g.c, ch = u % g.c;
    float* dst = dx + ((n0 + i) * g.c + ch) * g.h * g.w;
    std::fill(dst, dst + g.h * g.w, 0.0f);
    for (int64_t rr = 0; rr < g.r; ++rr) {
      const int64_t hoff = rr * g.dh - g.ph;
      int64_t p_lo, p_hi;
      valid_range(hoff, g.sh, g.h, g.p, &p_lo, &p_hi);
      for (int64_t ss = 0; ss < g.s; ++ss) {
        const int64_t woff = ss * g.dw - g.pw;
        int64_t q_lo, q_hi;
        valid_range(woff, g.sw, g.w, g.q, &q_lo, &q_hi);
        const float* src = col + ((ch * g.r + rr) * g.s + ss) * len + i * g.plane;
        for (int64_t pp = p_lo; pp < p_hi; ++pp) {
          float* drow = dst + (pp * g.sh + hoff) * g.w + woff;
          const float* srow = src + pp * g.q;
          if (g.sw == 1) {
            for (int64_t qq = q_lo; qq < q_hi; ++qq) drow[qq] += srow[qq];
          } else {
            for (int64_t qq = q_lo; qq < q_hi; ++qq) drow[qq * g.sw] += srow[qq];
          }
        }
      }
    }
  }
}

// dy of a chunk (group g, channel rows) as A panels: A_g[m][l] = dy[n0 + l/PQ, g*Kg + m, l%PQ],
// depth L. One (group, panel, image) per iteration.
void pack_dy_a(const ConvGeom& g, const float* dy, int64_t n0, int64_t nb, float* a) {
  const int64_t len = nb * g.plane, mp = ceil_div(g.kg, MR), units = g.groups * mp * nb;
  const int64_t kplane = g.k * g.plane;
#pragma omp parallel for schedule(static) if (units * MR * g.plane >= cpu::kParallelMinWork)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t gi = u / (mp * nb), ip = (u / nb) % mp, i = u % nb;
    float* d = a + (gi * mp + ip) * MR * len + i * g.plane * MR;
    const int64_t rows = std::min(MR, g.kg - ip * MR);
    const float* src = dy + (n0 + i) * kplane + (gi * g.kg + ip * MR) * g.plane;
    for (int64_t l = 0; l < g.plane; ++l)
      for (int64_t t = 0; t < MR; ++t) d[l * MR + t] = t < rows ? src[t * g.plane + l] : 0.0f;
  }
}

// Writes runs of values into one row of B panels (depth `kdim`, row `kk`): column l goes to
// panel l / NR, slot l % NR.
struct PanelRowWriter {
  int64_t panel_stride, j;
  float* at;

  PanelRowWriter(float* b, int64_t kdim, int64_t kk, int64_t l0)
      : panel_stride(kdim * NR), j(l0 % NR), at(b + kk * NR + (l0 / NR) * kdim * NR) {}

  void advance(int64_t m) {
    j += m;
    if (j == NR) {
      j = 0;
      at += panel_stride;
    }
  }
  void zeros(int64_t count) {
    while (count > 0) {
      const int64_t m = std::min(count, NR - j);
      std::fill(at + j, at + j + m, 0.0f);
      count -= m;
      advance(m);
    }
  }
  void copy(const float* src, int64_t count) {
    while (count > 0) {
      const int64_t m = std::min(count, NR - j);
      std::memcpy(at + j, src, static_cast<size_t>(m) * sizeof(float));
      src += m;
      count -= m;
      advance(m);
    }
  }
};

// dy of a chunk as B panels: B_g[k][l] = dy[n0 + l/PQ, g*Kg + k, l%PQ], depth Kg.
void pack_dy_b(const ConvGeom& g, const float* dy, int64_t n0, int64_t nb, float* b) {
  const int64_t len = nb * g.plane, len_pad = round_up(len, NR), units = g.k * nb;
  const int64_t kplane = g.k * g.plane;
#pragma omp parallel for schedule(static) if (units * g.plane >= cpu::kParallelMinWork)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t kk = u / nb, i = u % nb, gi = kk / g.kg;
    PanelRowWriter out(b + gi * g.kg * len_pad, g.kg, kk % g.kg, i * g.plane);
    out.copy(dy + (n0 + i) * kplane + kk * g.plane, g.plane);
    if (i == nb - 1 && len_pad > len) out.zeros(len_pad - len);
  }
}

// ---- Implicit path: padded copies --------------------------------------------------------

// d (a rows x cols plane) = s (an h x w plane) placed at (top, left), zero elsewhere.
void pad_plane(const float* s, int64_t h, int64_t w, int64_t rows, int64_t cols, int64_t top, int64_t left, float* d) {
  std::fill(d, d + top * cols, 0.0f);
  for (int64_t y = 0; y < h; ++y) {
    float* drow = d + (top + y) * cols;
    std::fill(drow, drow + left, 0.0f);
    std::memcpy(drow + left, s + y * w, static_cast<size_t>(w) * sizeof(float));
    std::fill(drow + left + w, drow + cols, 0.0f);
  }
  std::fill(d + (top + h) * cols, d + rows * cols, 0.0f);
}

// dst[i][ch] (rows x cols planes, plus NR zeros of slack at the end) = src[n0 + i][ch]
// (h x w planes) placed at (top, left), zero elsewhere.
void pad_planes(const float* src, int64_t n0, int64_t nb, int64_t channels, int64_t h, int64_t w, int64_t rows,
                int64_t cols, int64_t top, int64_t left, float* dst) {
  const int64_t units = nb * channels, dplane = rows * cols;
#pragma omp parallel for schedule(static) if (units * dplane >= cpu::kParallelMinWork)
  for (int64_t u = 0; u < units; ++u)
    pad_plane(src + (n0 * channels + u) * h * w, h, w, rows, cols, top, left, dst + u * dplane);
  std::fill(dst + units * dplane, dst + units * dplane + NR, 0.0f);
}

// dy of a chunk, transposed, as B panels for the implicit dw: for image i, column l = p*Wp + q
// of the padded width, B[l][k] = dy[n0 + i, g*Kg + k, p, q] (0 for q >= Q and k >= Kg).
// Layout: [group][k panel][image][l][NR].
void pack_dy_t(const ConvGeom& g, const float* dy, int64_t n0, int64_t nb, float* b) {
  const int64_t nk = ceil_div(g.kg, NR), units = g.groups * nk * nb, kplane = g.k * g.plane;
#pragma omp parallel for schedule(static) if (units * NR * g.limg >= cpu::kParallelMinWork)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t gi = u / (nk * nb), jk = (u / nb) % nk, i = u % nb;
    float* d = b + u * g.limg * NR;
    const int64_t jn = std::min(NR, g.kg - jk * NR);
    const float* src = dy + (n0 + i) * kplane + (gi * g.kg + jk * NR) * g.plane;
    for (int64_t pp = 0; pp < g.p; ++pp) {
      const int64_t cols = pp == g.p - 1 ? g.q : g.wp;
      for (int64_t qq = 0; qq < cols; ++qq, d += NR) {
        if (qq >= g.q) {
          std::fill(d, d + NR, 0.0f);
          continue;
        }
        const float* s = src + pp * g.q + qq;
        for (int64_t j = 0; j < jn; ++j) d[j] = s[j * g.plane];
        for (int64_t j = jn; j < NR; ++j) d[j] = 0.0f;
      }
    }
  }
}

// ---- Direct path: tiles of MR output positions by NR channels -----------------------------

// One image: out[group * channels + ch][pos] = sum over d of in[position + off[d]] *
// b[d][ch] (+ bias[ch] in the forward pass, + 0 without one, as the other paths do), for
// every group: `in` holds the image's padded input (in_group floats between groups), b the
// B panels [group][channel block][depth][NR]. Tiles of MR positions by NR channels, channel
// blocks innermost (they share the A rows); one thread.
void direct_image(const MicroKernels& mk, const Positions& ps, int64_t groups, int64_t channels, const float* in,
                  int64_t in_group, const int64_t* off, int64_t depth, const float* b, bool forward, const float* bias,
                  float* out) {
  const int64_t blocks = ceil_div(channels, NR), ptiles = ceil_div(ps.plane, MR);
  for (int64_t t = 0; t < groups * ptiles * blocks; ++t) {
    const int64_t gi = t / (ptiles * blocks), pt = (t / blocks) % ptiles, jb = t % blocks;
    int64_t in_off[MR], out_off[MR];
    ps.tile(pt * MR, in_off, out_off);
    TableA a;
    for (int64_t i = 0; i < MR; ++i) a.rows[i] = in + gi * in_group + in_off[i];
    a.off = off;
    alignas(64) float tile[MR * NR];
    mk.table_a(depth, a, PackedB{b + (gi * blocks + jb) * depth * NR}, tile, false);
    const int64_t mr = std::min(MR, ps.plane - pt * MR), nr = std::min(NR, channels - jb * NR);
    const int64_t ch0 = gi * channels + jb * NR;
    float add[NR];
    for (int64_t j = 0; j < nr; ++j) add[j] = bias ? bias[ch0 + j] : 0.0f;
    int64_t j0 = 0;
    if (mr == MR) {  // the positions are one run of each channel's plane
      static_assert(MR == 8, "the stores transpose 8 x 8 blocks");
      for (; j0 + 8 <= nr; j0 += 8)
        transpose8(tile + j0, NR, out + (ch0 + j0) * ps.plane + out_off[0], ps.plane, forward ? add + j0 : nullptr);
    }
    for (int64_t j = j0; j < nr; ++j) {
      float* o = out + (ch0 + j) * ps.plane;
      if (forward) {
        for (int64_t i = 0; i < mr; ++i) o[out_off[i]] = tile[i * NR + j] + add[j];
      } else {
        for (int64_t i = 0; i < mr; ++i) o[out_off[i]] = tile[i * NR + j];
      }
    }
  }
}

// dy of image i of a chunk (len positions) transposed into the direct dw's B panels of NR
// channels: b[((gi * blocks + jb) * len + i * PQ + pos) * NR + j] =
// dy[n0 + i, gi * Kg + jb * NR + j, pos], zero past Kg. One thread.
void pack_dy_direct(const ConvGeom& g, const float* dy_image, int64_t i, int64_t len, float* b) {
  const int64_t blocks = g.kblocks();
  for (int64_t gi = 0; gi < g.groups; ++gi)
    for (int64_t jb = 0; jb < blocks; ++jb) {
      float* d = b + ((gi * blocks + jb) * len + i * g.plane) * NR;
      const int64_t jn = std::min(NR, g.kg - jb * NR);
      const float* src = dy_image + (gi * g.kg + jb * NR) * g.plane;
      const int64_t j8 = jn / 8 * 8, l8 = g.plane / 8 * 8;
      for (int64_t l = 0; l < l8; l += 8)
        for (int64_t j = 0; j < j8; j += 8) transpose8(src + j * g.plane + l, g.plane, d + l * NR + j, NR);
      for (int64_t l = 0; l < g.plane; ++l, d += NR) {
        for (int64_t j = l < l8 ? j8 : 0; j < jn; ++j) d[j] = src[j * g.plane + l];
        for (int64_t j = jn; j < NR; ++j) d[j] = 0.0f;
      }
    }
}

// off[kk] for kk = (c, r, s) of a group: where row kk of the column matrix starts in the
// group's padded input, relative to an output position's window.
void fill_x_offsets(const ConvGeom& g, int64_t* off) {
  for (int64_t cc = 0, kk = 0; cc < g.cg; ++cc)
    for (int64_t rr = 0; rr < g.r; ++rr)
      for (int64_t ss = 0; ss < g.s; ++ss) off[kk++] = (cc * g.hp + rr * g.dh) * g.wp + ss * g.dw;
}

// The same for the dx of stride 1 over the padded dy: d = (k, r, s) of a group.
void fill_dy_offsets(const ConvGeom& g, int64_t* off) {
  for (int64_t kk = 0, d = 0; kk < g.kg; ++kk)
    for (int64_t rr = 0; rr < g.r; ++rr)
      for (int64_t ss = 0; ss < g.s; ++ss) off[d++] = (kk * g.hq + rr * g.dh) * g.wq + ss * g.dw;
}

}  // namespace remat::cpu_conv
