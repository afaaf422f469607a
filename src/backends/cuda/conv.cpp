// STUB: replaced by the conv family (kernels + host glue).
#include "backends/cuda/cuda_backend.h"
#include "remat/error.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

size_t CudaBackend::conv2d_forward_workspace_impl(const Shape& /*x*/, const Shape& /*w*/, const Conv2dParams& /*p*/) {
  throw Unsupported("conv2d_forward_workspace: not implemented on " + name() + " yet");
}

void CudaBackend::conv2d_forward_impl(const Tensor& /*x*/, const Tensor& /*w*/, const Tensor& /*b*/, const Conv2dParams& /*p*/, const Tensor& /*y*/, const Tensor& /*workspace*/) {
  throw Unsupported("conv2d_forward: not implemented on " + name() + " yet");
}

size_t CudaBackend::conv2d_backward_workspace_impl(const Shape& /*x*/, const Shape& /*w*/, const Conv2dParams& /*p*/) {
  throw Unsupported("conv2d_backward_workspace: not implemented on " + name() + " yet");
}

void CudaBackend::conv2d_backward_impl(const Tensor& /*dy*/, const Tensor& /*x*/, const Tensor& /*w*/, const Conv2dParams& /*p*/, const Tensor& /*dx*/, const Tensor& /*dw*/, const Tensor& /*db*/, const Tensor& /*workspace*/) {
  throw Unsupported("conv2d_backward: not implemented on " + name() + " yet");
}

REMAT_KERNELS_ABI_END
}  // namespace remat
