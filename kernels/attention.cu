#include "kernels/attention.cuh"
#include "kernels/attention_dropout.cuh"
#include "kernels/bf16.cuh"
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

// The value an element keeps once stored through p: itself in f32, rounded in bf16.
__device__ REMAT_INLINE float kept(float*, float v) { return v; }
__device__ REMAT_INLINE float kept(bf16*, float v) { return round_bf16(v); }

// One warp per row: max, sum of exponentials, then the normalised row (and its dropped
// copy). The masked tail is written with zeros. fp32: scores is probs (in place). bf16:
// the scores are fp32 (workspace), probs and dropped bf16; the dropped copy is the stored
// (rounded) probability times the mask factor, as on the CPU, rounded again.
template <typename PS, typename PP, typename PD>
__global__ void softmax_forward_kernel(PS scores, PP probs, PD dropped, int64_t rows, int64_t t, int64_t row0,
                                       bool causal, AttentionDropout drop) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kRowWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32; r < rows; r += warps) {
    const PS row = scores + r * t;
    const PP prow = probs + r * t;
    const int64_t n = causal ? (row0 + r) % t + 1 : t;
    float mx = -INFINITY;
    for (int64_t j = lane; j < n; j += 32) mx = fmaxf(mx, row[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int64_t j = lane; j < n; j += 32) sum += expf(row[j] - mx);
    const float inv = 1.0f / warp_sum(sum);
    if (!drop.on) {
      for (int64_t j = lane; j < t; j += 32) st(prow, j, j < n ? expf(row[j] - mx) * inv : 0.0f);
      continue;
    }
    const PD drow = dropped + r * t;
    const uint64_t w0 = drop.offset + static_cast<uint64_t>(row0 + r) * static_cast<uint64_t>(t);
    // Each element on its own: coalesced (the backward's dot product keeps the order above).
    for_each_dropout_factor_coalesced(drop, w0, n, lane, [&](int64_t j, float factor) {
      const float p = kept(prow, expf(row[j] - mx) * inv);
      st(prow, j, p);
      st(drow, j, p * factor);
    });
    for (int64_t j = n + lane; j < t; j += 32) {
      st(prow, j, 0.0f);
      st(drow, j, 0.0f);
    }
  }
}

// One warp per row: through dropout (g = ds * factor, dropped = probs * factor), the dot
// product sum(g * probs), then ds = probs * (g - dot). fp32: ds_out is g (in place). bf16:
// g is dPd in fp32 (workspace), probs and dropped bf16, ds_out bf16 (the GEMMs' factor).
template <typename PP, typename PD, typename PO>
__global__ void softmax_backward_kernel(float* ds, PP probs, PD dropped, PO ds_out, int64_t rows, int64_t t,
                                        int64_t row0, bool causal, AttentionDropout drop) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kRowWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32; r < rows; r += warps) {
    float* g = ds + r * t;
    const PP p = probs + r * t;
    const PO out = ds_out + r * t;
    const int64_t n = causal ? (row0 + r) % t + 1 : t;
    float dot = 0.0f;
    if (drop.on) {
      const PD drow = dropped + r * t;
      const uint64_t w0 = drop.offset + static_cast<uint64_t>(row0 + r) * static_cast<uint64_t>(t);
      for_each_dropout_factor(drop, w0, n, lane, [&](int64_t j, float factor) {
        const float gj = g[j] * factor;
        g[j] = gj;
        const float pj = ld(p, j);
        st(drow, j, pj * factor);
        dot += gj * pj;
      });
      for (int64_t j = n + lane; j < t; j += 32) st(drow, j, 0.0f);
      __syncwarp();  // g is read back below by other lanes
    } else {
      for (int64_t j = lane; j < n; j += 32) dot += g[j] * ld(p, j);
    }
    dot = warp_sum(dot);
    for (int64_t j = lane; j < t; j += 32) st(out, j, j < n ? ld(p, j) * (g[j] - dot) : 0.0f);
  }
}

// One thread per unit of an output row y[a, c, b, :], read from x[a, b, c, :]: kPer
// elements of the tensor's dtype (a float4 or a float for f32; eight bf16 as a uint4, or
// one, for bf16) when d % kPer == 0 and the buffers are aligned to a unit. A copy of bits.
template <typename Unit, int kPer>
__global__ void permute_0213_kernel(const void* x, int64_t a, int64_t b, int64_t c, int64_t d, void* y) {
  const int64_t width = d / kPer;
  const int64_t total = a * b * c * width, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const Unit* src = static_cast<const Unit*>(x);
  Unit* dst = static_cast<Unit*>(y);
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < total; u += stride) {
    const int64_t k = u % width, r = u / width;  // r = (ai * c + ci) * b + bi
    const int64_t bi = r % b, ci = (r / b) % c, ai = r / (b * c);
    store_unit(dst + u, load_unit(src + ((ai * b + bi) * c + ci) * width + k));
  }
}

// One thread per head i < count of the call: entry i of each of the three pointer arrays.
__global__ void head_pointers_kernel(HeadPointerArgs args, int64_t nh, int64_t first, int64_t count, void** ptrs) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const int64_t head = first + i, b = head / nh, h = head % nh;
  for (int j = 0; j < 3; ++j) ptrs[j * count + i] = args.base[j] + b * args.per_b[j] + h * args.per_h[j];
}

}  // namespace

void attention_softmax_forward(float* probs, float* dropped, int64_t rows, int64_t t, int64_t row0, bool causal,
                               const AttentionDropout& drop, cudaStream_t stream) {
  REMAT_LAUNCH((softmax_forward_kernel<float*, float*, float*>), dim3(row_blocks(rows)), dim3(32 * kRowWarps), 0,
               stream, probs, probs, dropped, rows, t, row0, causal, drop);
}

void attention_softmax_forward_bf16(const float* scores, bf16* probs, bf16* dropped, int64_t rows, int64_t t,
                                    int64_t row0, bool causal, const AttentionDropout& drop, cudaStream_t stream) {
  REMAT_LAUNCH((softmax_forward_kernel<const float*, bf16*, bf16*>), dim3(row_blocks(rows)), dim3(32 * kRowWarps), 0,
               stream, scores, probs, dropped, rows, t, row0, causal, drop);
}

void attention_softmax_backward(float* ds, const float* probs, float* dropped, int64_t rows, int64_t t, int64_t row0,
                                bool causal, const AttentionDropout& drop, cudaStream_t stream) {
  REMAT_LAUNCH((softmax_backward_kernel<const float*, float*, float*>), dim3(row_blocks(rows)), dim3(32 * kRowWarps), 0,
               stream, ds, probs, dropped, ds, rows, t, row0, causal, drop);
}

void attention_softmax_backward_bf16(float* dpd, const bf16* probs, bf16* dropped, bf16* ds, int64_t rows, int64_t t,
                                     int64_t row0, bool causal, const AttentionDropout& drop, cudaStream_t stream) {
  REMAT_LAUNCH((softmax_backward_kernel<const bf16*, bf16*, bf16*>), dim3(row_blocks(rows)), dim3(32 * kRowWarps), 0,
               stream, dpd, probs, dropped, ds, rows, t, row0, causal, drop);
}

void permute_0213(const void* x, int64_t a, int64_t b, int64_t c, int64_t d, size_t elem_bytes, void* y,
                  cudaStream_t stream) {
  constexpr int kBlock = 256;
  const bool vec = aligned16(x) && aligned16(y) && (elem_bytes == 4 ? d % 4 == 0 : d % 8 == 0);
  const int64_t per = vec ? 16 / static_cast<int64_t>(elem_bytes) : 1;
  const int64_t units = a * b * c * (d / per);
  const auto blocks = dim3(static_cast<unsigned>(std::min(ceil_div<int64_t>(units, kBlock), kMaxBlocks)));
  if (elem_bytes == 4) {
    if (vec)
      REMAT_LAUNCH((permute_0213_kernel<float4, 4>), blocks, dim3(kBlock), 0, stream, x, a, b, c, d, y);
    else
      REMAT_LAUNCH((permute_0213_kernel<float, 1>), blocks, dim3(kBlock), 0, stream, x, a, b, c, d, y);
  } else {
    if (vec)
      REMAT_LAUNCH((permute_0213_kernel<uint4, 8>), blocks, dim3(kBlock), 0, stream, x, a, b, c, d, y);
    else
      REMAT_LAUNCH((permute_0213_kernel<unsigned short, 1>), blocks, dim3(kBlock), 0, stream, x, a, b, c, d, y);
  }
}

void attention_head_pointers(const HeadPointerArgs& args, int64_t nh, int64_t first, int64_t count, void** ptrs,
                             cudaStream_t stream) {
  constexpr int kBlock = 256;
  REMAT_LAUNCH(head_pointers_kernel, dim3(static_cast<unsigned>(ceil_div<int64_t>(count, kBlock))), dim3(kBlock), 0,
               stream, args, nh, first, count, ptrs);
}

}  // namespace remat::kernels
