// Validators of attention, its workspace queries and permute_0213 (src/backends/cpu/attention.cpp).
#include "backends/validate/check.h"

namespace remat::validate {

namespace {

void check_attention(const Check& c, const Shape& qkv, const AttentionParams& p) {
  if (qkv.rank() != 3) c.fail("qkv " + qkv.str() + ": expected rank 3 (B, T, 3C)");
  c.positive("n_head", p.n_head);
  c.probability("dropout", p.dropout);
  if (qkv[2] <= 0) c.fail("qkv " + qkv.str() + ": last dimension (3 * C) must be positive");
  if (qkv[2] % (3 * int64_t{p.n_head}) != 0)
    c.fail("qkv " + qkv.str() + ": last dimension must be 3 * C with C divisible by n_head " +
           std::to_string(p.n_head));
}

}  // namespace

void check_attention_forward_workspace(const Check& ck, const Shape& qkv, const AttentionParams& p) {
  check_attention(ck, qkv, p);
}

void check_attention_forward(const Check& ck, const Tensor& qkv, const AttentionParams& p, RngState /*rng*/,
                             const Tensor& out, const Tensor& probs, const Tensor& workspace) {
  ck.tensor("qkv", qkv);
  check_attention(ck, qkv.shape(), p);
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3;
  if (out.defined()) {  // undefined: the probabilities only
    ck.tensor("out", out);
    ck.shape("out", out, Shape{b, t, c});
  }
  ck.tensor("probs", probs);
  ck.shape("probs", probs, Shape{b, p.n_head, t, t});
  if (out.defined() && (out.shares_storage(qkv) || out.shares_storage(probs)))
    ck.fail("qkv, out and probs must not share storage");
  if (probs.shares_storage(qkv)) ck.fail("qkv, out and probs must not share storage");
  ck.workspace(workspace, ck.be->attention_forward_workspace(qkv.shape(), p));
}

void check_attention_backward_workspace(const Check& ck, const Shape& qkv, const AttentionParams& p) {
  check_attention(ck, qkv, p);
}

void check_attention_backward(const Check& ck, const Tensor& dout, const Tensor& qkv, const Tensor& probs,
                              const AttentionParams& p, RngState /*rng*/, const Tensor& dqkv, const Tensor& workspace) {
  ck.tensor("qkv", qkv);
  check_attention(ck, qkv.shape(), p);
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3;
  ck.tensor("dout", dout);
  ck.shape("dout", dout, Shape{b, t, c});
  ck.tensor("probs", probs);
  ck.shape("probs", probs, Shape{b, p.n_head, t, t});
  ck.tensor("dqkv", dqkv);
  ck.same_shape("dqkv", dqkv, "qkv", qkv);
  if (dqkv.shares_storage(qkv) || dqkv.shares_storage(dout) || dqkv.shares_storage(probs))
    ck.fail("dqkv must not share storage with qkv, dout or probs");
  ck.workspace(workspace, ck.be->attention_backward_workspace(qkv.shape(), p));
}

void check_permute_0213(const Check& ck, const Tensor& x, const Tensor& y) {
  ck.tensor("x", x);
  ck.tensor("y", y);
  ck.rank("x", x, 4);
  ck.shape("y", y, Shape{x.size(0), x.size(2), x.size(1), x.size(3)});
  if (x.dtype() != y.dtype())
    ck.fail("x " + x.str() + " and y " + y.str() + ": a permutation copies elements, so x and y need one dtype");
  if (x.shares_storage(y)) ck.fail("x and y must not share storage");
}

}  // namespace remat::validate
