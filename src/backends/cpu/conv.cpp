// conv2d on the CPU: GEMMs of our own over a chunk of images at a time.
//
// Per group g, with L the chunk's output positions:
//   forward   y_g [Kg, L]        = w_g [Kg, Cg*R*S] @ col_g [Cg*R*S, L]   (+ bias)
//   backward  dw_g [Kg, Cg*R*S] += dy_g [Kg, L] @ col_g^T
//             dx_g               = col2im(w_g^T @ dy_g)
// Three ways to feed the GEMMs:
// - im2col (any stride): im2col writes the column matrix straight into the panel layout
//   the micro-kernel reads, and col2im folds w^T @ dy back into dx;
// - implicit (stride 1): with the input zero-padded to Hp x Wp, row (c, r, s) of the column
//   matrix at output (p, q) is x_pad[c][p + r*dh][q + s*dw], i.e. x_pad at the flat offset
//   off(c, r, s) + p*Wp + q. Computing outputs on the padded width (columns q >= Q are
//   computed and dropped) makes every B row a contiguous run of x_pad, so the micro-kernel
//   reads x_pad directly through a table of row offsets and no column matrix exists. dx is
//   the same kind of convolution of the padded dy with the flipped, transposed filters, so
//   no col2im either; dw reads x_pad rows as the A operand;
// - direct (any stride; dx for stride 1): the transposed GEMMs, y_g^T [L, Kg] =
//   col_g^T @ w_g^T, in tiles of MR output positions by NR channels. The A operand is
//   x_pad read where each position's window starts (any row, any stride) plus off(c, r, s);
//   the B operand is w_g^T packed once, channels in the vectors. Nothing is computed on
//   the padding and nothing is copied but the padded input. dx likewise over the padded dy
//   (positions of x by input channels); dw is dy^T (packed, channels in the vectors)
//   against x_pad at (position + off(c, r, s)), depth over the chunk's positions.
// Each GEMM takes the cheapest way that applies, counting the rows and lanes computed and
// dropped (MR-row panels, NR-wide channel vectors, the padded width) and im2col's passes
// over memory (ConvGeom::choose_feeds): for 32 or 64 channels that is the direct path.
// The GEMM epilogues write y (NCHW, plus bias), dx, or add into dw directly.
//
// Determinism: every loop, the GEMM included, is an OpenMP loop over disjoint outputs, and
// each output element is summed by one thread in a fixed order (one FMA chain over the
// GEMM depth), so results are bitwise identical for any thread count. The micro-kernel has
// AVX-512 and AVX2 versions chosen at run time and a portable one; all compute the same FMA
// chains, so they agree bit for bit. The three paths give bitwise equal y and dw for the
// same chunks (the same products in the same order; the dropped columns add exact zeros to
// dw), and dx within rounding (col2im sums over (r, s) separately; the implicit and direct
// dx are bitwise equal).
//
// Why not cblas_sgemm: OpenBLAS's pthread build runs its own thread pool beside OpenMP's,
// and the two oversubscribe the cores at every hand-over between im2col and GEMM (an
// im2col + sgemm version of this file measured 2-5x slower on 2 busy cores than with
// OMP_WAIT_POLICY=passive or one thread); its results also change with its thread count;
// and its kernels for this CPU generation were AVX2 ones at about half our AVX-512 rate.
//
// Workspace: the packed operands and padded copies of one chunk. The chunk size and the
// path, and so the workspace, depend only on the shapes (the meta backend reuses the
// queries).
//
// The files (conv_internal.h is what they share): conv.cpp (this one: the ops, the bias
// gradient, bf16 staging), conv_geom.cpp (geometry, chunks, the choice of feed, workspace
// layouts), conv_feeds.cpp (im2col / col2im, packing, padded copies, the direct path's tiles),
// conv_forward.cpp, conv_backward_weights.cpp (dw), conv_backward_data.cpp (dx),
// conv_microkernels.cpp (the micro-kernels and 8 x 8 transposes: all the SIMD code).
#include <algorithm>
#include <vector>

#include "backends/cpu/bf16.h"
#include "backends/cpu/conv_internal.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/mixed.h"
#include "backends/cpu/parallel.h"
#include "remat/error.h"

namespace remat {

namespace {

using cpu_conv::ConvGeom;
using cpu_conv::round_up;

// db[k] += the sum of dy over images and positions: per channel one double sum over the
// images in order (cpu::sum_f64 of each plane), whatever the chunks.
void conv_bias_grad(const ConvGeom& g, const Tensor& dy, float* dbp) {
  const int64_t kplane = g.k * g.plane;
  if (g.n == 0) return;
#pragma omp parallel for schedule(static) if (g.n * kplane >= cpu::kParallelMinWork)
  for (int64_t kk = 0; kk < g.k; ++kk) {
    cpu::F32Reader rdy(dy, 0);
    double sum = 0.0;
    for (int64_t i = 0; i < g.n; ++i) sum += cpu::sum_f64(rdy.get(i * kplane + kk * g.plane, g.plane), g.plane);
    dbp[kk] += static_cast<float>(sum);
  }
}

// The fp32 dx (when dxp) and dw += (when dwp) of the images of g (dy, x, dx and the workspace
// layout of g). The bias gradient is conv_bias_grad's.
void conv_backward(const ConvGeom& g, const float* dyp, const float* xp, const float* wp, float* dxp, float* dwp,
                   float* ws) {
  if (!dxp && !dwp) return;
  if (g.trivial()) {  // dx is 0 (no output position or filter sees it); dw gets nothing
    if (dxp) std::fill(dxp, dxp + g.n * g.c * g.h * g.w, 0.0f);
    return;
  }
  if (dwp) cpu_conv::conv_backward_weights(g, dyp, xp, dwp, ws);
  if (dxp) cpu_conv::conv_backward_data(g, dyp, wp, dxp, ws);
}

// ---- bf16 storage (training.precision bf16) --------------------------------------------
// A bf16 x, y, dy or dx is staged a chunk of images at a time (the op's own chunks, ConvGeom::nb)
// in fp32 after the chunk's fp32 workspace, and each chunk runs the fp32 code above as a
// convolution of its own images. A chunk's geometry is that of the whole op's chunk (the same
// feeds, one chunk), so y and dx are bitwise the fp32 op's on the same (rounded) values
// before their own rounding, and dw and db too (dw adds chunk by chunk in order, db is
// summed over the whole batch as in fp32). The filters and the bias (bf16 working copies)
// are widened whole into staging (parameter-sized, mixed.h). The staging is workspace, so the
// memory model counts it: the queries add it under activation_dtype() bf16.

int64_t stage_offset(int64_t layout_floats) { return round_up(layout_floats, 16); }

// Floats of the staged chunk buffers after the fp32 layout: x and y (forward); dy, x and dx (backward).
int64_t fwd_stage_floats(const ConvGeom& g) { return g.nb * (g.c * g.h * g.w + g.k * g.plane); }
int64_t bwd_stage_floats(const ConvGeom& g) { return g.nb * (g.k * g.plane + 2 * g.c * g.h * g.w); }

// The chunk of `imgs` images from image n0 of t, `per` elements an image, in fp32: a pointer
// into t when f32, else converted into `buf`.
const float* chunk_in(const Tensor& t, int64_t n0, int64_t imgs, int64_t per, float* buf) {
  if (!cpu::is_bf16(t)) return t.f32() + n0 * per;
  const uint16_t* h = t.bf16() + n0 * per;
  cpu::parallel_for(imgs, 1,
                    [&](int64_t i0, int64_t i1) { cpu::bf16_to_f32(h + i0 * per, buf + i0 * per, (i1 - i0) * per); });
  return buf;
}
float* chunk_out(const Tensor& t, int64_t n0, int64_t per, float* buf) {
  return cpu::is_bf16(t) ? buf : t.f32() + n0 * per;
}
void chunk_put(const Tensor& t, int64_t n0, int64_t imgs, int64_t per, const float* buf) {
  if (!cpu::is_bf16(t)) return;
  uint16_t* h = t.bf16() + n0 * per;
  cpu::parallel_for(imgs, 1,
                    [&](int64_t i0, int64_t i1) { cpu::f32_to_bf16(buf + i0 * per, h + i0 * per, (i1 - i0) * per); });
}

// The geometry of the chunk of `imgs` images starting anywhere: one chunk of the op's.
ConvGeom chunk_geom(const ConvGeom& g, int64_t imgs, const Shape& w, const Conv2dParams& prm) {
  ConvGeom c(Shape{imgs, g.c, g.h, g.w}, w, prm);
  REMAT_CHECK(c.nb == imgs && c.y_feed == g.y_feed && c.dx_feed == g.dx_feed, "conv2d: chunk of ", imgs,
              " images planned as ", c.nb, " (internal)");
  return c;
}

}  // namespace

size_t cpu::conv2d_forward_workspace(const Shape& x, const Shape& w, const Conv2dParams& p) {
  const ConvGeom g(x, w, p);
  if (g.trivial()) return 0;
  if (activation_dtype() != DType::bf16) return g.fwd_bytes();
  return static_cast<size_t>(stage_offset(g.fwd_layout().total) + fwd_stage_floats(g)) * sizeof(float);
}

size_t cpu::conv2d_backward_workspace(const Shape& x, const Shape& w, const Conv2dParams& p) {
  const ConvGeom g(x, w, p);
  if (g.trivial()) return 0;
  if (activation_dtype() != DType::bf16) return g.bwd_bytes();
  return static_cast<size_t>(stage_offset(g.bwd_layout().total) + bwd_stage_floats(g)) * sizeof(float);
}

size_t CpuBackend::conv2d_forward_workspace_impl(const Shape& x, const Shape& w, const Conv2dParams& p) {
  return cpu::conv2d_forward_workspace(x, w, p);
}

size_t CpuBackend::conv2d_backward_workspace_impl(const Shape& x, const Shape& w, const Conv2dParams& p) {
  return cpu::conv2d_backward_workspace(x, w, p);
}

void CpuBackend::conv2d_forward_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& prm,
                                     const Tensor& y, const Tensor& workspace) {
  const ConvGeom g(x.shape(), w.shape(), prm);
  float* ws = workspace.defined() ? workspace.f32() : nullptr;
  if (cpu::all_f32({&x, &w, &b, &y}))
    return cpu_conv::conv_forward(g, x.f32(), w.f32(), b.defined() ? b.f32() : nullptr, y.f32(), ws);
  const float* wp = cpu::f32_all(w, 1);
  const float* bp = b.defined() ? cpu::f32_all(b, 2) : nullptr;
  const int64_t per_x = g.c * g.h * g.w, per_y = g.k * g.plane;
  if (g.trivial()) {  // y is the bias
    for (int64_t i = 0; i < g.n; ++i)
      for (int64_t kk = 0; kk < g.k; ++kk) {
        cpu::F32Writer wy(y, 3);
        float* d = wy.get(i * per_y + kk * g.plane, g.plane);
        std::fill(d, d + g.plane, bp ? bp[kk] : 0.0f);
        wy.put();
      }
    return;
  }
  float* xs = ws + stage_offset(g.fwd_layout().total);
  float* ys = xs + g.nb * per_x;
  for (int64_t n0 = 0; n0 < g.n; n0 += g.nb) {
    const int64_t nb = std::min(g.nb, g.n - n0);
    const ConvGeom gc = chunk_geom(g, nb, w.shape(), prm);
    float* yc = chunk_out(y, n0, per_y, ys);
    cpu_conv::conv_forward(gc, chunk_in(x, n0, nb, per_x, xs), wp, bp, yc, ws);
    chunk_put(y, n0, nb, per_y, yc);
  }
}

void CpuBackend::conv2d_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, const Conv2dParams& prm,
                                      const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& workspace) {
  const ConvGeom g(x.shape(), w.shape(), prm);
  if (db.defined()) conv_bias_grad(g, dy, db.f32());
  float* ws = workspace.defined() ? workspace.f32() : nullptr;
  float* dwp = dw.defined() ? dw.f32() : nullptr;
  if (cpu::all_f32({&dy, &x, &w, &dx}))
    return conv_backward(g, dy.f32(), x.f32(), w.f32(), dx.defined() ? dx.f32() : nullptr, dwp, ws);
  if (!dx.defined() && !dw.defined()) return;
  const int64_t per_x = g.c * g.h * g.w, per_y = g.k * g.plane;
  if (g.trivial()) {
    if (dx.defined())
      for (int64_t i = 0; i < g.n; ++i) {
        cpu::F32Writer wx(dx, 3);
        float* d = wx.get(i * per_x, per_x);
        std::fill(d, d + per_x, 0.0f);
        wx.put();
      }
    return;
  }
  const float* wp = cpu::f32_all(w, 1);
  float* dys = ws + stage_offset(g.bwd_layout().total);
  float* xs = dys + g.nb * per_y;
  float* dxs = xs + g.nb * per_x;
  for (int64_t n0 = 0; n0 < g.n; n0 += g.nb) {
    const int64_t nb = std::min(g.nb, g.n - n0);
    const ConvGeom gc = chunk_geom(g, nb, w.shape(), prm);
    const float* xc = dw.defined() ? chunk_in(x, n0, nb, per_x, xs) : nullptr;  // x is read for dw only
    float* dxc = dx.defined() ? chunk_out(dx, n0, per_x, dxs) : nullptr;
    conv_backward(gc, chunk_in(dy, n0, nb, per_y, dys), xc, wp, dxc, dwp, ws);
    if (dxc) chunk_put(dx, n0, nb, per_x, dxc);
  }
}

}  // namespace remat
