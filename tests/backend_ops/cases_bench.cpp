// The cases of `remat bench kernels` (remat/bench_cases.h: the one list), each an op case
// here: checked on the device against the cpu at a small size, and timed by perf mode
// (REMAT_OP_PERF) like every case. The bench times the same cases at 64 Mi elements (the
// GEMMs at 8192 tokens of GPT-2 124M's width). Each memory-bound case states its own
// tolerance; the GEMMs' are below.
#include <optional>
#include <string>
#include <vector>

#include "backend_ops/harness.h"
#include "remat/bench_cases.h"

namespace remat::test {

namespace {

constexpr int64_t kElements = 4096 + 3;  // a tail past every vector width; a row of every row op
// The GEMMs at 16 tokens of a model 64 wide with 1000 words (GPT-2 124M's would take
// 0.7 GB of operands for the LM head).
constexpr int64_t kGemmTokens = 16, kGemmWidth = 64, kGemmVocab = 1000;

// A test's name holds letters, digits and underscores: "dropout_fwd_p0.1" is dropout_fwd_p0_1.
std::string test_name(std::string name) {
  for (char& ch : name)
    if (ch == '.') ch = '_';
  return name;
}

// The case's tensors on both sides (written ones guarded; outputs start as NaN, tensors
// updated in place as the bench makes them), one run on each, the written ones compared.
void check_memory_bound(OpCheck& t, const BenchCase& c) {
  std::vector<Pair> pairs;
  for (const BenchTensor& bt : c.tensors) {
    if (bt.init == BenchTensor::Init::ids) {
      pairs.push_back(t.int_values(bench_ids(bt), bt.shape));
    } else if (bt.written && bt.init == BenchTensor::Init::unread) {
      pairs.push_back(t.output(bt.shape));
    } else {
      const Pair p = t.values(bench_values(bt), bt.shape);  // unread ones: zeros
      pairs.push_back(bt.written ? t.output_like(p) : p);
    }
  }
  t.run([&](Backend& be, Side s) {
    std::vector<Tensor> ts;
    for (size_t i = 0; i < pairs.size(); ++i) {
      // Not through s() where the op never reads or writes it: perf mode counts what s() gives.
      const bool untouched = c.tensors[i].init == BenchTensor::Init::unread && !c.tensors[i].written;
      ts.push_back(untouched ? (s.ref ? pairs[i].ref : pairs[i].dut) : s(pairs[i]));
    }
    c.run(be, ts);
  });
  for (size_t i = 0; i < pairs.size(); ++i)
    if (c.tensors[i].written) t.expect_close(pairs[i], c.atol, c.rtol, c.name + ": tensor " + std::to_string(i));
}

// fp32: sums of 16 products of values in [-1, 1] in another order. TF32 (on a GPU; the
// emulator computes fp32): products of 10-bit mantissas. bf16: the fp32 sums rounded once
// to bf16, where another summation order may round to the neighbouring value.
void check_gemm(OpCheck& t, const GemmBenchCase& g) {
  std::optional<ActivationDTypeScope> bf16_scope;  // the ops take bf16 inside it
  if (g.bf16) bf16_scope.emplace(DType::bf16);
  auto operand = [&](const Shape& s, uint32_t seed) {
    BenchTensor bt;
    bt.shape = s;
    bt.seed = seed;
    return g.bf16 ? t.values_bf16(bench_values(bt), s) : t.values(bench_values(bt), s);
  };
  const Pair a = operand({g.m, g.k}, 1), b = operand(g.trans_b ? Shape{g.n, g.k} : Shape{g.k, g.n}, 2);
  const Pair c = t.output({g.m, g.n}, g.bf16 ? DType::bf16 : DType::f32);
  GemmParams p;
  p.trans_b = g.trans_b;
  t.run([&](Backend& be, Side s) {
    const bool tf32 = be.tuning().tf32();
    be.tuning().set_tf32(g.tf32);
    be.gemm(s(a), s(b), s(c), p);
    be.tuning().set_tf32(tf32);
  });
  if (g.bf16)
    t.expect_close(c, 1e-6, kBf16Rel, g.name);
  else if (g.tf32)
    t.expect_close(c, 1e-2, 1e-2, g.name);
  else
    t.expect_close(c, 1e-5, 1e-5, g.name);
}

const bool kRegistered = [] {
  for (const BenchCase& c : memory_bound_bench_cases(kElements))
    register_op_case("bench", test_name(c.name), [c](OpCheck& t) { check_memory_bound(t, c); });
  for (const GemmBenchCase& g : gemm_bench_cases(kGemmTokens, kGemmWidth, kGemmVocab))
    register_op_case("bench", g.name, [g](OpCheck& t) { check_gemm(t, g); });
  return true;
}();

}  // namespace

}  // namespace remat::test
