// STUB: replaced by the softmax_loss family (kernels + host glue).
#include "backends/cuda/cuda_backend.h"
#include "remat/error.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

void CudaBackend::softmax_forward_impl(const Tensor& /*x*/, bool /*log*/, const Tensor& /*y*/) {
  throw Unsupported("softmax_forward: not implemented on " + name() + " yet");
}

void CudaBackend::softmax_backward_impl(const Tensor& /*dy*/, const Tensor& /*y*/, bool /*log*/, const Tensor& /*dx*/) {
  throw Unsupported("softmax_backward: not implemented on " + name() + " yet");
}

void CudaBackend::cross_entropy_forward_impl(const Tensor& /*logits*/, const Tensor& /*targets*/, int /*ignore_index*/, const Tensor& /*loss*/, const Tensor& /*lse*/) {
  throw Unsupported("cross_entropy_forward: not implemented on " + name() + " yet");
}

void CudaBackend::cross_entropy_backward_impl(float /*dloss*/, const Tensor& /*logits*/, const Tensor& /*targets*/, const Tensor& /*lse*/, int /*ignore_index*/, const Tensor& /*dlogits*/) {
  throw Unsupported("cross_entropy_backward: not implemented on " + name() + " yet");
}

int64_t CudaBackend::accuracy_impl(const Tensor& /*logits*/, const Tensor& /*targets*/, int /*ignore_index*/, int64_t* /*counted*/) {
  throw Unsupported("accuracy: not implemented on " + name() + " yet");
}

REMAT_KERNELS_ABI_END
}  // namespace remat
