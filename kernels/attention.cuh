// Attention row kernels (the GEMMs go through cuBLAS, src/backends/cuda/attention.cpp):
// the causal/scaled softmax with dropout over rows of attention scores, its backward, and
// the head permute.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/bf16.cuh"

namespace remat::kernels {

// Dropout on the attention probabilities. Element e of probs [B, H, T, T] (flat index) is
// kept when philox::uniform(word(seed, offset + e)) < keep_prob, and then scaled by
// `scale` (1 / keep_prob); `on` is false when nothing can be dropped.
struct AttentionDropout {
  bool on = false;
  float keep_prob = 1.0f;
  float scale = 1.0f;
  uint64_t seed = 0;
  uint64_t offset = 0;
};

// Rows r < rows of length t (row0 + r is the row's index in probs [B, H, T, T], so the
// query position is (row0 + r) % t). probs holds scores on entry and the softmax over the
// first n entries of each row on exit (n = i + 1 when causal, else t), zeros after them.
// With dropout, dropped (rows x t) receives the dropped probabilities.
void attention_softmax_forward(float* probs, float* dropped, int64_t rows, int64_t t, int64_t row0, bool causal,
                               const AttentionDropout& drop, cudaStream_t stream);

// Rows as above; ds holds dL/d(dropped probs) on entry and dL/d(scores) on exit:
// g = ds * mask * scale (dropout), ds = probs * (g - sum(g * probs)) over the first n
// entries, zeros after. With dropout, dropped receives the dropped probabilities.
void attention_softmax_backward(float* ds, const float* probs, float* dropped, int64_t rows, int64_t t, int64_t row0,
                                bool causal, const AttentionDropout& drop, cudaStream_t stream);

// bf16 (training.precision bf16): the scores are fp32 (workspace), the probabilities and
// their dropped copy bf16 (each stored probability rounded, the dropped copy the rounded
// probability times the factor, rounded); backward reads dPd in fp32 (scaled in place
// through dropout) and bf16 probabilities, and writes dS in bf16 for the bf16 GEMMs.
void attention_softmax_forward_bf16(const float* scores, bf16* probs, bf16* dropped, int64_t rows, int64_t t,
                                    int64_t row0, bool causal, const AttentionDropout& drop, cudaStream_t stream);
void attention_softmax_backward_bf16(float* dpd, const bf16* probs, bf16* dropped, bf16* ds, int64_t rows, int64_t t,
                                     int64_t row0, bool causal, const AttentionDropout& drop, cudaStream_t stream);

// The pointer arrays of one batched GEMM over attention heads (cublasSgemmBatched,
// cublasGemmBatchedEx), written on `stream` into device memory so the host never waits:
// head `first + i` (i < count) is (b, h) = ((first + i) / nh, (first + i) % nh), and entry
// i of array j (j = 0, 1, 2: the GEMM's A, B, C; array j at ptrs + j * count) is
// base[j] + b * per_b[j] + h * per_h[j], offsets in bytes.
struct HeadPointerArgs {
  char* base[3];
  int64_t per_b[3], per_h[3];
};
void attention_head_pointers(const HeadPointerArgs& args, int64_t nh, int64_t first, int64_t count, void** ptrs,
                             cudaStream_t stream);

// x [a, b, c, d] -> y [a, c, b, d], elements of elem_bytes (4: f32, 2: bf16) bytes.
void permute_0213(const void* x, int64_t a, int64_t b, int64_t c, int64_t d, size_t elem_bytes, void* y,
                  cudaStream_t stream);

}  // namespace remat::kernels
