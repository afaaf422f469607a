// The cases of `remat bench kernels` (remat/bench_cases.h).
#include "remat/bench_cases.h"

#include <algorithm>

#include "remat/bf16.h"
#include "remat/error.h"

namespace remat {

namespace {

BenchTensor input(const Shape& s, uint32_t seed, float lo, float hi) {
  BenchTensor t;
  t.shape = s;
  t.seed = seed;
  t.lo = lo;
  t.hi = hi;
  return t;
}
// Read and written (updated in place).
BenchTensor updated(const Shape& s, uint32_t seed, float lo, float hi) {
  BenchTensor t = input(s, seed, lo, hi);
  t.written = true;
  return t;
}
BenchTensor output(const Shape& s) {
  BenchTensor t;
  t.shape = s;
  t.init = BenchTensor::Init::unread;
  t.written = true;
  return t;
}
BenchTensor unread(const Shape& s) {
  BenchTensor t;
  t.shape = s;
  t.init = BenchTensor::Init::unread;
  return t;
}

std::string dims(int64_t r, int64_t c) { return "[" + std::to_string(r) + ", " + std::to_string(c) + "]"; }

// Flat ops over n elements that read `reads` and write `writes` arrays of them.
void add_flat_cases(std::vector<BenchCase>& cs, int64_t n) {
  const Shape s{n};
  auto flat = [&](const char* name, int reads, int writes, std::vector<BenchTensor> ts, BenchRun run, double atol,
                  double rtol) {
    cs.push_back({name, "[" + std::to_string(n) + "]", n, 4.0 * (reads + writes) * static_cast<double>(n),
                  "4 B x (" + std::to_string(reads) + " reads + " + std::to_string(writes) + " writes) x N",
                  std::move(ts), std::move(run), atol, rtol});
  };
  // add, scale, ReLU and dropout are one rounding of the same fp32 operation on every
  // backend (dropout's mask: the same Philox bits): bitwise. GELU's tanh differs by an ulp.
  flat(
      "add", 2, 1, {input(s, 1, -1, 1), input(s, 2, -1, 1), output(s)},
      [](Backend& be, const std::vector<Tensor>& t) { be.add(t[0], t[1], t[2]); }, 0, 0);
  // dst += src: reads dst and src, writes dst
  flat(
      "accumulate", 2, 1, {updated(s, 1, -1, 1), input(s, 2, -1e-3f, 1e-3f)},
      [](Backend& be, const std::vector<Tensor>& t) { be.accumulate(t[0], t[1]); }, 0, 0);
  flat(
      "scale", 1, 1, {input(s, 1, -1, 1), output(s)},
      [](Backend& be, const std::vector<Tensor>& t) { be.scale(t[0], 0.5f, t[1]); }, 0, 0);
  flat(
      "relu_fwd", 1, 1, {input(s, 1, -1, 1), output(s)},
      [](Backend& be, const std::vector<Tensor>& t) { be.relu_forward(t[0], t[1]); }, 0, 0);
  flat(
      "gelu_fwd_tanh", 1, 1, {input(s, 1, -3, 3), output(s)},
      [](Backend& be, const std::vector<Tensor>& t) { be.gelu_forward(t[0], GeluApprox::tanh, t[1]); }, 1e-6, 1e-5);
  flat(
      "dropout_fwd_p0.1", 1, 1, {input(s, 1, -1, 1), output(s)},
      [](Backend& be, const std::vector<Tensor>& t) {
        be.dropout_forward(t[0], 0.1f, RngState{1, 0}, t[1]);
      },
      0, 0);
}

// Ops over rows: layer norm and softmax, cross-entropy over GPT-2's vocabulary, the bias
// gradient of a linear layer.
void add_row_cases(std::vector<BenchCase>& cs, int64_t n) {
  {
    // rows of GPT-2 small's width: x [R, C]; reads x, gamma, beta; writes y, mean, rstd.
    // y to a few ulp (a double mean and variance, rounded).
    const int64_t c = 768, r = std::max<int64_t>(n / c, 1);
    cs.push_back({"layernorm_fwd",
                  dims(r, c),
                  r * c,
                  4.0 * (2.0 * r * c + 2.0 * c + 2.0 * r),
                  "4 B x (2 R C + 2 C + 2 R): x, y; gamma, beta; mean, rstd",
                  {input({r, c}, 1, -1, 1), input({c}, 2, 0.5f, 1.5f), input({c}, 3, -0.1f, 0.1f), output({r, c}),
                   output({r}), output({r})},
                  [](Backend& be, const std::vector<Tensor>& t) {
                    be.layernorm_forward(t[0], t[1], t[2], LayerNormParams{1e-5f}, t[3], t[4], t[5]);
                  },
                  1e-6,
                  1e-5});
  }
  {
    // rows of attention scores at context 1024: reads x, writes y. Row sums in another order.
    const int64_t c = 1024, r = std::max<int64_t>(n / c, 1);
    cs.push_back({"softmax_fwd",
                  dims(r, c),
                  r * c,
                  4.0 * 2.0 * r * c,
                  "4 B x 2 R C: x, y",
                  {input({r, c}, 1, -4, 4), output({r, c})},
                  [](Backend& be, const std::vector<Tensor>& t) { be.softmax_forward(t[0], false, t[1]); },
                  1e-8,
                  1e-5});
  }
  {
    // GPT-2's vocabulary: logits [R, V] are read once (a logsumexp per row); the row's
    // target in, its lse and the mean loss out. Memory-bound like softmax. lse and the loss
    // to a few ulp of their magnitude (about 11).
    const int64_t v = 50257, r = std::max<int64_t>(n / v, 1);
    BenchTensor targets;
    targets.shape = Shape{r};
    targets.init = BenchTensor::Init::ids;
    targets.id_range = v;
    cs.push_back({"cross_entropy_fwd",
                  dims(r, v),
                  r * v,
                  4.0 * (static_cast<double>(r) * v + 2.0 * r + 1.0),
                  "4 B x (R V + 2 R + 1): logits; targets, lse; loss",
                  {input({r, v}, 1, -4, 4), targets, output({1}), output({r})},
                  [](Backend& be, const std::vector<Tensor>& t) {
                    be.cross_entropy_forward(t[0], t[1], -100, 0.0f, t[2], t[3], Tensor());
                  },
                  1e-5,
                  1e-6});
  }
  {
    // the bias gradient of a GPT-2-wide linear layer: db [C] += column sums of dy [R, C]
    // (linear_backward with only db); reads dy, reads and writes db. Column sums in
    // another order.
    const int64_t c = 768, r = std::max<int64_t>(n / c, 1);
    BenchTensor db;
    db.shape = Shape{c};
    db.init = BenchTensor::Init::zeros;
    db.written = true;
    cs.push_back({"bias_grad",
                  dims(r, c),
                  r * c,
                  4.0 * (static_cast<double>(r) * c + 2.0 * c),
                  "4 B x (R C + 2 C): dy; db read and written",
                  {input({r, c}, 1, -1, 1), unread({r, c}), unread({c, c}), db},
                  [](Backend& be, const std::vector<Tensor>& t) {
                    be.linear_backward(t[0], t[1], t[2], Tensor(), Tensor(), t[3]);
                  },
                  1e-4,
                  1e-5});
  }
}

}  // namespace

std::vector<BenchCase> memory_bound_bench_cases(int64_t n) {
  REMAT_CHECK(n > 0, "bench cases: ", n, " elements");
  std::vector<BenchCase> cs;
  add_flat_cases(cs, n);
  add_row_cases(cs, n);
  // reads param, grad, m, v; writes param, m, v. Step 1 every run: every step does the
  // same work.
  const Shape s{n};
  cs.push_back(
      {"adamw_step",
       "[" + std::to_string(n) + "]",
       n,
       4.0 * 7 * static_cast<double>(n),
       "4 B x (4 reads + 3 writes) x N",
       {updated(s, 1, -1, 1), input(s, 2, -1e-2f, 1e-2f), updated(s, 3, -1e-3f, 1e-3f), updated(s, 4, 0, 1e-4f)},
       [](Backend& be, const std::vector<Tensor>& t) { be.adamw_step(t[0], t[1], t[2], t[3], AdamWParams{}, 1); },
       1e-6,
       1e-6});
  return cs;
}

std::vector<GemmBenchCase> gemm_bench_cases(int64_t size, int64_t width, int64_t vocab) {
  const int64_t c = width;
  return {
      {"gemm_fp32", size, size, size, false, false, false},    {"gemm_tf32", size, size, size, false, true, false},
      {"gemm_bf16", size, size, size, true, false, false},     {"gpt2_qkv_bf16", size, 3 * c, c, true, false, true},
      {"gpt2_fc_bf16", size, 4 * c, c, true, false, true},     {"gpt2_proj_bf16", size, c, 4 * c, true, false, true},
      {"gpt2_lm_head_bf16", size, vocab, c, true, false, true}};
}

std::vector<AttentionBenchCase> attention_bench_cases(int64_t tokens, const std::vector<int64_t>& seqs, int64_t width) {
  std::vector<AttentionBenchCase> cs;
  auto add = [&](int64_t t, int64_t d, bool bf16) {
    if (tokens < t || width % d != 0) return;
    cs.push_back(
        {std::string("flash_") + (bf16 ? "bf16" : "fp32") + "_t" + std::to_string(t) + "_d" + std::to_string(d),
         tokens / t, t, width / d, d, bf16});
  };
  for (int64_t t : seqs)
    for (int64_t d : {int64_t{64}, int64_t{128}}) add(t, d, true);
  if (!seqs.empty()) add(seqs.front(), 64, false);
  return cs;
}

std::vector<float> bench_values(const BenchTensor& t) {
  std::vector<float> v(static_cast<size_t>(t.shape.numel()), 0.0f);
  if (t.init != BenchTensor::Init::uniform) return v;
  // A fixed LCG: the same data every run.
  uint32_t x = t.seed * 2654435761u + 1;
  for (float& p : v) {
    x = x * 1664525u + 1013904223u;
    p = t.lo + (t.hi - t.lo) * static_cast<float>(x >> 8) / 16777216.0f;
  }
  return v;
}

std::vector<int32_t> bench_ids(const BenchTensor& t) {
  REMAT_CHECK(t.init == BenchTensor::Init::ids && t.id_range > 0, "bench_ids: not an ids tensor");
  std::vector<int32_t> ids(static_cast<size_t>(t.shape.numel()));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919) % static_cast<size_t>(t.id_range));
  return ids;
}

Tensor make_bench_tensor(const BenchTensor& t, Device d) {
  switch (t.init) {
    case BenchTensor::Init::unread: return Tensor::empty(t.shape, d);
    case BenchTensor::Init::zeros: return Tensor::zeros(t.shape, d);
    case BenchTensor::Init::ids: return Tensor::from_ints(bench_ids(t), t.shape, d);
    case BenchTensor::Init::uniform: break;
  }
  const Tensor host = Tensor::from_vector(bench_values(t), t.shape);
  return d.is_cpu() ? host : host.to(d);
}

Tensor gemm_bench_operand(const Shape& s, uint32_t seed, bool bf16, Device d) {
  BenchTensor t;
  t.shape = s;
  t.seed = seed;
  const Tensor f = make_bench_tensor(t, Device::cpu());
  if (!bf16) return d.is_cpu() ? f : f.to(d);
  Tensor h = Tensor::empty(s, Device::cpu(), DType::bf16);
  const float* src = f.f32();
  uint16_t* dst = h.bf16();
  for (int64_t i = 0; i < h.numel(); ++i) dst[i] = bf16_from_float(src[i]);
  return d.is_cpu() ? h : h.to(d);
}

}  // namespace remat
