// The attention probabilities' dropout mask on the device, shared by the materialised
// attention's row kernels (attention.cu) and the fused attention (flash_attention.cu):
// element e of a row whose first element uses Philox word w0 uses word w0 + e of the op's
// stream (include/remat/philox.h, the one Philox), kept when its uniform is below
// drop.keep_prob. Both helpers give each element the same factor; they differ only in
// which lane handles it.
#pragma once

#include <cstdint>

#include "kernels/attention.cuh"  // AttentionDropout
#include "kernels/reduce.cuh"     // kFullMask
#include "remat/philox.h"

namespace remat::kernels {

// Calls f(j, factor) for the first n elements of a row whose element j uses Philox word
// w0 + j, with factor = drop.scale if the element is kept, else 0. Each lane takes whole
// Philox blocks (four words, one philox4x32_10 call), blocks lane, lane + 32, ... of the
// row; so lanes touch four consecutive elements each: a warp's access spans 512 bytes for
// 128 requested (25% coalesced). The backward keeps it, as its dot product adds each
// lane's elements in this order.
template <typename F>
__device__ REMAT_INLINE void for_each_dropout_factor(const AttentionDropout& drop, uint64_t w0, int64_t n, int lane,
                                                     F&& f) {
  const uint64_t last = w0 + static_cast<uint64_t>(n) - 1;
  for (uint64_t blk = (w0 >> 2) + static_cast<uint64_t>(lane); blk <= (last >> 2); blk += 32) {
    const philox::Bits4 bits = philox::block(drop.seed, blk);
    for (unsigned k = 0; k < 4; ++k) {
      const uint64_t w = blk * 4 + k;
      if (w < w0 || w > last) continue;
      const float u = philox::uniform(philox::component(bits, k));
      f(static_cast<int64_t>(w - w0), u < drop.keep_prob ? drop.scale : 0.0f);
    }
  }
}

// The same calls with lane l taking elements l, l + 32, ... (coalesced: a warp's 32
// elements are consecutive): the row's words go in chunks of 128 from a Philox block
// boundary, lane l of the warp draws block l of the chunk, and each lane takes its word
// from the lane that drew it by shuffles. Each element gets the same factor as above
// (word w0 + j); only which lane handles it, and in which order, differ. Every lane of the
// warp calls it (the shuffles), with the same w0 and n.
template <typename F>
__device__ REMAT_INLINE void for_each_dropout_factor_coalesced(const AttentionDropout& drop, uint64_t w0, int64_t n,
                                                               int lane, F&& f) {
  if (n <= 0) return;
  const uint64_t last = w0 + static_cast<uint64_t>(n) - 1;
  for (uint64_t base = w0 & ~uint64_t{3}; base <= last; base += 128) {
    const philox::Bits4 mine = philox::block(drop.seed, (base >> 2) + static_cast<uint64_t>(lane));
    for (int m = 0; m < 4; ++m) {
      // Word base + 32 m + lane is component lane % 4 of block 8 m + lane / 4 of the chunk.
      const int src = 8 * m + lane / 4;
      const philox::Bits4 theirs{__shfl_sync(kFullMask, mine.x, src), __shfl_sync(kFullMask, mine.y, src),
                                 __shfl_sync(kFullMask, mine.z, src), __shfl_sync(kFullMask, mine.w, src)};
      const uint64_t w = base + static_cast<uint64_t>(32 * m + lane);
      if (w < w0 || w > last) continue;
      const float u = philox::uniform(philox::component(theirs, static_cast<unsigned>(lane % 4)));
      f(static_cast<int64_t>(w - w0), u < drop.keep_prob ? drop.scale : 0.0f);
    }
  }
}

}  // namespace remat::kernels
