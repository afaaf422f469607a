#include "kernels/attention.cuh"
#include "kernels/launch.cuh"
#include "kernels/reduce.cuh"
#include "kernels/vec4.cuh"
#include "remat/philox.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace remat::kernels {

namespace {

constexpr int kRowWarps = 4;  // rows per block: one warp per row
constexpr int64_t kMaxBlocks = 65535;

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(std::min(ceil_div<int64_t>(rows, kRowWarps), kMaxBlocks));
}

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
// elements are 128 consecutive bytes): the row's words go in chunks of 128 from a Philox
// block boundary, lane l of the warp draws block l of the chunk, and each lane takes its
// word from the lane that drew it by shuffles. Each element gets the same factor as above
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

// One warp per row: max, sum of exponentials, then the normalised row (and its dropped
// copy). The masked tail is written with zeros.
__global__ void softmax_forward_kernel(float* probs, float* dropped, int64_t rows, int64_t t, int64_t row0, bool causal,
                                       AttentionDropout drop) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kRowWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32; r < rows; r += warps) {
    float* row = probs + r * t;
    const int64_t n = causal ? (row0 + r) % t + 1 : t;
    float mx = -INFINITY;
    for (int64_t j = lane; j < n; j += 32) mx = fmaxf(mx, row[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int64_t j = lane; j < n; j += 32) sum += expf(row[j] - mx);
    const float inv = 1.0f / warp_sum(sum);
    if (!drop.on) {
      for (int64_t j = lane; j < t; j += 32) row[j] = j < n ? expf(row[j] - mx) * inv : 0.0f;
      continue;
    }
    float* drow = dropped + r * t;
    const uint64_t w0 = drop.offset + static_cast<uint64_t>(row0 + r) * static_cast<uint64_t>(t);
    // Each element on its own: coalesced (the backward's dot product keeps the order above).
    for_each_dropout_factor_coalesced(drop, w0, n, lane, [&](int64_t j, float factor) {
      const float p = expf(row[j] - mx) * inv;
      row[j] = p;
      drow[j] = p * factor;
    });
    for (int64_t j = n + lane; j < t; j += 32) {
      row[j] = 0.0f;
      drow[j] = 0.0f;
    }
  }
}

// One warp per row: through dropout (g = ds * factor, dropped = probs * factor), the dot
// product sum(g * probs), then ds = probs * (g - dot).
__global__ void softmax_backward_kernel(float* ds, const float* probs, float* dropped, int64_t rows, int64_t t,
                                        int64_t row0, bool causal, AttentionDropout drop) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kRowWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32; r < rows; r += warps) {
    float* g = ds + r * t;
    const float* p = probs + r * t;
    const int64_t n = causal ? (row0 + r) % t + 1 : t;
    float dot = 0.0f;
    if (drop.on) {
      float* drow = dropped + r * t;
      const uint64_t w0 = drop.offset + static_cast<uint64_t>(row0 + r) * static_cast<uint64_t>(t);
      for_each_dropout_factor(drop, w0, n, lane, [&](int64_t j, float factor) {
        const float gj = g[j] * factor;
        g[j] = gj;
        drow[j] = p[j] * factor;
        dot += gj * p[j];
      });
      for (int64_t j = n + lane; j < t; j += 32) drow[j] = 0.0f;
      __syncwarp();  // g is read back below by other lanes
    } else {
      for (int64_t j = lane; j < n; j += 32) dot += g[j] * p[j];
    }
    dot = warp_sum(dot);
    for (int64_t j = lane; j < t; j += 32) g[j] = j < n ? p[j] * (g[j] - dot) : 0.0f;
  }
}

// One thread per unit of an output row y[a, c, b, :] (float4 when kVec4: d % 4 == 0 and
// 16-byte aligned buffers), read from x[a, b, c, :].
template <bool kVec4>
__global__ void permute_0213_kernel(const float* x, int64_t a, int64_t b, int64_t c, int64_t d, float* y) {
  using Unit = typename std::conditional<kVec4, float4, float>::type;
  const int64_t width = kVec4 ? d / 4 : d;
  const int64_t total = a * b * c * width, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const Unit* src = reinterpret_cast<const Unit*>(x);
  Unit* dst = reinterpret_cast<Unit*>(y);
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < total; u += stride) {
    const int64_t k = u % width, r = u / width;  // r = (ai * c + ci) * b + bi
    const int64_t bi = r % b, ci = (r / b) % c, ai = r / (b * c);
    store_unit(dst + u, load_unit(src + ((ai * b + bi) * c + ci) * width + k));
  }
}

}  // namespace

void attention_softmax_forward(float* probs, float* dropped, int64_t rows, int64_t t, int64_t row0, bool causal,
                               const AttentionDropout& drop, cudaStream_t stream) {
  REMAT_LAUNCH(softmax_forward_kernel, dim3(row_blocks(rows)), dim3(32 * kRowWarps), 0, stream, probs, dropped, rows, t,
               row0, causal, drop);
}

void attention_softmax_backward(float* ds, const float* probs, float* dropped, int64_t rows, int64_t t, int64_t row0,
                                bool causal, const AttentionDropout& drop, cudaStream_t stream) {
  REMAT_LAUNCH(softmax_backward_kernel, dim3(row_blocks(rows)), dim3(32 * kRowWarps), 0, stream, ds, probs, dropped,
               rows, t, row0, causal, drop);
}

void permute_0213(const float* x, int64_t a, int64_t b, int64_t c, int64_t d, float* y, cudaStream_t stream) {
  constexpr int kBlock = 256;
  const bool vec4 = d % 4 == 0 && aligned16(x) && aligned16(y);
  const int64_t units = a * b * c * (vec4 ? d / 4 : d);
  const auto blocks = dim3(static_cast<unsigned>(std::min(ceil_div<int64_t>(units, kBlock), kMaxBlocks)));
  if (vec4)
    REMAT_LAUNCH(permute_0213_kernel<true>, blocks, dim3(kBlock), 0, stream, x, a, b, c, d, y);
  else
    REMAT_LAUNCH(permute_0213_kernel<false>, blocks, dim3(kBlock), 0, stream, x, a, b, c, d, y);
}

}  // namespace remat::kernels
