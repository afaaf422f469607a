// STUB: replaced by the elementwise family (kernels + host glue).
#include "backends/cuda/cuda_backend.h"
#include "remat/error.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

void CudaBackend::add_impl(const Tensor& /*a*/, const Tensor& /*b*/, const Tensor& /*y*/) {
  throw Unsupported("add: not implemented on " + name() + " yet");
}

void CudaBackend::accumulate_impl(const Tensor& /*dst*/, const Tensor& /*src*/) {
  throw Unsupported("accumulate: not implemented on " + name() + " yet");
}

void CudaBackend::scale_impl(const Tensor& /*x*/, float /*alpha*/, const Tensor& /*y*/) {
  throw Unsupported("scale: not implemented on " + name() + " yet");
}

void CudaBackend::relu_forward_impl(const Tensor& /*x*/, const Tensor& /*y*/) {
  throw Unsupported("relu_forward: not implemented on " + name() + " yet");
}

void CudaBackend::relu_backward_impl(const Tensor& /*dy*/, const Tensor& /*x*/, const Tensor& /*dx*/) {
  throw Unsupported("relu_backward: not implemented on " + name() + " yet");
}

void CudaBackend::gelu_forward_impl(const Tensor& /*x*/, GeluApprox /*approx*/, const Tensor& /*y*/) {
  throw Unsupported("gelu_forward: not implemented on " + name() + " yet");
}

void CudaBackend::gelu_backward_impl(const Tensor& /*dy*/, const Tensor& /*x*/, GeluApprox /*approx*/, const Tensor& /*dx*/) {
  throw Unsupported("gelu_backward: not implemented on " + name() + " yet");
}

void CudaBackend::dropout_forward_impl(const Tensor& /*x*/, float /*p*/, RngState /*rng*/, const Tensor& /*y*/) {
  throw Unsupported("dropout_forward: not implemented on " + name() + " yet");
}

void CudaBackend::dropout_backward_impl(const Tensor& /*dy*/, float /*p*/, RngState /*rng*/, const Tensor& /*dx*/) {
  throw Unsupported("dropout_backward: not implemented on " + name() + " yet");
}

REMAT_KERNELS_ABI_END
}  // namespace remat
