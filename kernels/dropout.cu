#include "kernels/dropout.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/fill.cuh"
#include "kernels/launch.cuh"
#include "kernels/vec4.cuh"
#include "remat/philox.h"

namespace remat::kernels {

namespace {

constexpr int kBlock = 256;

__device__ REMAT_INLINE float dropped(float v, uint32_t word, float keep_prob, float scale) {
  return philox::uniform(word) < keep_prob ? v * scale : 0.0f;
}

// One Philox evaluation serves four elements: the work item k is Philox block
// offset / 4 + k, whose words offset - lead + 4k + j (j = 0..3) belong to elements
// 4k + j - lead, lead = offset % 4 (those inside [0, n)). Element i therefore uses word
// offset + i, as philox::keep, whatever the grid. With vec (lead = 0, x and y 16-byte
// aligned) a whole block's four elements are one float4.
__global__ void dropout_kernel(const float* x, float* y, int64_t n, uint64_t seed, uint64_t offset, float keep_prob,
                               float scale, bool vec) {
  const uint64_t first_block = offset / 4;
  const auto lead = static_cast<int64_t>(offset % 4);
  const int64_t blocks = ceil_div<int64_t>(lead + n, 4);
  for (int64_t k = grid_start(); k < blocks; k += grid_stride()) {
    const philox::Bits4 r = philox::block(seed, first_block + static_cast<uint64_t>(k));
    const int64_t i0 = 4 * k - lead;  // the element of word 0 (negative before element 0)
    if (vec && i0 + 3 < n) {
      const float4 v = load4(x, k);
      store4(y, k,
             make_float4(dropped(v.x, r.x, keep_prob, scale), dropped(v.y, r.y, keep_prob, scale),
                         dropped(v.z, r.z, keep_prob, scale), dropped(v.w, r.w, keep_prob, scale)));
    } else {
      for (unsigned j = 0; j < 4; ++j) {
        const int64_t i = i0 + j;
        if (i >= 0 && i < n) y[i] = dropped(x[i], philox::component(r, j), keep_prob, scale);
      }
    }
  }
}

}  // namespace

void dropout(const float* x, float* y, int64_t n, float p, uint64_t seed, uint64_t offset, cudaStream_t stream) {
  if (n == 0) return;
  if (p == 0.0f) {
    copy_f32(x, y, n, stream);
    return;
  }
  if (p >= 1.0f) {
    fill_f32(y, n, 0.0f, stream);
    return;
  }
  const float keep_prob = 1.0f - p, scale = 1.0f / keep_prob;  // as the CPU backend
  const bool vec = offset % 4 == 0 && aligned16(x) && aligned16(y);
  const int64_t blocks = ceil_div<int64_t>(static_cast<int64_t>(offset % 4) + n, 4);
  REMAT_LAUNCH(dropout_kernel, dim3(grid_stride_blocks(blocks, kBlock)), dim3(kBlock), 0, stream, x, y, n, seed, offset,
               keep_prob, scale, vec);
}

}  // namespace remat::kernels
