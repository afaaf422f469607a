// Allocating wrappers over the Backend interface: each computes the output shapes,
// allocates outputs with the thread's current tag (see TagScope) and workspace with
// category `workspace`, and calls the backend. Tests and tools use these; the executor
// allocates through the same functions so that every backend, meta included, sees the
// same allocation sequence.
#pragma once

#include <vector>

#include "remat/backend.h"

namespace remat::ops {

// A workspace tensor of at least `bytes` bytes (undefined when bytes == 0).
Tensor workspace(Backend& be, size_t bytes);
// A tensor like `t` (shape, dtype, device of the backend), zero-filled / uninitialised.
Tensor zeros_like(Backend& be, const Tensor& t);
Tensor empty_like(Backend& be, const Tensor& t);

Tensor matmul(Backend& be, const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
Tensor linear(Backend& be, const Tensor& x, const Tensor& w, const Tensor& b);
Tensor add(Backend& be, const Tensor& a, const Tensor& b);
Tensor relu(Backend& be, const Tensor& x);
Tensor gelu(Backend& be, const Tensor& x, GeluApprox approx = GeluApprox::none);
Tensor dropout(Backend& be, const Tensor& x, float p, RngState rng);
Tensor softmax(Backend& be, const Tensor& x, bool log = false);

struct CrossEntropy {
  Tensor loss;  // [1]
  Tensor lse;   // [N], saved for backward
};
// smoothing: label smoothing in [0, 1) (backend_ops.def's cross_entropy_forward).
CrossEntropy cross_entropy(Backend& be, const Tensor& logits, const Tensor& targets, int ignore_index = -100,
                           float smoothing = 0.0f);

Tensor conv2d(Backend& be, const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p);
// Returns dx (undefined if !need_dx); accumulates into dw, db when defined.
Tensor conv2d_backward(Backend& be, const Tensor& dy, const Tensor& x, const Tensor& w, const Conv2dParams& p,
                       bool need_dx, const Tensor& dw, const Tensor& db);

struct MaxPool {
  Tensor y;
  Tensor indices;  // u8: the offset of each maximum within its window
};
MaxPool maxpool2d(Backend& be, const Tensor& x, const Pool2dParams& p);
Tensor avgpool2d(Backend& be, const Tensor& x, const Pool2dParams& p);
Tensor global_avgpool(Backend& be, const Tensor& x);

struct Normalized {
  Tensor y;
  Tensor mean;    // batchnorm: save_mean [C]; layernorm: mean [N]
  Tensor invstd;  // batchnorm: save_invstd [C]; layernorm: rstd [N]
};
Normalized batchnorm2d_train(Backend& be, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                             const Tensor& running_mean, const Tensor& running_var, const BatchNormParams& p,
                             bool update_running = true);
Normalized layernorm(Backend& be, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                     const LayerNormParams& p = {});
// Backend::layernorm_backward with its workspace (when dgamma or dbeta is defined).
void layernorm_backward(Backend& be, const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta);

Tensor embedding(Backend& be, const Tensor& ids, const Tensor& table, const Tensor& pos_table);
// Backend::embedding_backward with its workspace (when dtable is defined).
void embedding_backward(Backend& be, const Tensor& dy, const Tensor& ids, const Tensor& dtable,
                        const Tensor& dpos_table);

struct Attention {
  Tensor out;    // [B, T, C]
  Tensor probs;  // [B, H, T, T]
};
Attention attention(Backend& be, const Tensor& qkv, const AttentionParams& p, RngState rng);
// The probabilities only (before dropout, so without it): what recompute rebuilds when
// the attention output is kept.
Tensor attention_probs(Backend& be, const Tensor& qkv, const AttentionParams& p);
Tensor attention_backward(Backend& be, const Tensor& dout, const Tensor& qkv, const Tensor& probs,
                          const AttentionParams& p, RngState rng);
Tensor permute_0213(Backend& be, const Tensor& x);

// Fused attention (Backend::flash_attention_*): xkv is xq for packed self-attention.
struct FlashAttention {
  Tensor out;  // [B, tq, n_head head_dim]
  Tensor lse;  // [B, n_head, tq] f32
};
FlashAttention flash_attention(Backend& be, const Tensor& xq, const Tensor& xkv, const Tensor& kv_lens,
                               const FlashAttentionParams& p, RngState rng);
struct FlashAttentionGrads {
  Tensor dxq;
  Tensor dxkv;  // the same tensor as dxq when xkv is xq
};
FlashAttentionGrads flash_attention_backward(Backend& be, const Tensor& dout, const Tensor& xq, const Tensor& xkv,
                                             const Tensor& kv_lens, const Tensor& out, const Tensor& lse,
                                             const FlashAttentionParams& p, RngState rng);

}  // namespace remat::ops
