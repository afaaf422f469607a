// STUB: replaced by the pool family (kernels + host glue).
#include "backends/cuda/cuda_backend.h"
#include "remat/error.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

void CudaBackend::maxpool2d_forward_impl(const Tensor& /*x*/, const Pool2dParams& /*p*/, const Tensor& /*y*/, const Tensor& /*indices*/) {
  throw Unsupported("maxpool2d_forward: not implemented on " + name() + " yet");
}

void CudaBackend::maxpool2d_backward_impl(const Tensor& /*dy*/, const Tensor& /*indices*/, const Tensor& /*dx*/) {
  throw Unsupported("maxpool2d_backward: not implemented on " + name() + " yet");
}

void CudaBackend::avgpool2d_forward_impl(const Tensor& /*x*/, const Pool2dParams& /*p*/, const Tensor& /*y*/) {
  throw Unsupported("avgpool2d_forward: not implemented on " + name() + " yet");
}

void CudaBackend::avgpool2d_backward_impl(const Tensor& /*dy*/, const Pool2dParams& /*p*/, const Tensor& /*dx*/) {
  throw Unsupported("avgpool2d_backward: not implemented on " + name() + " yet");
}

void CudaBackend::global_avgpool_forward_impl(const Tensor& /*x*/, const Tensor& /*y*/) {
  throw Unsupported("global_avgpool_forward: not implemented on " + name() + " yet");
}

void CudaBackend::global_avgpool_backward_impl(const Tensor& /*dy*/, const Tensor& /*dx*/) {
  throw Unsupported("global_avgpool_backward: not implemented on " + name() + " yet");
}

REMAT_KERNELS_ABI_END
}  // namespace remat
