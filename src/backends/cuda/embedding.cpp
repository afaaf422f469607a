// STUB: replaced by the embedding family (kernels + host glue).
#include "backends/cuda/cuda_backend.h"
#include "remat/error.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

void CudaBackend::embedding_forward_impl(const Tensor& /*ids*/, const Tensor& /*table*/, const Tensor& /*pos_table*/, const Tensor& /*y*/) {
  throw Unsupported("embedding_forward: not implemented on " + name() + " yet");
}

void CudaBackend::embedding_backward_impl(const Tensor& /*dy*/, const Tensor& /*ids*/, const Tensor& /*dtable*/, const Tensor& /*dpos_table*/) {
  throw Unsupported("embedding_backward: not implemented on " + name() + " yet");
}

REMAT_KERNELS_ABI_END
}  // namespace remat
