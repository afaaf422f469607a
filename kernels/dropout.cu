#include "kernels/dropout.cuh"

#include "kernels/bf16.cuh"
#include "kernels/elementwise.cuh"
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
// offset + i, as philox::keep, whatever the grid or the dtypes: a bf16 tensor keeps the
// elements the fp32 one keeps. With vec (lead = 0, x and y aligned to the four elements)
// a whole block's four elements are one vector: a float4, or four bf16 (8 bytes).
template <typename PX, typename PY>
__global__ void dropout_kernel(PX x, PY y, int64_t n, uint64_t seed, uint64_t offset, float keep_prob, float scale,
                               bool vec) {
  const uint64_t first_block = offset / 4;
  const auto lead = static_cast<int64_t>(offset % 4);
  const int64_t blocks = ceil_div<int64_t>(lead + n, 4);
  for (int64_t k = grid_start(); k < blocks; k += grid_stride()) {
    const philox::Bits4 r = philox::block(seed, first_block + static_cast<uint64_t>(k));
    const int64_t i0 = 4 * k - lead;  // the element of word 0 (negative before element 0)
    if constexpr (is_f32_ptr<PX>) {
      if (vec && i0 + 3 < n) {
        const float4 v = load4(x, k);
        store4(y, k,
               make_float4(dropped(v.x, r.x, keep_prob, scale), dropped(v.y, r.y, keep_prob, scale),
                           dropped(v.z, r.z, keep_prob, scale), dropped(v.w, r.w, keep_prob, scale)));
        continue;
      }
    } else if constexpr (is_bf16_ptr<PX>) {
      if (vec && i0 + 3 < n) {
        float v[4];
        load4(x, k, v);
        for (unsigned j = 0; j < 4; ++j) v[j] = dropped(v[j], philox::component(r, j), keep_prob, scale);
        store4(y, k, v);
        continue;
      }
    }
    for (unsigned j = 0; j < 4; ++j) {
      const int64_t i = i0 + j;
      if (i >= 0 && i < n) st(y, i, dropped(ld(x, i), philox::component(r, j), keep_prob, scale));
    }
  }
}

bool aligned8(const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; }

}  // namespace

void dropout(FloatBuf x, FloatBuf y, int64_t n, float p, uint64_t seed, uint64_t offset, cudaStream_t stream) {
  if (n == 0) return;
  if (p == 0.0f) {
    copy(x, y, n, stream);
    return;
  }
  if (p >= 1.0f) {
    zero(y, n, stream);
    return;
  }
  const float keep_prob = 1.0f - p, scale = 1.0f / keep_prob;  // as the CPU backend
  const int64_t blocks = ceil_div<int64_t>(static_cast<int64_t>(offset % 4) + n, 4);
  with_types(
      [&](auto px, auto py) {
        using PX = decltype(px);
        using PY = decltype(py);
        const bool vec = offset % 4 == 0 && (is_f32_ptr<PX>    ? aligned16(x.p) && aligned16(y.p)
                                             : is_bf16_ptr<PX> ? aligned8(x.p) && aligned8(y.p)
                                                               : false);
        REMAT_LAUNCH((dropout_kernel<PX, PY>), dim3(grid_stride_blocks(blocks, kBlock)), dim3(kBlock), 0, stream, px,
                     py, n, seed, offset, keep_prob, scale, vec);
      },
      x, y);
}

}  // namespace remat::kernels
