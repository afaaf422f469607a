// The aliasing rules of remat/backend_ops.def ("dx may alias dy", "y may alias x"), on
// every backend this program has: each such op run with the output aliased to its input
// gives bitwise what it gives into a separate buffer. The layers rely on these rules
// (reuse_dout) to save an activation-sized buffer per pointwise or norm layer in
// backward, so a backend that broke one would give wrong gradients.
//
// Shapes reach each backend's vector paths, several blocks, and rows past a warp.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "remat/backend.h"
#include "remat/device.h"
#include "remat/ops.h"
#include "support/golden.h"

namespace remat::test {
namespace {

#if defined(REMAT_TEST_EMU)
const bool kRegistered = (register_cuda_emu_backend(), true);
#endif

std::vector<Device> backends_under_test() {
  std::vector<Device> d{Device::cpu()};
  if (backend_registered(DeviceType::cuda_emu)) d.push_back(Device::cuda_emu());
  if (cuda_status().available) d.push_back(Device::cuda(0));
  return d;
}

Tensor rand_on(const Shape& s, uint32_t seed, Device d, float lo = -1.0f, float hi = 1.0f) {
  return random_tensor(s, seed, lo, hi).to(d);
}

// Runs op(dy, dx) twice on device d: into a fresh dx, and with dx the very tensor dy (a
// copy of the same values). Both results must be equal bitwise.
void expect_alias_safe(Device d, const std::string& what, const Tensor& dy,
                       const std::function<void(const Tensor& dy, const Tensor& dx)>& op) {
  Tensor separate = Tensor::empty(dy.shape(), d);
  op(dy, separate);
  Tensor aliased = dy.clone();
  op(aliased, aliased);
  EXPECT_TRUE(bitwise_equal(aliased.to(Device::cpu()), separate.to(Device::cpu())))
      << what << " on " << d.str() << ": the result differs when the output aliases the input";
}

class Aliasing : public ::testing::TestWithParam<Device> {
 protected:
  Backend& be() { return backend_for(GetParam()); }
  Device dev() { return GetParam(); }
};

TEST_P(Aliasing, ScaleIntoItsInput) {
  for (const Shape& s : {Shape{1}, Shape{1001}, Shape{4, 4096}}) {
    Tensor x = rand_on(s, 1, dev());
    expect_alias_safe(dev(), "scale " + s.str(), x,
                      [&](const Tensor& in, const Tensor& out) { be().scale(in, -0.37f, out); });
  }
}

TEST_P(Aliasing, PointwiseBackwardIntoDy) {
  for (const Shape& s : {Shape{3, 1001}, Shape{8, 4096}}) {
    Tensor x = rand_on(s, 2, dev(), -3.0f, 3.0f);
    Tensor dy = rand_on(s, 3, dev());
    expect_alias_safe(dev(), "relu_backward " + s.str(), dy,
                      [&](const Tensor& g, const Tensor& dx) { be().relu_backward(g, x, dx); });
    for (GeluApprox a : {GeluApprox::none, GeluApprox::tanh})
      expect_alias_safe(dev(), "gelu_backward " + s.str(), dy,
                        [&](const Tensor& g, const Tensor& dx) { be().gelu_backward(g, x, a, dx); });
    expect_alias_safe(dev(), "silu_backward " + s.str(), dy,
                      [&](const Tensor& g, const Tensor& dx) { be().silu_backward(g, x, dx); });
    for (float p : {0.1f, 0.5f})
      expect_alias_safe(dev(), "dropout_backward " + s.str(), dy, [&](const Tensor& g, const Tensor& dx) {
        be().dropout_backward(g, p, RngState{1234, 99}, dx);
      });
  }
}

TEST_P(Aliasing, BatchNormBackwardIntoDy) {
  for (const Shape& s : {Shape{2, 3, 5, 7}, Shape{4, 8, 16, 16}, Shape{16, 2, 4, 4}}) {
    const Shape c{s[1]};
    Tensor x = rand_on(s, 4, dev(), 1.0f, 3.0f), dy = rand_on(s, 5, dev());
    Tensor gamma = rand_on(c, 6, dev(), 0.5f, 1.5f), beta = rand_on(c, 7, dev());
    Tensor y = Tensor::empty(s, dev()), mean = Tensor::empty(c, dev()), invstd = Tensor::empty(c, dev());
    be().batchnorm2d_forward_train(x, gamma, beta, Tensor(), Tensor(), BatchNormParams{}, false, y, mean, invstd);
    // The parameter gradients accumulate (+=): fresh zeros for each run, compared too.
    Tensor dg[2], db[2];
    int run = 0;
    expect_alias_safe(dev(), "batchnorm2d_backward " + s.str(), dy, [&](const Tensor& g, const Tensor& dx) {
      dg[run] = Tensor::zeros(c, dev());
      db[run] = Tensor::zeros(c, dev());
      be().batchnorm2d_backward(g, x, gamma, mean, invstd, dx, dg[run], db[run]);
      ++run;
    });
    EXPECT_TRUE(bitwise_equal(dg[1].to(Device::cpu()), dg[0].to(Device::cpu()))) << "dgamma " << s.str();
    EXPECT_TRUE(bitwise_equal(db[1].to(Device::cpu()), db[0].to(Device::cpu()))) << "dbeta " << s.str();
  }
}

TEST_P(Aliasing, LayerNormBackwardIntoDy) {
  for (const Shape& s : {Shape{3, 7}, Shape{5, 768}, Shape{2, 1025}, Shape{2, 3, 36}}) {
    const Shape c{s[-1]}, rows{s.numel() / s[-1]};
    Tensor x = rand_on(s, 8, dev(), -2.0f, 2.0f), dy = rand_on(s, 9, dev());
    Tensor gamma = rand_on(c, 10, dev(), 0.5f, 1.5f), beta = rand_on(c, 11, dev());
    Tensor y = Tensor::empty(s, dev()), mean = Tensor::empty(rows, dev()), rstd = Tensor::empty(rows, dev());
    be().layernorm_forward(x, gamma, beta, LayerNormParams{1e-5f}, y, mean, rstd);
    Tensor dg[2], db[2];
    int run = 0;
    expect_alias_safe(dev(), "layernorm_backward " + s.str(), dy, [&](const Tensor& g, const Tensor& dx) {
      dg[run] = Tensor::zeros(c, dev());
      db[run] = Tensor::zeros(c, dev());
      ops::layernorm_backward(be(), g, x, gamma, mean, rstd, dx, dg[run], db[run]);
      ++run;
    });
    EXPECT_TRUE(bitwise_equal(dg[1].to(Device::cpu()), dg[0].to(Device::cpu()))) << "dgamma " << s.str();
    EXPECT_TRUE(bitwise_equal(db[1].to(Device::cpu()), db[0].to(Device::cpu()))) << "dbeta " << s.str();
  }
}

TEST_P(Aliasing, RmsNormBackwardIntoDy) {
  for (const Shape& s : {Shape{3, 7}, Shape{5, 768}, Shape{2, 1025}, Shape{2, 3, 36}}) {
    const Shape c{s[-1]}, rows{s.numel() / s[-1]};
    Tensor x = rand_on(s, 12, dev(), -2.0f, 2.0f), dy = rand_on(s, 13, dev());
    Tensor gamma = rand_on(c, 14, dev(), 0.5f, 1.5f);
    Tensor y = Tensor::empty(s, dev()), rstd = Tensor::empty(rows, dev());
    be().rmsnorm_forward(x, gamma, RmsNormParams{1e-6f}, y, rstd);
    Tensor dg[2];
    int run = 0;
    expect_alias_safe(dev(), "rmsnorm_backward " + s.str(), dy, [&](const Tensor& g, const Tensor& dx) {
      dg[run] = Tensor::zeros(c, dev());
      be().rmsnorm_backward(g, x, gamma, rstd, dx, dg[run]);
      ++run;
    });
    EXPECT_TRUE(bitwise_equal(dg[1].to(Device::cpu()), dg[0].to(Device::cpu()))) << "dgamma " << s.str();
  }
}

// Rotary embeddings turn q and k in place (y may alias x) and their gradients back over dy.
TEST_P(Aliasing, RopeInPlace) {
  for (const Shape& s : {Shape{2, 5, 3 * 8}, Shape{1, 33, 6 * 16}}) {
    const RopeParams p{static_cast<int>(s[2] / (s[2] == 24 ? 8 : 16)), 2, 10000.0, {}};
    Tensor x = rand_on(s, 15, dev(), -2.0f, 2.0f);
    expect_alias_safe(dev(), "rope_forward " + s.str(), x,
                      [&](const Tensor& in, const Tensor& out) { be().rope_forward(in, p, out); });
    expect_alias_safe(dev(), "rope_backward " + s.str(), x,
                      [&](const Tensor& g, const Tensor& dx) { be().rope_backward(g, p, dx); });
  }
}

// Columns [c0, c0 + n) of every row of a host [B, T, W] tensor, as a [B, T, n] tensor.
Tensor columns(const Tensor& x, int64_t c0, int64_t n) {
  const std::vector<float> v = x.to_vector();
  std::vector<float> out;
  const int64_t w = x.size(2);
  for (int64_t r = 0; r < x.size(0) * x.size(1); ++r)
    out.insert(out.end(), v.begin() + r * w + c0, v.begin() + r * w + c0 + n);
  return Tensor::from_vector(out, Shape{x.size(0), x.size(1), n});
}

// Packed self-attention writes dq, dk and dv into one tensor (dxkv is dxq): the same bits
// as the same problem given as two tensors, q and [k | v], with two gradients.
TEST_P(Aliasing, FlashAttentionBackwardIntoOneGradient) {
  for (const int kv_heads : {3, 1}) {
    const int h = 3;
    const int64_t b = 2, t = 70, d = 16, q = h * d, kv = kv_heads * d;
    const Tensor qkv_host = random_tensor(Shape{b, t, q + 2 * kv}, 21), dout_host = random_tensor(Shape{b, t, q}, 22);
    const Tensor qkv = qkv_host.to(dev()), dout = dout_host.to(dev());
    const FlashAttentionParams packed = FlashAttentionParams::packed(h, kv_heads, d, true, 0.25f);
    const RngState rng{4, 40};
    const auto r = ops::flash_attention(be(), qkv, qkv, Tensor(), packed, rng);
    const auto g = ops::flash_attention_backward(be(), dout, qkv, qkv, Tensor(), r.out, r.lse, packed, rng);
    ASSERT_TRUE(g.dxkv.same_view(g.dxq));
    FlashAttentionParams split = FlashAttentionParams::cross(h, kv_heads, d, 0.25f);
    split.causal = true;
    const Tensor xq = columns(qkv_host, 0, q).to(dev()), xkv = columns(qkv_host, q, 2 * kv).to(dev());
    const auto rs = ops::flash_attention(be(), xq, xkv, Tensor(), split, rng);
    const auto gs = ops::flash_attention_backward(be(), dout, xq, xkv, Tensor(), rs.out, rs.lse, split, rng);
    const Tensor one = g.dxq.to(Device::cpu());
    EXPECT_TRUE(bitwise_equal(rs.out.to(Device::cpu()), r.out.to(Device::cpu()))) << "out, kv heads " << kv_heads;
    EXPECT_TRUE(bitwise_equal(columns(one, 0, q), gs.dxq.to(Device::cpu()))) << "dq, kv heads " << kv_heads;
    EXPECT_TRUE(bitwise_equal(columns(one, q, 2 * kv), gs.dxkv.to(Device::cpu()))) << "dk, dv, kv heads " << kv_heads;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Aliasing, ::testing::ValuesIn(backends_under_test()),
                         [](const ::testing::TestParamInfo<Device>& i) {
                           std::string n = i.param.str();
                           for (char& ch : n)
                             if (ch == '-' || ch == ':') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace remat::test
