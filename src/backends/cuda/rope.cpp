// Rotary position embeddings (kernels/rope.cu). x, y, dy and dx may be bf16 (fbuf) and
// the output may be the input.
#include "kernels/rope.cuh"
#include "backends/cuda/cuda_backend.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

namespace {
void launch_rope(const Tensor& x, const RopeParams& p, const Tensor& y, double sign, cudaStream_t stream) {
  const int64_t d = x.size(2) / p.heads;
  kernels::rope(fbuf(x), x.size(0) * x.size(1), x.size(1), p.heads, p.rotated, d, p.theta, p.scaling, sign, fbuf(y),
                stream);
}
}  // namespace

void CudaBackend::rope_forward_impl(const Tensor& x, const RopeParams& p, const Tensor& y) {
  launch_rope(x, p, y, 1.0, stream());
}

void CudaBackend::rope_backward_impl(const Tensor& dy, const RopeParams& p, const Tensor& dx) {
  launch_rope(dy, p, dx, -1.0, stream());
}

REMAT_KERNELS_ABI_END
}  // namespace remat
