// The fused (flash) attention of the CPU backend, on raw pointers: FlashAttention-2's
// tiles and online softmax, no [T, T] buffer at any point (flash_attention.cpp says how).
// CpuBackend::flash_attention_*_impl turn tensors into these.
#pragma once

#include <cstdint>

#include "remat/rng.h"

namespace remat::cpu::flash {

// One operand: head n's columns [col + n * d, col + (n + 1) * d) of every row of a
// [B, T, W] tensor of f32 or bf16 (uint16) elements.
struct Operand {
  const void* data = nullptr;
  bool bf16 = false;
  int64_t w = 0, col = 0;
};
struct Output {
  void* data = nullptr;
  bool bf16 = false;
  int64_t w = 0, col = 0;
};

struct Problem {
  int64_t b = 0, tq = 0, tk = 0;
  int64_t h = 0, hkv = 0, d = 0;     // query heads, key/value heads (h % hkv == 0), head dim
  bool causal = false;               // query i sees keys j <= i (tq == tk)
  float dropout = 0.0f;              // on the probabilities; applied when 1 - dropout < 1 in float
  RngState rng;                      // element ((b H + h) tq + i) tk + j uses word offset + that index
  const int32_t* kv_lens = nullptr;  // [b]: batch element b sees keys j < kv_lens[b]; null: all
  float scale = 0.0f;                // of q k^T (1 / sqrt(d))
};

// The largest head dimension the tiles hold.
constexpr int64_t kMaxHeadDim = 256;

// out [B, tq, h d] (its columns of head n at out.col + n d) and lse [B, h, tq] (f32): the
// log-sum-exp of each row's scaled scores, which backward rebuilds the probabilities from.
void forward(const Problem& p, const Operand& q, const Operand& k, const Operand& v, const Output& out, float* lse);

// Floats of backward's workspace: delta[B, h, tq] = rowsum(dout * out), and the one-pass
// dQ accumulator [B, h, tq, d] (fp32).
int64_t backward_workspace_floats(const Problem& p);

// Backward runs one pass (dK, dV and dQ per (b, key/value head), when those units keep the
// threads busy) or two (dK, dV per key tile, then dQ per query tile): the same bits. 0:
// chosen so (the default); 1 or 2: forced, for tests.
void set_backward_passes(int passes);

// dq, dk, dv (written, =) from dout and what forward gave (out, lse); workspace as above.
void backward(const Problem& p, const Operand& q, const Operand& k, const Operand& v, const Operand& out,
              const Operand& dout, const float* lse, float* workspace, const Output& dq, const Output& dk,
              const Output& dv);

}  // namespace remat::cpu::flash
