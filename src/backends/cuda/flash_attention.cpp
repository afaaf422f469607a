// Fused (flash) attention on the GPU (kernels/flash_attention.cu), with the CPU backend's
// semantics (src/backends/cpu/flash_attention.cpp): the operands are column ranges of xq
// and xkv read in place, out and lse written; backward writes dxq and dxkv in their columns
// (one tensor for packed self-attention). kv_lens are checked against tk on the host: from
// the range the tensor was made with when it was made there, else by one small copy.
#include <cmath>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "kernels/flash_attention.cuh"
#include "remat/error.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

namespace {

kernels::FlashProblem flash_problem(const CudaBackend& be, const Tensor& xq, const Tensor& xkv, const Tensor& kv_lens,
                                    const FlashAttentionParams& p, RngState rng) {
  kernels::FlashProblem q;
  q.b = xq.size(0);
  q.tq = xq.size(1);
  q.tk = xkv.size(1);
  q.h = p.n_head;
  q.hkv = p.kv_heads();
  q.d = p.head_dim;
  q.causal = p.causal;
  q.bf16 = xq.dtype() == DType::bf16;
  q.drop.on = p.applies_dropout();
  q.drop.keep_prob = 1.0f - p.dropout;
  q.drop.scale = 1.0f / q.drop.keep_prob;
  q.drop.seed = rng.seed;
  q.drop.offset = rng.offset;
  q.scale = 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  if (kv_lens.defined()) {
    q.kv_lens = kv_lens.i32();
    const Storage::IntRange* known = kv_lens.storage()->int_range();
    if (!known || known->lo < 1 || known->hi > q.tk) {
      std::vector<int32_t> lens(static_cast<size_t>(q.b));
      be.copy_to_host(lens.data(), q.kv_lens, lens.size() * sizeof(int32_t));
      for (int64_t b = 0; b < q.b; ++b)
        REMAT_CHECK(lens[static_cast<size_t>(b)] >= 1 && lens[static_cast<size_t>(b)] <= q.tk,
                    "flash_attention: kv_lens[", b, "] = ", lens[static_cast<size_t>(b)], " is outside [1, ", q.tk,
                    "] (the keys of xkv ", xkv.str(), ")");
    }
  }
  return q;
}

kernels::FlashOperand operand(const Tensor& x, int64_t col) { return {x.raw_data(), x.size(2), col}; }
kernels::FlashOutput output(const Tensor& x, int64_t col) { return {x.raw_data(), x.size(2), col}; }

}  // namespace

void CudaBackend::flash_attention_forward_impl(const Tensor& xq, const Tensor& xkv, const Tensor& kv_lens,
                                               const FlashAttentionParams& p, RngState rng, const Tensor& out,
                                               const Tensor& lse) {
  kernels::flash_attention_forward(flash_problem(*this, xq, xkv, kv_lens, p, rng), operand(xq, p.q_col),
                                   operand(xkv, p.k_col), operand(xkv, p.v_col), output(out, 0), lse.f32(), stream());
}

size_t CudaBackend::flash_attention_backward_workspace_impl(const Shape& xq, const Shape& xkv,
                                                            const FlashAttentionParams& p) {
  kernels::FlashProblem q;
  q.b = xq[0];
  q.tq = xq[1];
  q.tk = xkv[1];
  q.h = p.n_head;
  q.hkv = p.kv_heads();
  q.d = p.head_dim;
  q.causal = p.causal;
  q.bf16 = activation_dtype() == DType::bf16;
  q.drop.on = p.applies_dropout();
  return kernels::flash_attention_backward_workspace(q);
}

void CudaBackend::flash_attention_backward_impl(const Tensor& dout, const Tensor& xq, const Tensor& xkv,
                                                const Tensor& kv_lens, const Tensor& out, const Tensor& lse,
                                                const FlashAttentionParams& p, RngState rng, const Tensor& dxq,
                                                const Tensor& dxkv, const Tensor& workspace) {
  kernels::flash_attention_backward(flash_problem(*this, xq, xkv, kv_lens, p, rng), operand(xq, p.q_col),
                                    operand(xkv, p.k_col), operand(xkv, p.v_col), operand(out, 0), operand(dout, 0),
                                    lse.f32(), workspace.raw_data(), output(dxq, p.q_col), output(dxkv, p.k_col),
                                    output(dxkv, p.v_col), stream());
}

REMAT_KERNELS_ABI_END
}  // namespace remat
