#include "remat/ops.h"

#include "remat/error.h"

namespace remat::ops {

namespace {
// Outputs are float activations (their dtype in scope: bf16 under training.precision
// bf16) unless said f32 (statistics, the loss) or i32.
Tensor out(Backend& be, const Shape& s) { return Tensor::empty(s, be.device(), activation_dtype()); }
Tensor out(Backend& be, const Shape& s, DType dt) { return Tensor::empty(s, be.device(), dt); }
}  // namespace

Tensor workspace(Backend& be, size_t bytes) {
  if (bytes == 0) return Tensor();
  const AllocTag& cur = current_tag();
  AllocTag tag{MemoryCategory::workspace, cur.owner, cur.phase};
  return Tensor::empty(Shape{static_cast<int64_t>((bytes + 3) / 4)}, be.device(), DType::f32, tag);
}

Tensor zeros_like(Backend& be, const Tensor& t) { return Tensor::zeros(t.shape(), be.device(), t.dtype()); }
Tensor empty_like(Backend& be, const Tensor& t) { return Tensor::empty(t.shape(), be.device(), t.dtype()); }

Tensor matmul(Backend& be, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  REMAT_CHECK(a.rank() >= 2 && b.rank() >= 2, "matmul: a ", a.str(), " and b ", b.str(), " must have rank >= 2");
  auto dims = a.shape().dims();
  const int64_t m = trans_a ? a.size(-1) : a.size(-2);
  const int64_t n = trans_b ? b.size(-2) : b.size(-1);
  dims[dims.size() - 2] = m;
  dims[dims.size() - 1] = n;
  Tensor c = out(be, Shape(dims));
  be.gemm(a, b, c, GemmParams{trans_a, trans_b, 1.0f, 0.0f});
  return c;
}

Tensor linear(Backend& be, const Tensor& x, const Tensor& w, const Tensor& b) {
  REMAT_CHECK(x.rank() >= 1 && w.rank() == 2, "linear: x ", x.str(), " and w ", w.str());
  auto dims = x.shape().dims();
  dims.back() = w.size(0);
  Tensor y = out(be, Shape(dims));
  be.linear_forward(x, w, b, y);
  return y;
}

Tensor add(Backend& be, const Tensor& a, const Tensor& b) {
  Tensor y = out(be, a.shape());
  be.add(a, b, y);
  return y;
}

Tensor relu(Backend& be, const Tensor& x) {
  Tensor y = out(be, x.shape());
  be.relu_forward(x, y);
  return y;
}

Tensor gelu(Backend& be, const Tensor& x, GeluApprox approx) {
  Tensor y = out(be, x.shape());
  be.gelu_forward(x, approx, y);
  return y;
}

Tensor dropout(Backend& be, const Tensor& x, float p, RngState rng) {
  Tensor y = out(be, x.shape());
  be.dropout_forward(x, p, rng, y);
  return y;
}

Tensor softmax(Backend& be, const Tensor& x, bool log) {
  Tensor y = out(be, x.shape());
  be.softmax_forward(x, log, y);
  return y;
}

CrossEntropy cross_entropy(Backend& be, const Tensor& logits, const Tensor& targets, int ignore_index,
                           float smoothing) {
  REMAT_CHECK(logits.rank() == 2, "cross_entropy: logits ", logits.str(), ": expected rank 2");
  CrossEntropy r{out(be, Shape{1}, DType::f32), out(be, Shape{logits.size(0)}, DType::f32)};
  Tensor ws = workspace(be, be.cross_entropy_forward_workspace(logits.shape(), smoothing));
  be.cross_entropy_forward(logits, targets, ignore_index, smoothing, r.loss, r.lse, ws);
  return r;
}

Tensor conv2d(Backend& be, const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p) {
  Tensor y = out(be, conv2d_output_shape(x.shape(), w.shape(), p));
  Tensor ws = workspace(be, be.conv2d_forward_workspace(x.shape(), w.shape(), p));
  be.conv2d_forward(x, w, b, p, y, ws);
  return y;
}

Tensor conv2d_backward(Backend& be, const Tensor& dy, const Tensor& x, const Tensor& w, const Conv2dParams& p,
                       bool need_dx, const Tensor& dw, const Tensor& db) {
  Tensor dx = need_dx ? out(be, x.shape()) : Tensor();
  Tensor ws = workspace(be, be.conv2d_backward_workspace(x.shape(), w.shape(), p));
  be.conv2d_backward(dy, x, w, p, dx, dw, db, ws);
  return dx;
}

MaxPool maxpool2d(Backend& be, const Tensor& x, const Pool2dParams& p) {
  const Shape s = pool2d_output_shape(x.shape(), p);
  MaxPool r{out(be, s), out(be, s, DType::u8)};
  be.maxpool2d_forward(x, p, r.y, r.indices);
  return r;
}

Tensor avgpool2d(Backend& be, const Tensor& x, const Pool2dParams& p) {
  Tensor y = out(be, pool2d_output_shape(x.shape(), p));
  be.avgpool2d_forward(x, p, y);
  return y;
}

Tensor global_avgpool(Backend& be, const Tensor& x) {
  REMAT_CHECK(x.rank() == 4, "global_avgpool: x ", x.str(), ": expected rank 4");
  Tensor y = out(be, Shape{x.size(0), x.size(1)});
  be.global_avgpool_forward(x, y);
  return y;
}

Normalized batchnorm2d_train(Backend& be, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                             const Tensor& running_mean, const Tensor& running_var, const BatchNormParams& p,
                             bool update_running) {
  REMAT_CHECK(x.rank() == 4, "batchnorm2d: x ", x.str(), ": expected rank 4");
  Normalized r{out(be, x.shape()), out(be, Shape{x.size(1)}, DType::f32), out(be, Shape{x.size(1)}, DType::f32)};
  be.batchnorm2d_forward_train(x, gamma, beta, running_mean, running_var, p, update_running, r.y, r.mean, r.invstd);
  return r;
}

Normalized layernorm(Backend& be, const Tensor& x, const Tensor& gamma, const Tensor& beta, const LayerNormParams& p) {
  REMAT_CHECK(x.rank() >= 1 && x.size(-1) > 0, "layernorm: x ", x.str(), ": expected a non-empty last dimension");
  const int64_t n = x.numel() / x.size(-1);
  Normalized r{out(be, x.shape()), out(be, Shape{n}, DType::f32), out(be, Shape{n}, DType::f32)};
  be.layernorm_forward(x, gamma, beta, p, r.y, r.mean, r.invstd);
  return r;
}

void layernorm_backward(Backend& be, const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) {
  const bool params = dgamma.defined() || dbeta.defined();
  Tensor ws = params ? workspace(be, be.layernorm_backward_workspace(x.shape())) : Tensor();
  be.layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, ws);
}

Tensor embedding(Backend& be, const Tensor& ids, const Tensor& table, const Tensor& pos_table) {
  REMAT_CHECK(ids.rank() == 2 && table.rank() == 2, "embedding: ids ", ids.str(), " and table ", table.str());
  Tensor y = out(be, Shape{ids.size(0), ids.size(1), table.size(1)});
  be.embedding_forward(ids, table, pos_table, y);
  return y;
}

void embedding_backward(Backend& be, const Tensor& dy, const Tensor& ids, const Tensor& dtable,
                        const Tensor& dpos_table) {
  Tensor ws = dtable.defined() ? workspace(be, be.embedding_backward_workspace(dy.shape())) : Tensor();
  be.embedding_backward(dy, ids, dtable, dpos_table, ws);
}

Attention attention(Backend& be, const Tensor& qkv, const AttentionParams& p, RngState rng) {
  REMAT_CHECK(qkv.rank() == 3, "attention: qkv ", qkv.str(), ": expected rank 3");
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3;
  Attention r{out(be, Shape{b, t, c}), out(be, Shape{b, p.n_head, t, t})};
  Tensor ws = workspace(be, be.attention_forward_workspace(qkv.shape(), p));
  be.attention_forward(qkv, p, rng, r.out, r.probs, ws);
  return r;
}

Tensor attention_probs(Backend& be, const Tensor& qkv, const AttentionParams& p) {
  REMAT_CHECK(qkv.rank() == 3, "attention: qkv ", qkv.str(), ": expected rank 3");
  AttentionParams q = p;
  q.dropout = 0.0f;  // the probabilities are taken before dropout
  Tensor probs = out(be, Shape{qkv.size(0), p.n_head, qkv.size(1), qkv.size(1)});
  Tensor ws = workspace(be, be.attention_forward_workspace(qkv.shape(), q));
  be.attention_forward(qkv, q, RngState{}, Tensor(), probs, ws);
  return probs;
}

Tensor attention_backward(Backend& be, const Tensor& dout, const Tensor& qkv, const Tensor& probs,
                          const AttentionParams& p, RngState rng) {
  Tensor dqkv = out(be, qkv.shape());
  Tensor ws = workspace(be, be.attention_backward_workspace(qkv.shape(), p));
  be.attention_backward(dout, qkv, probs, p, rng, dqkv, ws);
  return dqkv;
}

FlashAttention flash_attention(Backend& be, const Tensor& xq, const Tensor& xkv, const Tensor& kv_lens,
                               const FlashAttentionParams& p, RngState rng) {
  REMAT_CHECK(xq.rank() == 3, "flash_attention: xq ", xq.str(), ": expected rank 3");
  const int64_t b = xq.size(0), tq = xq.size(1);
  FlashAttention r{out(be, Shape{b, tq, p.n_head * p.head_dim}), out(be, Shape{b, p.n_head, tq}, DType::f32)};
  be.flash_attention_forward(xq, xkv, kv_lens, p, rng, r.out, r.lse);
  return r;
}

FlashAttentionGrads flash_attention_backward(Backend& be, const Tensor& dout, const Tensor& xq, const Tensor& xkv,
                                             const Tensor& kv_lens, const Tensor& out, const Tensor& lse,
                                             const FlashAttentionParams& p, RngState rng) {
  FlashAttentionGrads g;
  g.dxq = ops::out(be, xq.shape());
  g.dxkv = xkv.same_view(xq) ? g.dxq : ops::out(be, xkv.shape());
  Tensor ws = workspace(be, be.flash_attention_backward_workspace(xq.shape(), xkv.shape(), p));
  be.flash_attention_backward(dout, xq, xkv, kv_lens, out, lse, p, rng, g.dxq, g.dxkv, ws);
  return g;
}

Tensor permute_0213(Backend& be, const Tensor& x) {
  REMAT_CHECK(x.rank() == 4, "permute_0213: x ", x.str(), ": expected rank 4");
  Tensor y = out(be, Shape{x.size(0), x.size(2), x.size(1), x.size(3)});
  be.permute_0213(x, y);
  return y;
}

}  // namespace remat::ops
