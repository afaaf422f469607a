// Gradient cases: each op's backward on the device under test against central differences
// of its own forward on that device, L = sum(dy * y) with a fixed random dy (ggml's grad
// mode). Independent of the cpu backend: a device whose forward and backward agreed with
// the cpu's wrong formulas would still fail here.
//
// Tolerances: OpCheck::GradOptions' defaults (eps 1e-2, rtol 2e-2, atol 2e-3: central
// differences of an fp32 forward on O(1) values) unless a case says why it differs.
// Inputs stay away from kinks (ReLU's 0, max-pool ties) by construction.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend_ops/harness.h"
#include "remat/ops.h"

namespace remat::test {

namespace {

// Values in [lo, hi) with |v| >= gap (away from ReLU's kink and pooling ties).
Pair away_from_zero(OpCheck& t, const Shape& s, float gap) {
  Pair p = t.uniform(s, -1.0f, 1.0f);
  auto v = p.ref.to_vector();
  for (auto& x : v) x = x < 0 ? x - gap : x + gap;
  return t.values(v, s);
}

// Distinct values (a permutation of a spread grid, shuffled): max pooling's argmax is
// unique and stays so under a perturbation of eps.
Pair distinct(OpCheck& t, const Shape& s) {
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = -1.0f + 2.0f * static_cast<float>(i) / static_cast<float>(v.size());
  std::shuffle(v.begin(), v.end(), t.rng());
  return t.values(v, s);
}

}  // namespace

REMAT_OP_CASE(grad, pointwise) {
  const Shape s{3, 37};
  auto x = away_from_zero(t, s, 0.05f), dy = t.uniform(s);
  auto y = t.output(s);
  {
    auto dx = t.output(s);
    t.run([&](Backend& be, Side d) { be.relu_backward(d(dy), d(x), d(dx)); });
    t.expect_gradient("relu", x, dx, [&](Backend& be) {
      be.relu_forward(x.dut, y.dut);
      return dot(dy.dut, y.dut);
    });
  }
  for (GeluApprox a : {GeluApprox::none, GeluApprox::tanh}) {
    auto dx = t.output(s);
    t.run([&](Backend& be, Side d) { be.gelu_backward(d(dy), d(x), a, d(dx)); });
    t.expect_gradient(a == GeluApprox::none ? "gelu" : "gelu tanh", x, dx, [&](Backend& be) {
      be.gelu_forward(x.dut, a, y.dut);
      return dot(dy.dut, y.dut);
    });
  }
  {
    const RngState rng{77, 8};
    auto dx = t.output(s);
    t.run([&](Backend& be, Side d) { be.dropout_backward(d(dy), 0.3f, rng, d(dx)); });
    t.expect_gradient("dropout", x, dx, [&](Backend& be) {
      be.dropout_forward(x.dut, 0.3f, rng, y.dut);
      return dot(dy.dut, y.dut);
    });
  }
}

REMAT_OP_CASE(grad, softmax) {
  const Shape s{4, 19};
  auto x = t.uniform(s, -2.0f, 2.0f), dy = t.uniform(s);
  for (bool log : {false, true}) {
    auto y = t.output(s), dx = t.output(s);
    t.run([&](Backend& be, Side d) {
      be.softmax_forward(d(x), log, d(y));
      be.softmax_backward(d(dy), d(y), log, d(dx));
    });
    auto y2 = t.output(s);
    t.expect_gradient(log ? "log_softmax" : "softmax", x, dx, [&](Backend& be) {
      be.softmax_forward(x.dut, log, y2.dut);
      return dot(dy.dut, y2.dut);
    });
  }
}

REMAT_OP_CASE(grad, cross_entropy) {
  const int64_t n = 5, v = 11;
  auto logits = t.uniform({n, v}, -2.0f, 2.0f);
  auto targets = t.int_values({3, 0, 10, -100, 7}, {n});
  auto loss = t.output({1}), lse = t.output({n}), dlogits = t.output({n, v});
  t.run([&](Backend& be, Side d) {
    be.cross_entropy_forward(d(logits), d(targets), -100, d(loss), d(lse));
    be.cross_entropy_backward(1.0f, d(logits), d(targets), d(lse), -100, d(dlogits));
  });
  auto loss2 = t.output({1}), lse2 = t.output({n});
  t.expect_gradient("cross_entropy", logits, dlogits, [&](Backend& be) {
    be.cross_entropy_forward(logits.dut, targets.dut, -100, loss2.dut, lse2.dut);
    return static_cast<double>(loss2.dut.to_vector()[0]);
  });
}

REMAT_OP_CASE(grad, linear) {
  const int64_t rows = 6, in = 9, out = 7;
  auto x = t.uniform({rows, in}), w = t.uniform({out, in}), b = t.uniform({out}), dy = t.uniform({rows, out});
  auto dx = t.output({rows, in}), dw = t.output_like(t.values(std::vector<float>(out * in, 0.0f), {out, in}));
  auto db = t.output_like(t.values(std::vector<float>(out, 0.0f), {out}));
  t.run([&](Backend& be, Side d) { be.linear_backward(d(dy), d(x), d(w), d(dx), d(dw), d(db)); });
  auto y = t.output({rows, out});
  auto loss = [&](Backend& be) {
    be.linear_forward(x.dut, w.dut, b.dut, y.dut);
    return dot(dy.dut, y.dut);
  };
  t.expect_gradient("linear dx", x, dx, loss);
  t.expect_gradient("linear dw", w, dw, loss);
  t.expect_gradient("linear db", b, db, loss);
}

REMAT_OP_CASE(grad, conv2d) {
  // Stride 2, padding 1, two groups, a bias: every index path of dx and dw.
  const Shape xs{2, 4, 7, 6}, ws{6, 2, 3, 3};
  Conv2dParams p;
  p.stride_h = p.stride_w = 2;
  p.pad_h = p.pad_w = 1;
  p.groups = 2;
  const Shape ys = conv2d_output_shape(xs, ws, p);
  auto x = t.uniform(xs), w = t.uniform(ws, -0.5f, 0.5f), b = t.uniform({6}), dy = t.uniform(ys);
  auto dx = t.output(xs), dw = t.output_like(t.values(std::vector<float>(ws.numel(), 0.0f), ws));
  auto db = t.output_like(t.values(std::vector<float>(6, 0.0f), {6}));
  auto y = t.output(ys);
  t.run([&](Backend& be, Side d) {
    const size_t bytes = be.conv2d_backward_workspace(xs, ws, p);
    Tensor work = bytes ? Tensor::empty(Shape{static_cast<int64_t>((bytes + 3) / 4)}, be.device()) : Tensor();
    be.conv2d_backward(d(dy), d(x), d(w), p, d(dx), d(dw), d(db), work);
  });
  auto loss = [&](Backend& be) {
    const size_t bytes = be.conv2d_forward_workspace(xs, ws, p);
    Tensor work = bytes ? Tensor::empty(Shape{static_cast<int64_t>((bytes + 3) / 4)}, be.device()) : Tensor();
    be.conv2d_forward(x.dut, w.dut, b.dut, p, y.dut, work);
    return dot(dy.dut, y.dut);
  };
  t.expect_gradient("conv2d dx", x, dx, loss);
  t.expect_gradient("conv2d dw", w, dw, loss);
  t.expect_gradient("conv2d db", b, db, loss);
}

REMAT_OP_CASE(grad, pooling) {
  const Shape xs{2, 3, 6, 7};
  Pool2dParams p;
  p.kernel_h = p.kernel_w = 3;
  p.stride_h = p.stride_w = 2;
  p.pad_h = p.pad_w = 1;
  const Shape ys = pool2d_output_shape(xs, p);
  auto x = distinct(t, xs), dy = t.uniform(ys);
  // Max pooling: the spacing of distinct values (2 / 252) exceeds 2 eps, so argmaxes hold.
  auto y = t.output(ys), idx = t.output(ys, DType::u8), dx = t.output(xs);
  t.run([&](Backend& be, Side d) {
    be.maxpool2d_forward(d(x), p, d(y), d(idx));
    be.maxpool2d_backward(d(dy), d(idx), p, d(dx));
  });
  auto y2 = t.output(ys), idx2 = t.output(ys, DType::u8);
  OpCheck::GradOptions fine;
  fine.eps = 1e-3;
  t.expect_gradient(
      "maxpool2d", x, dx,
      [&](Backend& be) {
        be.maxpool2d_forward(x.dut, p, y2.dut, idx2.dut);
        return dot(dy.dut, y2.dut);
      },
      fine);
  auto adx = t.output(xs);
  t.run([&](Backend& be, Side d) { be.avgpool2d_backward(d(dy), p, d(adx)); });
  t.expect_gradient("avgpool2d", x, adx, [&](Backend& be) {
    be.avgpool2d_forward(x.dut, p, y2.dut);
    return dot(dy.dut, y2.dut);
  });
  auto gy = t.output({2, 3}), gdy = t.uniform({2, 3}), gdx = t.output(xs);
  t.run([&](Backend& be, Side d) { be.global_avgpool_backward(d(gdy), d(gdx)); });
  t.expect_gradient("global_avgpool", x, gdx, [&](Backend& be) {
    be.global_avgpool_forward(x.dut, gy.dut);
    return dot(gdy.dut, gy.dut);
  });
}

REMAT_OP_CASE(grad, norms) {
  const Shape s{5, 24};
  auto x = t.uniform(s, -2.0f, 2.0f), gamma = t.uniform({24}, 0.5f, 1.5f), beta = t.uniform({24}), dy = t.uniform(s);
  auto zeros = [&](int64_t c) { return t.output_like(t.values(std::vector<float>(c, 0.0f), {c})); };
  {  // layernorm
    auto y = t.output(s), mean = t.output({5}), rstd = t.output({5}), dx = t.output(s);
    auto dg = zeros(24), db = zeros(24);
    t.run([&](Backend& be, Side d) {
      be.layernorm_forward(d(x), d(gamma), d(beta), 1e-5f, d(y), d(mean), d(rstd));
      ops::layernorm_backward(be, d(dy), d(x), d(gamma), d(mean), d(rstd), d(dx), d(dg), d(db));
    });
    auto loss = [&](Backend& be) {
      be.layernorm_forward(x.dut, gamma.dut, beta.dut, 1e-5f, y.dut, mean.dut, rstd.dut);
      return dot(dy.dut, y.dut);
    };
    t.expect_gradient("layernorm dx", x, dx, loss);
    t.expect_gradient("layernorm dgamma", gamma, dg, loss);
    t.expect_gradient("layernorm dbeta", beta, db, loss);
  }
  {  // rmsnorm
    auto y = t.output(s), rstd = t.output({5}), dx = t.output(s), dg = zeros(24);
    t.run([&](Backend& be, Side d) {
      be.rmsnorm_forward(d(x), d(gamma), 1e-6f, d(y), d(rstd));
      be.rmsnorm_backward(d(dy), d(x), d(gamma), d(rstd), d(dx), d(dg));
    });
    auto loss = [&](Backend& be) {
      be.rmsnorm_forward(x.dut, gamma.dut, 1e-6f, y.dut, rstd.dut);
      return dot(dy.dut, y.dut);
    };
    t.expect_gradient("rmsnorm dx", x, dx, loss);
    t.expect_gradient("rmsnorm dgamma", gamma, dg, loss);
  }
  {  // batchnorm, training mode (batch statistics; running statistics not updated)
    const Shape bs{4, 3, 3, 5};
    auto bx = t.uniform(bs, -2.0f, 2.0f), bdy = t.uniform(bs), bg = t.uniform({3}, 0.5f, 1.5f), bb = t.uniform({3});
    auto y = t.output(bs), m = t.output({3}), is = t.output({3}), dx = t.output(bs), dg = zeros(3), db = zeros(3);
    t.run([&](Backend& be, Side d) {
      be.batchnorm2d_forward_train(d(bx), d(bg), d(bb), Tensor(), Tensor(), BatchNormParams{}, false, d(y), d(m),
                                   d(is));
      be.batchnorm2d_backward(d(bdy), d(bx), d(bg), d(m), d(is), d(dx), d(dg), d(db));
    });
    auto loss = [&](Backend& be) {
      be.batchnorm2d_forward_train(bx.dut, bg.dut, bb.dut, Tensor(), Tensor(), BatchNormParams{}, false, y.dut, m.dut,
                                   is.dut);
      return dot(bdy.dut, y.dut);
    };
    t.expect_gradient("batchnorm2d dx", bx, dx, loss);
    t.expect_gradient("batchnorm2d dgamma", bg, dg, loss);
    t.expect_gradient("batchnorm2d dbeta", bb, db, loss);
  }
}

REMAT_OP_CASE(grad, attention_and_embedding) {
  const int64_t b = 2, tt = 5, c = 12;
  for (float drop : {0.0f, 0.25f}) {  // with dropout the mask is the same for every forward (one RngState)
    AttentionParams p;
    p.n_head = 3;
    p.dropout = drop;
    const RngState rng{5, 40};
    auto qkv = t.uniform({b, tt, 3 * c}), dout = t.uniform({b, tt, c});
    auto out = t.output({b, tt, c}), probs = t.output({b, 3, tt, tt}), dqkv = t.output({b, tt, 3 * c});
    t.run([&](Backend& be, Side d) {
      auto ws = [&](size_t bytes) {
        return bytes ? Tensor::empty(Shape{static_cast<int64_t>((bytes + 3) / 4)}, be.device()) : Tensor();
      };
      be.attention_forward(d(qkv), p, rng, d(out), d(probs), ws(be.attention_forward_workspace(qkv.ref.shape(), p)));
      be.attention_backward(d(dout), d(qkv), d(probs), p, rng, d(dqkv),
                            ws(be.attention_backward_workspace(qkv.ref.shape(), p)));
    });
    t.expect_gradient(drop > 0 ? "attention dqkv (dropout)" : "attention dqkv", qkv, dqkv, [&](Backend& be) {
      const size_t bytes = be.attention_forward_workspace(qkv.dut.shape(), p);
      Tensor work = bytes ? Tensor::empty(Shape{static_cast<int64_t>((bytes + 3) / 4)}, be.device()) : Tensor();
      be.attention_forward(qkv.dut, p, rng, out.dut, probs.dut, work);
      return dot(dout.dut, out.dut);
    });
  }
  // Embedding: y is linear in the tables.
  auto ids = t.int_values({3, 0, 3, 1, 2, 3}, {2, 3});
  auto table = t.uniform({4, 5}), pos = t.uniform({3, 5}), dy = t.uniform({2, 3, 5});
  auto zeros = [&](const Shape& s) { return t.output_like(t.values(std::vector<float>(s.numel(), 0.0f), s)); };
  auto dtable = zeros({4, 5}), dpos = zeros({3, 5});
  t.run([&](Backend& be, Side d) { ops::embedding_backward(be, d(dy), d(ids), d(dtable), d(dpos)); });
  auto y = t.output({2, 3, 5});
  auto loss = [&](Backend& be) {
    be.embedding_forward(ids.dut, table.dut, pos.dut, y.dut);
    return dot(dy.dut, y.dut);
  };
  t.expect_gradient("embedding dtable", table, dtable, loss);
  t.expect_gradient("embedding dpos_table", pos, dpos, loss);
}

}  // namespace remat::test
