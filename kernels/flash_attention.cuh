// Fused (flash) attention kernels: FlashAttention-2's tiles and online softmax, no [T, T]
// buffer. The same algorithm, masks, dropout and backward arrangement as the CPU backend's
// (src/backends/cpu/flash_attention.cpp, whose header comment gives the formulas): forward
// saves out and one log-sum-exp per row; backward is one pass per (b, key/value head, key
// tile) for dK, dV and one per (b, query head, query tile) for dQ, so no sum uses atomics
// and every result is reproducible run to run.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/attention.cuh"  // AttentionDropout
#include "kernels/common.cuh"

namespace remat::kernels {

// One operand: head n's columns [col + n d, col + (n + 1) d) of every row of a [B, T, W]
// tensor in device memory (f32 or bf16, as FlashProblem::bf16 says).
struct FlashOperand {
  const void* data = nullptr;
  int64_t w = 0, col = 0;
};
struct FlashOutput {
  void* data = nullptr;
  int64_t w = 0, col = 0;
};

struct FlashProblem {
  int64_t b = 0, tq = 0, tk = 0;
  int64_t h = 0, hkv = 0, d = 0;  // query heads, key/value heads (h % hkv == 0), head dim (<= 256)
  bool causal = false;            // query i sees keys j <= i (tq == tk)
  bool bf16 = false;              // every operand and output bf16 (fp32 math); else f32
  // Element ((b H + h) tq + i) tk + j of the probabilities is kept when
  // philox::uniform(word(seed, offset + that index)) < keep_prob (the materialised path's
  // rule and indices), and then scaled by drop.scale.
  AttentionDropout drop;
  const int32_t* kv_lens = nullptr;  // device [b]: batch element b sees keys j < kv_lens[b]; null: all
  float scale = 0.0f;                // of q k^T (1 / sqrt(d))
};

// out [B, tq, h d] (head n at out.col + n d) and lse [B, h, tq] (f32, device).
void flash_attention_forward(const FlashProblem& p, const FlashOperand& q, const FlashOperand& k, const FlashOperand& v,
                             const FlashOutput& out, float* lse, cudaStream_t stream);

// Bytes of device workspace backward needs (delta [B, h, tq] = rowsum(dout * out), and any
// partial sums the kernels keep). (No cudaStream_t in its signature: its own namespace in
// the emulated build, kernels/common.cuh.)
REMAT_KERNELS_ABI_BEGIN
size_t flash_attention_backward_workspace(const FlashProblem& p);
REMAT_KERNELS_ABI_END

// dq, dk, dv written (=) in their columns; nothing else of those tensors is touched.
void flash_attention_backward(const FlashProblem& p, const FlashOperand& q, const FlashOperand& k,
                              const FlashOperand& v, const FlashOperand& out, const FlashOperand& dout,
                              const float* lse, void* workspace, const FlashOutput& dq, const FlashOutput& dk,
                              const FlashOutput& dv, cudaStream_t stream);

}  // namespace remat::kernels
