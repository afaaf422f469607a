// conv2d on the CUDA backend (NCHW, fp32). Two paths, chosen per call by REMAT_CONV:
//
// - cudnn (the default where remat is built with cuDNN; not in the emulated build):
//   cuDNN's deterministic direct-family algorithms (conv_cudnn.h). A shape cuDNN has no
//   such algorithm for takes the im2col path in that direction; so does every shape when
//   cuDNN cannot be used (planning failed: one warning, see conv_cudnn.h).
// - im2col: the kernels of kernels/im2col.cu around cuBLAS GEMMs, over chunks of nb images
//   whose column matrix col [C*R*S, L = nb*P*Q] fits in kMaxConvWorkspaceBytes (32 MiB, or
//   one image's when that is larger). Per group g
//   (Kg filters over Cg channels):
//     forward   y[i]_g [Kg, P*Q]  = w_g [Kg, Cg*R*S] @ col_g[:, image i]   (y preset to the bias, beta = 1)
//     backward  dyT = the chunk of dy as [K, L];   dw_g += dyT_g @ col_g^T;
//               col_g = w_g^T @ dyT_g, then dx = col2im(col)   (a gather per input element)
//   The forward pass of a 1x1 convolution with stride 1 and no padding reads x as its own
//   column matrix (no workspace).
//
// db is a per-channel sum in double on both paths. Everything is deterministic: fixed
// reductions, no atomics, cuBLAS's and cuDNN's deterministic kernels. Results match the
// CPU backend within fp32 rounding of the GEMM reductions (tests/backend_ops/cases_conv.cpp).
//
// Workspace: the path, the chunk size and so the bytes depend only on the shapes, the
// parameters, REMAT_CONV and the backend's TF32 setting, so a workspace query and the op
// after it agree.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "backends/cuda/conv_cudnn.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/gemm.h"
#include "kernels/fill.cuh"
#include "kernels/im2col.cuh"
#include "remat/cuda_check.h"
#include "remat/error.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

namespace {

#if defined(REMAT_WITH_CUDNN) && !defined(REMAT_EMULATE)
constexpr bool kHaveCudnn = true;
#else
constexpr bool kHaveCudnn = false;
#endif

constexpr int64_t kMaxConvWorkspaceBytes = int64_t{32} << 20;

// REMAT_CONV: "im2col", or "cudnn" (the default; im2col where remat has no cuDNN).
bool use_cudnn() {
  const char* v = std::getenv("REMAT_CONV");
  if (!v || !*v || std::strcmp(v, "cudnn") == 0) return kHaveCudnn;
  if (std::strcmp(v, "im2col") == 0) return false;
  REMAT_THROW("REMAT_CONV=", v, ": expected im2col or cudnn");
}

// Images per chunk: as many as fit in kMaxConvWorkspaceBytes (at least one), spread evenly.
int64_t images_per_chunk(int64_t n, int64_t bytes_per_image) {
  if (n <= 1 || bytes_per_image == 0) return std::max<int64_t>(n, 1);
  const int64_t most = std::max<int64_t>(1, kMaxConvWorkspaceBytes / bytes_per_image);
  return ceil_div(n, ceil_div(n, most));
}

struct ConvGeom {
  kernels::ConvShape s;
  int64_t groups, cg, kg;
  int64_t rows;   // C * R * S: rows of the column matrix
  int64_t grows;  // Cg * R * S: the GEMM depth of the forward pass
  int64_t plane;  // P * Q
  bool pointwise;
  int64_t nb_fwd, nb_bwd;  // images per chunk

  ConvGeom(const Shape& x, const Shape& w, const Conv2dParams& p) {
    const Shape y = conv2d_output_shape(x, w, p);
    s = kernels::ConvShape{x[0], x[1],       x[2],       x[3],    w[0],    w[2],         w[3],        y[2],
                           y[3], p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.dilation_h, p.dilation_w};
    groups = p.groups;
    cg = s.c / groups;
    kg = s.k / groups;
    rows = s.c * s.r * s.s;
    grows = cg * s.r * s.s;
    plane = s.p * s.q;
    pointwise = s.r == 1 && s.s == 1 && s.sh == 1 && s.sw == 1 && s.ph == 0 && s.pw == 0;
    nb_fwd = images_per_chunk(s.n, pointwise ? 0 : rows * plane * 4);
    nb_bwd = images_per_chunk(s.n, (s.k + rows) * plane * 4);
  }

  // Nothing to multiply: y is the bias, dx is 0 (or empty), dw is empty.
  bool trivial() const { return s.n == 0 || s.k == 0 || s.c == 0; }

  size_t fwd_bytes() const {
    return trivial() || pointwise ? 0 : static_cast<size_t>(rows * nb_fwd * plane) * sizeof(float);
  }
  // dyT [K, L], then col [C*R*S, L] (the column matrix of x for dw, then w^T @ dyT for dx).
  size_t bwd_bytes() const {
    return trivial() ? 0 : static_cast<size_t>((s.k + rows) * nb_bwd * plane) * sizeof(float);
  }
};

// Row-major c = op(a) @ op(b) + beta * c with row strides and batch strides (gemm.h).
void strided_gemm(cublasHandle_t h, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                  int64_t sa, const float* b, int64_t ldb, int64_t sb, float beta, float* c, int64_t ldc, int64_t sc,
                  int64_t batch) {
  gemm_strided(h, ta, tb, m, n, k, 1.0f, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch);
}

}  // namespace

size_t CudaBackend::conv2d_forward_workspace_impl(const Shape& x, const Shape& w, const Conv2dParams& p) {
  const ConvGeom g(x, w, p);
  if (g.trivial()) return 0;
  if (use_cudnn()) {
#if defined(REMAT_WITH_CUDNN) && !defined(REMAT_EMULATE)
    if (CudnnConv* cudnn = CudnnConv::of(*this)) {
      const CudnnConv::Plan& plan = cudnn->plan(x, w, p, tf32());
      if (plan.forward_ok) return plan.fwd_bytes;
    }
#endif
  }
  return g.fwd_bytes();
}

size_t CudaBackend::conv2d_backward_workspace_impl(const Shape& x, const Shape& w, const Conv2dParams& p) {
  const ConvGeom g(x, w, p);
  if (g.trivial()) return 0;
  if (use_cudnn()) {
#if defined(REMAT_WITH_CUDNN) && !defined(REMAT_EMULATE)
    if (CudnnConv* cudnn = CudnnConv::of(*this)) {
      const CudnnConv::Plan& plan = cudnn->plan(x, w, p, tf32());
      if (plan.backward_ok) return plan.bwd_bytes();
    }
#endif
  }
  return g.bwd_bytes();
}

void CudaBackend::conv2d_forward_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p,
                                      const Tensor& y, const Tensor& workspace) {
  const ConvGeom g(x.shape(), w.shape(), p);
  const kernels::ConvShape& s = g.s;
  float* yp = y.f32();
  if (b.defined())
    kernels::broadcast_channels(b.f32(), s.n, s.k, g.plane, yp, stream_);
  else if (g.trivial())
    kernels::fill_f32(yp, y.numel(), 0.0f, stream_);
  if (g.trivial()) return;
  const float beta = b.defined() ? 1.0f : 0.0f;

  if (use_cudnn()) {
#if defined(REMAT_WITH_CUDNN) && !defined(REMAT_EMULATE)
    if (CudnnConv* cudnn = CudnnConv::of(*this)) {
      const CudnnConv::Plan& plan = cudnn->plan(x.shape(), w.shape(), p, tf32());
      if (plan.forward_ok) {
        cudnn->forward(plan, x.f32(), w.f32(), beta, yp, plan.fwd_bytes ? workspace.raw_data() : nullptr);
        return;
      }
    }
#endif
  }

  const float* xp = x.f32();
  const float* wp = w.f32();
  float* col = g.pointwise ? nullptr : workspace.f32();
  for (int64_t n0 = 0; n0 < s.n; n0 += g.nb_fwd) {
    const int64_t nb = std::min(g.nb_fwd, s.n - n0), len = nb * g.plane;
    // B: the column matrix of image i and group gi at b + i * b_image + gi * b_group, rows ldb apart.
    const float* bmat = col;
    int64_t ldb = len, b_image = g.plane, b_group = g.grows * len;
    if (g.pointwise) {
      bmat = xp + n0 * s.c * g.plane;
      ldb = g.plane;
      b_image = s.c * g.plane;
      b_group = g.cg * g.plane;
    } else {
      kernels::im2col(xp, s, n0, nb, col, stream_);
    }
    float* out = yp + n0 * s.k * g.plane;
    const int64_t a_group = g.kg * g.grows, c_image = s.k * g.plane, c_group = g.kg * g.plane;
    // One batched GEMM per image over the groups, or per group over the images: the longer batch.
    if (g.groups >= nb) {
      for (int64_t i = 0; i < nb; ++i)
        strided_gemm(cublas_, false, false, g.kg, g.plane, g.grows, wp, g.grows, a_group, bmat + i * b_image, ldb,
                     b_group, beta, out + i * c_image, g.plane, c_group, g.groups);
    } else {
      for (int64_t gi = 0; gi < g.groups; ++gi)
        strided_gemm(cublas_, false, false, g.kg, g.plane, g.grows, wp + gi * a_group, g.grows, 0, bmat + gi * b_group,
                     ldb, b_image, beta, out + gi * c_group, g.plane, c_image, nb);
    }
  }
}

void CudaBackend::conv2d_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, const Conv2dParams& p,
                                       const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& workspace) {
  const ConvGeom g(x.shape(), w.shape(), p);
  const kernels::ConvShape& s = g.s;
  const float* dyp = dy.f32();
  if (db.defined() && s.n > 0) kernels::accumulate_channel_sums(dyp, s.n, s.k, g.plane, db.f32(), stream_);
  const bool need_dx = dx.defined(), need_dw = dw.defined();
  if (!need_dx && !need_dw) return;
  if (g.trivial()) {  // no filter or output sees x: dx = 0; dw has no elements to add to
    if (need_dx) kernels::fill_f32(dx.f32(), dx.numel(), 0.0f, stream_);
    return;
  }

  if (use_cudnn()) {
#if defined(REMAT_WITH_CUDNN) && !defined(REMAT_EMULATE)
    if (CudnnConv* cudnn = CudnnConv::of(*this)) {
      const CudnnConv::Plan& plan = cudnn->plan(x.shape(), w.shape(), p, tf32());
      if (plan.backward_ok) {
        void* ws = plan.bwd_bytes() ? workspace.raw_data() : nullptr;
        if (need_dw) cudnn->backward_filter(plan, x.f32(), dyp, dw.f32(), ws);
        if (need_dx) cudnn->backward_data(plan, w.f32(), dyp, dx.f32(), ws);
        return;
      }
    }
#endif
  }

  const float* wp = w.f32();
  float* dyt = workspace.f32();
  float* col = dyt + s.k * g.nb_bwd * g.plane;
  for (int64_t n0 = 0; n0 < s.n; n0 += g.nb_bwd) {
    const int64_t nb = std::min(g.nb_bwd, s.n - n0), len = nb * g.plane;
    kernels::nchw_to_cnhw(dyp, n0, nb, s.k, g.plane, dyt, stream_);
    if (need_dw) {  // dw_g [Kg, Cg*R*S] += dyT_g [Kg, L] @ col_g^T
      kernels::im2col(x.f32(), s, n0, nb, col, stream_);
      strided_gemm(cublas_, false, true, g.kg, g.grows, len, dyt, len, g.kg * len, col, len, g.grows * len, 1.0f,
                   dw.f32(), g.grows, g.kg * g.grows, g.groups);
    }
    if (need_dx) {  // col_g [Cg*R*S, L] = w_g^T @ dyT_g, then the gather into dx
      strided_gemm(cublas_, true, false, g.grows, len, g.kg, wp, g.grows, g.kg * g.grows, dyt, len, g.kg * len, 0.0f,
                   col, len, g.grows * len, g.groups);
      kernels::col2im(col, s, n0, nb, dx.f32(), stream_);
    }
  }
}

REMAT_KERNELS_ABI_END
}  // namespace remat
