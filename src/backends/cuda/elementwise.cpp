// Elementwise ops on the CUDA backend: add, accumulate, scale, ReLU, GELU, SiLU, mul, dropout
// (kernels/elementwise.cu, kernels/dropout.cu). Outputs may alias inputs where the CPU
// backend allows it (scale in place, backward into dy). Any array may be bf16 (fbuf): fp32
// math, bf16 outputs rounded once, so a bf16 result is the fp32 op's on the same values,
// rounded (the CPU backend's contract, src/backends/cpu/mixed.h).
#include "kernels/elementwise.cuh"
#include "backends/cuda/cuda_backend.h"
#include "kernels/dropout.cuh"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

namespace {
kernels::Gelu gelu_form(GeluApprox approx) {
  return approx == GeluApprox::tanh ? kernels::Gelu::tanh : kernels::Gelu::erf;
}
}  // namespace

void CudaBackend::add_impl(const Tensor& a, const Tensor& b, const Tensor& y) {
  kernels::add(fbuf(a), fbuf(b), fbuf(y), y.numel(), stream_);
}

void CudaBackend::accumulate_impl(const Tensor& dst, const Tensor& src) {
  kernels::add(fbuf(dst), fbuf(src), fbuf(dst), dst.numel(), stream_);
}

void CudaBackend::scale_impl(const Tensor& x, float alpha, const Tensor& y) {
  kernels::scale(fbuf(x), alpha, fbuf(y), y.numel(), stream_);
}

// f32 -> bf16 pairs go kCastMultiMax per launch (the working-copy refresh); any other pair
// (bf16 -> f32, one dtype) is one copy launch.
void CudaBackend::cast_multi_impl(const std::vector<Tensor>& src, const std::vector<Tensor>& dst) {
  std::vector<kernels::CastMultiEntry> batch;
  auto flush = [&] {
    if (!batch.empty()) kernels::cast_f32_to_bf16_multi(batch.data(), static_cast<int>(batch.size()), stream_);
    batch.clear();
  };
  for (size_t i = 0; i < src.size(); ++i) {
    const int64_t n = src[i].numel();
    if (n == 0) continue;
    if (src[i].dtype() == DType::f32 && dst[i].dtype() == DType::bf16) {
      batch.push_back({src[i].f32(), static_cast<kernels::bf16*>(dst[i].raw_data()), n});
      if (batch.size() == static_cast<size_t>(kernels::kCastMultiMax)) flush();
    } else {
      kernels::copy(fbuf(src[i]), fbuf(dst[i]), n, stream_);
    }
  }
  flush();
}

void CudaBackend::relu_forward_impl(const Tensor& x, const Tensor& y) {
  kernels::relu_forward(fbuf(x), fbuf(y), y.numel(), stream_);
}

void CudaBackend::relu_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  kernels::relu_backward(fbuf(dy), fbuf(x), fbuf(dx), dx.numel(), stream_);
}

void CudaBackend::gelu_forward_impl(const Tensor& x, GeluApprox approx, const Tensor& y) {
  kernels::gelu_forward(fbuf(x), gelu_form(approx), fbuf(y), y.numel(), stream_);
}

void CudaBackend::gelu_backward_impl(const Tensor& dy, const Tensor& x, GeluApprox approx, const Tensor& dx) {
  kernels::gelu_backward(fbuf(dy), fbuf(x), gelu_form(approx), fbuf(dx), dx.numel(), stream_);
}

void CudaBackend::silu_forward_impl(const Tensor& x, const Tensor& y) {
  kernels::silu_forward(fbuf(x), fbuf(y), y.numel(), stream_);
}

void CudaBackend::silu_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  kernels::silu_backward(fbuf(dy), fbuf(x), fbuf(dx), dx.numel(), stream_);
}

void CudaBackend::mul_forward_impl(const Tensor& a, const Tensor& b, const Tensor& y) {
  kernels::mul(fbuf(a), fbuf(b), fbuf(y), y.numel(), stream_);
}

// Two launches, da then db: neither output shares storage with an input (the validator).
void CudaBackend::mul_backward_impl(const Tensor& dy, const Tensor& a, const Tensor& b, const Tensor& da,
                                    const Tensor& db) {
  if (da.defined()) kernels::mul(fbuf(dy), fbuf(b), fbuf(da), da.numel(), stream_);
  if (db.defined()) kernels::mul(fbuf(dy), fbuf(a), fbuf(db), db.numel(), stream_);
}

void CudaBackend::dropout_forward_impl(const Tensor& x, float p, RngState rng, const Tensor& y) {
  kernels::dropout(fbuf(x), fbuf(y), y.numel(), p, rng.seed, rng.offset, stream_);
}

void CudaBackend::dropout_backward_impl(const Tensor& dy, float p, RngState rng, const Tensor& dx) {
  kernels::dropout(fbuf(dy), fbuf(dx), dx.numel(), p, rng.seed, rng.offset, stream_);
}

REMAT_KERNELS_ABI_END
}  // namespace remat
