// Validators of the fused attention (src/backends/cpu/flash_attention.cpp).
#include "backends/validate/check.h"

namespace remat::validate {

namespace {

// The fused attention's operands: xq [B, tq, Wq] and xkv [B, tk, Wkv] tiled exactly by the
// column ranges of p (remat/backend.h, FlashAttentionParams); `packed` when xkv is xq.
// `wide_q`: (forward) xq's rows may hold more than q, which then lies at columns q_col ..
// (incremental decoding reads q out of a step's packed q, k, v).
void check_flash(const Check& c, const Shape& xq, const Shape& xkv, bool packed, const FlashAttentionParams& p,
                 bool wide_q = false) {
  if (xq.rank() != 3) c.fail("xq " + xq.str() + ": expected rank 3 (B, tq, columns)");
  if (xkv.rank() != 3) c.fail("xkv " + xkv.str() + ": expected rank 3 (B, tk, columns)");
  if (xq[0] != xkv[0]) c.fail("xq " + xq.str() + " and xkv " + xkv.str() + " have different batch sizes");
  c.positive("n_head", p.n_head);
  c.positive("kv heads", p.kv_heads());
  if (p.n_head % p.kv_heads() != 0)
    c.fail("n_head " + std::to_string(p.n_head) + " is not a multiple of the " + std::to_string(p.kv_heads()) +
           " key/value heads");
  if (p.head_dim < 1 || p.head_dim > 256) c.fail("head_dim " + std::to_string(p.head_dim) + " is outside [1, 256]");
  c.probability("dropout", p.dropout);
  if (p.causal && xq[1] != xkv[1])
    c.fail("causal attention needs as many queries as keys, got " + std::to_string(xq[1]) + " and " +
           std::to_string(xkv[1]));
  const int64_t q = p.n_head * p.head_dim, kv = p.kv_heads() * p.head_dim;
  // The layouts the op reads: [q | k | v] packed, or q alone and [k | v] (either order).
  const bool kv_ok = (p.k_col + kv == p.v_col || p.v_col + kv == p.k_col);
  const bool layout = packed
                          ? (xq[2] == q + 2 * kv && kv_ok && p.q_col >= 0 && p.k_col >= 0 && p.v_col >= 0 &&
                             std::min({p.q_col, p.k_col, p.v_col}) == 0 &&
                             (p.q_col + q == std::min(p.k_col, p.v_col) || std::max(p.k_col, p.v_col) + kv == p.q_col))
                          : ((wide_q ? p.q_col >= 0 && p.q_col + q <= xq[2] : xq[2] == q && p.q_col == 0) &&
                             xkv[2] == 2 * kv && kv_ok && std::min(p.k_col, p.v_col) == 0);
  if (!layout)
    c.fail("xq " + xq.str() + " and xkv " + xkv.str() + " are not tiled by q (columns " + std::to_string(p.q_col) +
           " + " + std::to_string(q) + "), k (" + std::to_string(p.k_col) + " + " + std::to_string(kv) + ") and v (" +
           std::to_string(p.v_col) + " + " + std::to_string(kv) + ")" +
           (packed ? " in one packed tensor" : ": xq holds q alone, xkv k and v"));
}

void check_flash_lens(const Check& ck, const Tensor& kv_lens, int64_t b) {
  if (!kv_lens.defined()) return;
  ck.tensor("kv_lens", kv_lens, DType::i32);
  ck.shape("kv_lens", kv_lens, Shape{b});
}

}  // namespace

void check_flash_attention_forward(const Check& ck, const Tensor& xq, const Tensor& xkv, const Tensor& kv_lens,
                                   const FlashAttentionParams& p, RngState /*rng*/, const Tensor& out,
                                   const Tensor& lse) {
  ck.tensor("xq", xq);
  ck.tensor("xkv", xkv);
  if (xq.dtype() != xkv.dtype()) ck.fail("xq " + xq.str() + " and xkv " + xkv.str() + " need one dtype");
  check_flash(ck, xq.shape(), xkv.shape(), xkv.same_view(xq), p, /*wide_q=*/true);
  check_flash_lens(ck, kv_lens, xq.size(0));
  ck.tensor("out", out);
  ck.shape("out", out, Shape{xq.size(0), xq.size(1), p.n_head * p.head_dim});
  ck.statistics("lse", lse);
  ck.shape("lse", lse, Shape{xq.size(0), p.n_head, xq.size(1)});
  for (const Tensor* t : {&out, &lse})
    if (t->shares_storage(xq) || t->shares_storage(xkv)) ck.fail("out and lse must not share storage with xq or xkv");
  if (out.shares_storage(lse)) ck.fail("out and lse must not share storage");
}

void check_flash_attention_backward_workspace(const Check& ck, const Shape& xq, const Shape& xkv,
                                              const FlashAttentionParams& p) {
  // Shapes alone: packed when xq and xkv look like one [q | k | v] tensor.
  const bool packed = xq == xkv && xq.rank() == 3 && xq[2] == (p.n_head + 2 * int64_t{p.kv_heads()}) * p.head_dim;
  check_flash(ck, xq, xkv, packed, p);
}

void check_flash_attention_backward(const Check& ck, const Tensor& dout, const Tensor& xq, const Tensor& xkv,
                                    const Tensor& kv_lens, const Tensor& out, const Tensor& lse,
                                    const FlashAttentionParams& p, RngState /*rng*/, const Tensor& dxq,
                                    const Tensor& dxkv, const Tensor& workspace) {
  ck.tensor("xq", xq);
  ck.tensor("xkv", xkv);
  const bool packed = xkv.same_view(xq);
  check_flash(ck, xq.shape(), xkv.shape(), packed, p);
  check_flash_lens(ck, kv_lens, xq.size(0));
  const Shape o{xq.size(0), xq.size(1), p.n_head * p.head_dim};
  ck.tensor("out", out);
  ck.shape("out", out, o);
  ck.tensor("dout", dout);
  ck.shape("dout", dout, o);
  ck.statistics("lse", lse);
  ck.shape("lse", lse, Shape{xq.size(0), p.n_head, xq.size(1)});
  ck.tensor("dxq", dxq);
  ck.same_shape("dxq", dxq, "xq", xq);
  ck.tensor("dxkv", dxkv);
  ck.same_shape("dxkv", dxkv, "xkv", xkv);
  if (packed != dxkv.same_view(dxq))
    ck.fail(packed ? "xkv is xq (packed), so dxkv must be dxq" : "dxkv may be dxq only when xkv is xq");
  if (!packed && dxkv.shares_storage(dxq)) ck.fail("dxq and dxkv overlap");
  for (const Tensor* g : {&dxq, &dxkv})
    for (const Tensor* t : {&dout, &xq, &xkv, &out, &lse})
      if (g->shares_storage(*t)) ck.fail("dxq and dxkv must not share storage with dout, xq, xkv, out or lse");
  ck.workspace(workspace, ck.be->flash_attention_backward_workspace(xq.shape(), xkv.shape(), p));
}

}  // namespace remat::validate
