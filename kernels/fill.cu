#include "kernels/fill.cuh"
#include "kernels/launch.cuh"

namespace remat::kernels {

// Grid-stride loop with 64-bit indices.
static __global__ void fill_f32_kernel(float* dst, int64_t n, float value) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = value;
}

void fill_f32(float* dst, int64_t n, float value, cudaStream_t stream) {
  constexpr int kBlock = 256;
  const int64_t blocks = n < int64_t{kBlock} * 65535 ? ceil_div<int64_t>(n, kBlock) : 65535;
  REMAT_LAUNCH(fill_f32_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kBlock), 0, stream, dst, n, value);
}

}  // namespace remat::kernels
