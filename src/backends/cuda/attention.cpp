// STUB: replaced by the attention family (kernels + host glue).
#include "backends/cuda/cuda_backend.h"
#include "remat/error.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

size_t CudaBackend::attention_forward_workspace_impl(const Shape& /*qkv*/, const AttentionParams& /*p*/) {
  throw Unsupported("attention_forward_workspace: not implemented on " + name() + " yet");
}

void CudaBackend::attention_forward_impl(const Tensor& /*qkv*/, const AttentionParams& /*p*/, RngState /*rng*/, const Tensor& /*out*/, const Tensor& /*probs*/, const Tensor& /*workspace*/) {
  throw Unsupported("attention_forward: not implemented on " + name() + " yet");
}

size_t CudaBackend::attention_backward_workspace_impl(const Shape& /*qkv*/, const AttentionParams& /*p*/) {
  throw Unsupported("attention_backward_workspace: not implemented on " + name() + " yet");
}

void CudaBackend::attention_backward_impl(const Tensor& /*dout*/, const Tensor& /*qkv*/, const Tensor& /*probs*/, const AttentionParams& /*p*/, RngState /*rng*/, const Tensor& /*dqkv*/, const Tensor& /*workspace*/) {
  throw Unsupported("attention_backward: not implemented on " + name() + " yet");
}

void CudaBackend::permute_0213_impl(const Tensor& /*x*/, const Tensor& /*y*/) {
  throw Unsupported("permute_0213: not implemented on " + name() + " yet");
}

REMAT_KERNELS_ABI_END
}  // namespace remat
