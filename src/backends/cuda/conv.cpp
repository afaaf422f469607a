// conv2d on the CUDA backend (NCHW; f32, or bf16 under training.precision bf16). Two paths,
// chosen per call by REMAT_CONV:
//
// - cudnn (the default where remat is built with cuDNN; not in the emulated build):
//   cuDNN's deterministic direct-family algorithms (conv_cudnn.h). A shape cuDNN has no
//   such algorithm for takes the im2col path in that direction; so does every shape when
//   cuDNN cannot be used (planning failed: one warning, see conv_cudnn.h), and a call whose
//   workspace is smaller than the plan's (an f32 convolution inside a bf16 scope, whose
//   queries sized the bf16 plan).
// - im2col: the kernels of kernels/im2col.cu around cuBLAS GEMMs, over chunks of nb images
//   whose column matrix col [C*R*S, L = nb*P*Q] fits in kMaxConvWorkspaceBytes (32 MiB, or
//   one image's when that is larger). Per group g
//   (Kg filters over Cg channels):
//     forward   y[i]_g [Kg, P*Q]  = w_g [Kg, Cg*R*S] @ col_g[:, image i]   (y preset to the bias, beta = 1)
//     backward  dyT = the chunk of dy as [K, L];   dw_g += dyT_g @ col_g^T;
//               col_g = w_g^T @ dyT_g, then dx = col2im(col)   (a gather per input element)
//   The forward pass of a 1x1 convolution with stride 1 and no padding reads x as its own
//   column matrix (no workspace). A forward pass takes as many images per chunk as the
//   workspace it is given holds (at most nb; exactly nb with the query's bytes in its own
//   dtype): each output is one dot product, so smaller chunks change no sum (cuBLAS may
//   still pick another kernel for another batch count).
//
// bf16 (training.precision bf16): any array may be bf16. The column matrix and the dy
// transpose keep their source's dtype (exact copies), the GEMMs go through
// gemm_strided_mixed: two bf16 factors on cublasGemmEx (fp32 accumulation), an f32 factor
// with a bf16 one (the first layer: the f32 batch times bf16 working filters) on remat's
// kernels::gemm_fma; y (bf16 or f32) is rounded once by the GEMM that adds onto the bias,
// dw accumulates into its f32 buffer (beta = 1), and dx's column matrix w^T @ dyT is f32,
// so col2im's sums are fp32 and a bf16 dx is rounded once: the fp32 op on the same values
// but for the GEMMs' own summation order (on the emulator, whose cublasGemmEx is an sgemm
// of the widened operands, bitwise the fp32 op for bf16 x, w and dy: tested). db sums a
// bf16 dy in double. cuDNN (real GPUs) under bf16: forward and the data gradient with bf16
// descriptors (CUDNN_DATA_BFLOAT16, fp32 compute) when x, w and y (w, dy and dx) are all
// bf16; the filter gradient always by im2col, as cuDNN writes a bf16 dw only.
//
// db is a per-channel sum in double on both paths. Everything is deterministic: fixed
// reductions, no atomics, cuBLAS's and cuDNN's deterministic kernels. Results match the
// CPU backend within fp32 rounding of the GEMM reductions (tests/backend_ops/cases_conv.cpp).
//
// Workspace: the path, the chunk size and so the bytes depend only on the shapes, the
// parameters, activation_dtype(), REMAT_CONV and the backend's TF32 setting, so a workspace
// query and the op after it agree. Under activation_dtype() bf16 the queries answer what
// any dtypes need: forward the bf16 column matrix of a chunk (half the fp32 one) but at
// least one image's fp32 column matrix (an f32 x: the forward takes as many images per
// chunk as its workspace holds), nothing for a pointwise
// convolution; backward the larger of the fp32 layout and the bf16 one (a bf16 dy
// transpose, then the column matrix, f32 for dx).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "backends/cuda/conv_cudnn.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/gemm.h"
#include "kernels/elementwise.cuh"
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

bool bf16_mode() { return activation_dtype() == DType::bf16; }

// Images per chunk: as many as fit in kMaxConvWorkspaceBytes (at least one), spread evenly.
int64_t images_per_chunk(int64_t n, int64_t bytes_per_image) {
  if (n <= 1 || bytes_per_image == 0) return std::max<int64_t>(n, 1);
  const int64_t most = std::max<int64_t>(1, kMaxConvWorkspaceBytes / bytes_per_image);
  return ceil_div(n, ceil_div(n, most));
}

size_t round_up16(size_t bytes) { return (bytes + 15) / 16 * 16; }

// Element i of a FloatBuf's array.
kernels::FloatBuf advance(kernels::FloatBuf b, int64_t i) {
  if (b.p) b.p = static_cast<char*>(b.p) + i * (b.bf16 ? 2 : 4);
  return b;
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

  // The column matrix of nb images in elements of es bytes.
  size_t col_bytes(int64_t nb, size_t es) const { return static_cast<size_t>(rows * nb * plane) * es; }

  // fp32: col; none for a pointwise convolution (x is its column matrix).
  size_t fwd_bytes() const { return trivial() || pointwise ? 0 : col_bytes(nb_fwd, 4); }
  // dyT [K, L], then col [C*R*S, L] (the column matrix of x for dw, then w^T @ dyT for dx).
  size_t bwd_bytes() const {
    return trivial() ? 0 : static_cast<size_t>((s.k + rows) * nb_bwd * plane) * sizeof(float);
  }
  // bf16: col in bf16, at least one image's fp32 col (an f32 x: its forward takes chunks of
  // that); none for a pointwise convolution (x is its column matrix in either dtype).
  size_t fwd_bytes_bf16() const { return trivial() || pointwise ? 0 : std::max(col_bytes(nb_fwd, 2), col_bytes(1, 4)); }
  // A bf16 dy's layout: dyT in bf16 (16-byte aligned end), then col (x's column matrix in
  // x's dtype for dw, then the f32 w^T @ dyT for dx); an f32 dy takes the fp32 layout.
  size_t dyt_bytes_bf16() const { return round_up16(static_cast<size_t>(s.k * nb_bwd * plane) * 2); }
  size_t bwd_bytes_bf16() const {
    return trivial() ? 0 : std::max(bwd_bytes(), dyt_bytes_bf16() + col_bytes(nb_bwd, 4));
  }
  // A forward chunk: as many images (at most cap) as `bytes` of workspace hold in es-byte
  // column matrices, at least one.
  int64_t fwd_chunk(size_t bytes, size_t es, int64_t cap) const {
    const size_t one = col_bytes(1, es);
    const int64_t fit = one == 0 ? cap : static_cast<int64_t>(bytes / one);
    return std::max<int64_t>(1, std::min(cap, fit));
  }
};

size_t workspace_bytes(const Tensor& ws) { return ws.defined() ? ws.nbytes() : 0; }

}  // namespace

size_t CudaBackend::conv2d_forward_workspace_impl(const Shape& x, const Shape& w, const Conv2dParams& p) {
  const ConvGeom g(x, w, p);
  if (g.trivial()) return 0;
  const bool bf16 = bf16_mode();
  if (use_cudnn()) {
#if defined(REMAT_WITH_CUDNN) && !defined(REMAT_EMULATE)
    if (CudnnConv* cudnn = CudnnConv::of(*this)) {
      const CudnnConv::Plan& plan = cudnn->plan(x, w, p, tf32(), bf16);
      // Under bf16, room for im2col's chunks of one image too (tensors cuDNN's bf16 plan does
      // not take: an f32 x or f32 filters; an all-f32 call, whose fp32 plan may need more).
      if (plan.forward_ok) return bf16 ? std::max(plan.fwd_bytes, g.fwd_bytes_bf16()) : plan.fwd_bytes;
    }
#endif
  }
  return bf16 ? g.fwd_bytes_bf16() : g.fwd_bytes();
}

size_t CudaBackend::conv2d_backward_workspace_impl(const Shape& x, const Shape& w, const Conv2dParams& p) {
  const ConvGeom g(x, w, p);
  if (g.trivial()) return 0;
  const bool bf16 = bf16_mode();
  if (use_cudnn()) {
#if defined(REMAT_WITH_CUDNN) && !defined(REMAT_EMULATE)
    if (CudnnConv* cudnn = CudnnConv::of(*this)) {
      const CudnnConv::Plan& plan = cudnn->plan(x, w, p, tf32(), bf16);
      // Under bf16 the filter gradient takes im2col whatever cuDNN plans (an f32 dw).
      if (bf16) return std::max(g.bwd_bytes_bf16(), plan.data_ok ? plan.data_bytes : size_t{0});
      if (plan.backward_ok) return plan.bwd_bytes();
    }
#endif
  }
  return bf16 ? g.bwd_bytes_bf16() : g.bwd_bytes();
}

void CudaBackend::conv2d_forward_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p,
                                      const Tensor& y, const Tensor& workspace) {
  const ConvGeom g(x.shape(), w.shape(), p);
  const kernels::ConvShape& s = g.s;
  const kernels::FloatBuf xb = fbuf(x), wb = fbuf(w), yb = fbuf(y);
  if (b.defined())
    kernels::broadcast_channels(fbuf(b), s.n, s.k, g.plane, yb, stream_);
  else if (g.trivial())
    kernels::zero(yb, y.numel(), stream_);
  if (g.trivial()) return;
  const float beta = b.defined() ? 1.0f : 0.0f;
  const size_t ws_bytes = workspace_bytes(workspace);

  if (use_cudnn()) {
#if defined(REMAT_WITH_CUDNN) && !defined(REMAT_EMULATE)
    if (CudnnConv* cudnn = CudnnConv::of(*this)) {
      const bool fp32 = x.dtype() == DType::f32 && w.dtype() == DType::f32 && y.dtype() == DType::f32;
      const CudnnConv::Plan& plan = cudnn->plan(x.shape(), w.shape(), p, tf32(), !fp32);
      const bool types_ok = fp32 || (x.dtype() == DType::bf16 && w.dtype() == DType::bf16 && y.dtype() == DType::bf16);
      if (plan.forward_ok && types_ok && plan.fwd_bytes <= ws_bytes) {
        cudnn->forward(plan, x.raw_data(), w.raw_data(), beta, y.raw_data(),
                       plan.fwd_bytes ? workspace.raw_data() : nullptr);
        return;
      }
    }
#endif
  }

  // The column matrix in x's dtype (a pointwise convolution reads x itself), as many images
  // per chunk as the workspace holds, at most nb_fwd.
  const bool direct = g.pointwise;
  const int64_t nb = direct ? s.n : g.fwd_chunk(ws_bytes, xb.bf16 ? 2 : 4, g.nb_fwd);
  const kernels::FloatBuf col{direct ? nullptr : workspace.raw_data(), xb.bf16};
  for (int64_t n0 = 0; n0 < s.n; n0 += nb) {
    const int64_t chunk = std::min(nb, s.n - n0), len = chunk * g.plane;
    // B: the column matrix of image i and group gi at b + i * b_image + gi * b_group, rows ldb apart.
    kernels::FloatBuf bmat = col;
    int64_t ldb = len, b_image = g.plane, b_group = g.grows * len;
    if (direct) {
      bmat = advance(xb, n0 * s.c * g.plane);
      ldb = g.plane;
      b_image = s.c * g.plane;
      b_group = g.cg * g.plane;
    } else {
      kernels::im2col(xb, s, n0, chunk, col, stream_);
    }
    const kernels::FloatBuf out = advance(yb, n0 * s.k * g.plane);
    const int64_t a_group = g.kg * g.grows, c_image = s.k * g.plane, c_group = g.kg * g.plane;
    // One batched GEMM per image over the groups, or per group over the images: the longer batch.
    if (g.groups >= chunk) {
      for (int64_t i = 0; i < chunk; ++i)
        gemm_strided_mixed(cublas_, "conv2d_forward", GemmSize{g.kg, g.plane, g.grows, g.groups}, 1.0f,
                           matrix(wb, g.grows, a_group), matrix(advance(bmat, i * b_image), ldb, b_group), beta,
                           matrix(advance(out, i * c_image), g.plane, c_group));
    } else {
      for (int64_t gi = 0; gi < g.groups; ++gi)
        gemm_strided_mixed(cublas_, "conv2d_forward", GemmSize{g.kg, g.plane, g.grows, chunk}, 1.0f,
                           matrix(advance(wb, gi * a_group), g.grows),
                           matrix(advance(bmat, gi * b_group), ldb, b_image), beta,
                           matrix(advance(out, gi * c_group), g.plane, c_image));
    }
  }
}

void CudaBackend::conv2d_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, const Conv2dParams& p,
                                       const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& workspace) {
  const ConvGeom g(x.shape(), w.shape(), p);
  const kernels::ConvShape& s = g.s;
  if (db.defined() && s.n > 0) kernels::accumulate_channel_sums(fbuf(dy), s.n, s.k, g.plane, db.f32(), stream_);
  bool need_dx = dx.defined(), need_dw = dw.defined();
  if (!need_dx && !need_dw) return;
  if (g.trivial()) {  // no filter or output sees x: dx = 0; dw has no elements to add to
    if (need_dx) kernels::zero(fbuf(dx), dx.numel(), stream_);
    return;
  }

  if (use_cudnn()) {
#if defined(REMAT_WITH_CUDNN) && !defined(REMAT_EMULATE)
    if (CudnnConv* cudnn = CudnnConv::of(*this)) {
      const size_t ws_bytes = workspace_bytes(workspace);
      const bool fp32 = dy.dtype() == DType::f32 && x.dtype() == DType::f32 && w.dtype() == DType::f32 &&
                        (!dx.defined() || dx.dtype() == DType::f32);
      const CudnnConv::Plan& plan = cudnn->plan(x.shape(), w.shape(), p, tf32(), !fp32);
      void* ws = workspace.defined() ? workspace.raw_data() : nullptr;
      if (fp32) {
        if (plan.backward_ok && plan.bwd_bytes() <= ws_bytes) {
          if (need_dw) cudnn->backward_filter(plan, x.raw_data(), dy.raw_data(), dw.f32(), ws);
          if (need_dx) cudnn->backward_data(plan, w.raw_data(), dy.raw_data(), dx.raw_data(), ws);
          return;
        }
      } else if (need_dx && plan.data_ok && plan.data_bytes <= ws_bytes && dy.dtype() == DType::bf16 &&
                 w.dtype() == DType::bf16 && dx.dtype() == DType::bf16) {
        cudnn->backward_data(plan, w.raw_data(), dy.raw_data(), dx.raw_data(), ws);
        need_dx = false;  // dw below, by im2col
        if (!need_dw) return;
      }
    }
#endif
  }

  // dyT in dy's dtype, then col from a 16-byte boundary (x's column matrix in x's dtype for
  // dw, then the f32 w^T @ dyT for dx): the fp32 layout for an f32 dy, the bf16 one for a
  // bf16 dy; the backward query covers both.
  const kernels::FloatBuf wb = fbuf(w), dwb = fbuf(dw);
  auto* base = static_cast<char*>(workspace.raw_data());
  const bool dy16 = dy.dtype() == DType::bf16;
  const kernels::FloatBuf dyt{base, dy16};
  void* col_at = base + (dy16 ? g.dyt_bytes_bf16() : static_cast<size_t>(s.k * g.nb_bwd * g.plane) * sizeof(float));
  const kernels::FloatBuf col_x{col_at, x.dtype() == DType::bf16}, col_dx{col_at, false};
  for (int64_t n0 = 0; n0 < s.n; n0 += g.nb_bwd) {
    const int64_t nb = std::min(g.nb_bwd, s.n - n0), len = nb * g.plane;
    kernels::nchw_to_cnhw(fbuf(dy), n0, nb, s.k, g.plane, dyt, stream_);
    if (need_dw) {  // dw_g [Kg, Cg*R*S] += dyT_g [Kg, L] @ col_g^T
      kernels::im2col(fbuf(x), s, n0, nb, col_x, stream_);
      gemm_strided_mixed(cublas_, "conv2d_backward", GemmSize{g.kg, g.grows, len, g.groups}, 1.0f,
                         matrix(dyt, len, g.kg * len), transposed(col_x, len, g.grows * len), 1.0f,
                         matrix(dwb, g.grows, g.kg * g.grows));
    }
    if (need_dx) {  // col_g [Cg*R*S, L] = w_g^T @ dyT_g, then the gather into dx
      gemm_strided_mixed(cublas_, "conv2d_backward", GemmSize{g.grows, len, g.kg, g.groups}, 1.0f,
                         transposed(wb, g.grows, g.kg * g.grows), matrix(dyt, len, g.kg * len), 0.0f,
                         matrix(col_dx, len, g.grows * len));
      kernels::col2im(col_dx, s, n0, nb, fbuf(dx), stream_);
    }
  }
}

REMAT_KERNELS_ABI_END
}  // namespace remat
