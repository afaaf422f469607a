// The op-by-op test of a backend against the CPU backend (ggml's test-backend-ops
// pattern): a registry of op cases, each run on the cpu reference and on the device under
// test with the same inputs, outputs compared with a stated tolerance.
//
// - Inputs are created on the host and copied to both devices (Pair: ref on cpu, dut on
//   the device under test).
// - Outputs live between guard zones (canaries) and are poisoned with NaN before the op,
//   so an element the op forgets to write, or one it writes out of bounds, fails.
// - NaN or inf where the reference is finite (or the other way round) fails; NaN == NaN
//   and equal infinities match.
// - Every backend implements every op (the op list is one table, remat/backend_ops.def):
//   an exception fails the case; nothing is skipped but on a machine without the device.
//
// - Perf mode (ggml's `test-backend-ops perf`): with REMAT_OP_PERF=<iterations> in the
//   environment, every run() times the device under test instead (one warm-up, then the
//   iterations, by BackendTuning::time_ms: CUDA events on a GPU) and nothing is compared; the
//   test prints each case's device time per run and the bytes of the tensors the runs
//   touched (an op's minimum traffic for memory-bound ops), e.g.
//     REMAT_OP_PERF=20 build/default/tests/test_backend_ops_gpu --gtest_filter='*layernorm*'
//
// - Gradient cases (ggml's grad mode, `grad*` in each cases_<family>.cpp): an op's backward
//   on the device under test against central differences of L = sum(dy * y) on that device
//   (expect_gradient), so the device's backward is checked against its own forward, not only
//   against the cpu. Independent of the cpu backend: a device whose forward and backward
//   agreed with the cpu's wrong formulas would still fail. Tolerances: GradOptions' defaults
//   (eps 1e-2, rtol 2e-2, atol 2e-3: central differences of an fp32 forward on O(1) values)
//   unless a case says why it differs. Inputs stay away from kinks (ReLU's 0, max-pool ties)
//   by construction.
// - bf16 cases (`bf16*` in each cases_<family>.cpp; see "bf16 cases" below).
//
// Write a case with REMAT_OP_CASE(family, name) { ... } in cases_<family>.cpp, the family of
// the op's validator (src/backends/validate/<family>.cpp):
//
//   REMAT_OP_CASE(elementwise, relu_forward_odd) {
//     auto x = t.uniform({3, 1001});
//     auto y = t.output({3, 1001});
//     t.run([&](Backend& be, Side s) { be.relu_forward(s(x), s(y)); });
//     t.expect_close(y, 0, 0, "y");
//   }
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "remat/backend.h"
#include "remat/backend_tuning.h"  // perf mode's timer, the knobs some cases turn
#include "remat/tensor.h"

namespace remat::test {

// The same tensor on the reference (cpu) and on the device under test.
struct Pair {
  Tensor ref;
  Tensor dut;
};

// Picks a Pair's tensor for the backend being run.
struct Side {
  bool ref = true;
  std::vector<const Tensor*>* touched = nullptr;  // perf mode: collects what the run reads and writes
  const Tensor& operator()(const Pair& p) const {
    const Tensor& t = ref ? p.ref : p.dut;
    if (touched) touched->push_back(&t);
    return t;
  }
};

// What perf mode measured over one case's runs.
struct PerfTotals {
  int runs = 0;        // run() calls
  double ms = 0.0;     // device time per iteration, summed over the runs
  double bytes = 0.0;  // bytes of the distinct tensors each run touched, summed over the runs
};
// Iterations per run in perf mode (REMAT_OP_PERF), 0 in the normal (checking) mode.
int perf_iterations();

class OpCheck {
 public:
  OpCheck(Backend& ref, Backend& dut, uint64_t seed);
  ~OpCheck();

  Device device() const { return dut_.device(); }

  // Inputs: uniform in [lo, hi), or given values.
  Pair uniform(const Shape& s, float lo = -1.0f, float hi = 1.0f);
  Pair values(const std::vector<float>& v, const Shape& s);
  // i32 inputs uniform in [lo, hi] (inclusive).
  // bf16 inputs (training.precision bf16): uniform values, or given ones, rounded to bf16.
  // The case must run inside an ActivationDTypeScope(DType::bf16) for the validators.
  Pair uniform_bf16(const Shape& s, float lo = -1.0f, float hi = 1.0f);
  Pair values_bf16(const std::vector<float>& v, const Shape& s);
  // The same values as f32 (each side of a bf16 Pair widened exactly), for references
  // computed in fp32.
  Pair as_f32(const Pair& p);
  Pair ints(const Shape& s, int lo, int hi);
  Pair int_values(const std::vector<int32_t>& v, const Shape& s);
  Pair byte_values(const std::vector<uint8_t>& v, const Shape& s);  // u8
  // An output: guarded on both sides, every element NaN (f32, bf16), 0x7f7f7f7f (i32) or
  // 0xff (u8).
  Pair output(const Shape& s, DType dtype = DType::f32);
  // An output that starts with given contents (for ops that accumulate, or update in
  // place): guarded, a copy of `init` on both sides.
  Pair output_like(const Pair& init);

  // Runs f(backend, side) on the reference, then on the device under test.
  void run(const std::function<void(Backend&, Side)>& f);

  // Element-wise |dut - ref| <= atol + rtol * |ref|; checks the output's guards too. bf16
  // outputs compare their exact float values (0, 0: bitwise, NaN by class).
  void expect_close(const Pair& p, double atol, double rtol, const std::string& what);
  // Bitwise equality.
  void expect_equal(const Pair& p, const std::string& what) { expect_close(p, 0.0, 0.0, what); }

  // dx.dut, a gradient the device computed, against central differences of a loss the
  // device computes: loss(dut) must recompute L = sum(dy * y) from the current contents
  // of x.dut. Up to 48 elements of x, spread over it, are perturbed by +-eps (in double).
  struct GradOptions {
    double eps = 1e-2;
    double rtol = 2e-2;
    double atol = 2e-3;
  };
  void expect_gradient(const std::string& what, const Pair& x, const Pair& dx,
                       const std::function<double(Backend&)>& loss, const GradOptions& opt);
  void expect_gradient(const std::string& what, const Pair& x, const Pair& dx,
                       const std::function<double(Backend&)>& loss) {
    expect_gradient(what, x, dx, loss, GradOptions{});
  }

  std::mt19937_64& rng() { return rng_; }
  const PerfTotals& perf() const { return perf_; }

 private:
  Pair guarded(const Shape& s, DType dtype);
  void check_guards();

  Backend& ref_;
  Backend& dut_;
  std::mt19937_64 rng_;
  struct Guarded {
    Tensor ref_storage, dut_storage;  // the whole allocations, guards included
    int64_t numel = 0;
    DType dtype = DType::f32;
  };
  std::vector<Guarded> guarded_;
  PerfTotals perf_;
};

struct OpCase {
  std::string family;
  std::string name;
  std::function<void(OpCheck&)> fn;
};

std::vector<const OpCase*>& op_cases();

// sum(a * b) over two tensors of one device, in double (a loss for gradient cases).
double dot(const Tensor& a, const Tensor& b);

// ---- bf16 cases (training.precision bf16) ----------------------------------------------------
// The ops on bf16 tensors (training.precision bf16: bf16 storage, fp32 math; the CPU
// backend's contract, src/backends/cpu/mixed.h and the bf16 tests of tests/ops), on the
// device under test against the CPU backend running the same bf16 op. Every case runs
// inside ActivationDTypeScope(bf16), as the executor does, so the validators take bf16
// where they expect f32.
//
// Two references per op:
// - the CPU backend's bf16 op on the same bf16 inputs: bitwise for every op whose fp32
//   kernel is bitwise the CPU's (add, accumulate, scale, ReLU, dropout, embedding,
//   permute); within a bf16 rounding step (1/128 relative, plus the fp32 case's own
//   tolerance) for the others, whose fp32 kernels already differ from the CPU in the last
//   bits (GELU's libm erff/tanhf, the row reductions' order, GEMMs), because a value a few
//   fp32 ulps away can round to the neighbouring bf16;
// - the device's own fp32 op on the same values widened to f32, its output rounded to
//   bf16: bitwise, for every op whose bf16 kernel runs the fp32 kernel's arithmetic in the
//   same order on the widened values (elementwise, the row ops: layernorm, RMSNorm,
//   softmax, cross-entropy), so the bf16 kernels are shown to be the fp32 kernels plus
//   the conversions and nothing else.
//
// Every such case's name starts with bf16 (cases_<family>.cpp, "bf16" section).

// One bf16 rounding step, relative (8 significant bits): a bf16 output of an op whose fp32
// result differs from the cpu's in the last fp32 bits may round to the neighbouring bf16.
constexpr double kBf16Rel = 1.0 / 128;
// Row lengths for the row ops (layernorm, RMSNorm, softmax, cross-entropy): rows of a warp
// (C <= 1024) and of a block, in packs of four (C % 4 == 0, aligned) and one by one. Against
// the CPU: the fp32 cases' tolerances plus a bf16 step; against the device's fp32 kernel on
// the same values: bitwise (bf16 outputs rounded; f32 statistics equal).
inline const std::vector<int64_t> kBf16RowLengths = {96, 75, 1600, 2051};
// A bf16 output the kernels see 16-byte aligned (plain storage), NaN until written.
Pair aligned_bf16_output(OpCheck& t, const Shape& s);
// The bf16 bits of a tensor's values (an f32 tensor's rounded), on the host.
std::vector<uint16_t> dut_bits(const Tensor& t);
// The device's bf16 output h is its fp32 output f (from the same values) rounded to bf16, bit
// for bit (NaN by class).
void expect_rounded_dut(const Pair& h, const Pair& f, const std::string& what);
// The f32 outputs of the device's two runs are the same bits.
void expect_same_dut_f32(const Pair& a, const Pair& b, const std::string& what);

struct OpCaseRegistrar {
  OpCaseRegistrar(const char* family, const char* name, void (*fn)(OpCheck&));
};
// Registers a case made at run time (a list of cases written elsewhere: cases_bench.cpp).
void register_op_case(const std::string& family, const std::string& name, std::function<void(OpCheck&)> fn);

}  // namespace remat::test

#define REMAT_OP_CASE(family, name)                                                                                  \
  static void remat_op_case_##family##_##name(::remat::test::OpCheck& t);                                            \
  static const ::remat::test::OpCaseRegistrar remat_op_case_reg_##family##_##name(#family, #name,                    \
                                                                                  &remat_op_case_##family##_##name); \
  static void remat_op_case_##family##_##name([[maybe_unused]] ::remat::test::OpCheck& t)
