// The cases `remat bench kernels` times, written once: the memory-bound ops at about n
// elements, each with the bytes it must move, and the GEMMs. The op tests register every
// one of them (tests/backend_ops/cases_bench.cpp): each is checked on the device against
// the cpu at a small size, and timed with the rest of the registry in its perf mode
// (REMAT_OP_PERF). A case describes its tensors rather than making them, so that the bench
// makes them on one device and the op tests on both.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "remat/backend.h"
#include "remat/tensor.h"

namespace remat {

// One tensor of a bench case.
struct BenchTensor {
  enum class Init {
    uniform,  // values in [lo, hi) from a fixed generator seeded with `seed` (bench_values)
    zeros,
    ids,     // int32 ids (i * 7919) % id_range
    unread,  // never read by the op (made, but its contents are whatever the memory holds)
  };
  Shape shape;
  Init init = Init::uniform;
  float lo = -1.0f, hi = 1.0f;
  uint32_t seed = 1;
  int64_t id_range = 0;
  bool written = false;  // the op writes it (the op tests compare it)
};

// One run of an op on `be` over the case's tensors, made in the order of BenchCase::tensors.
using BenchRun = std::function<void(Backend& be, const std::vector<Tensor>& t)>;

// A memory-bound case.
struct BenchCase {
  std::string name;      // e.g. "layernorm_fwd" (docs/kernels.md's coalescing list names these)
  std::string shape;     // of the main tensor, e.g. "[85, 768]"
  int64_t elements = 0;  // of the main tensor
  double bytes = 0;      // moved by one run: what the op must read and write at least
  std::string formula;   // how `bytes` is counted
  std::vector<BenchTensor> tensors;
  BenchRun run;
  // The op tests' tolerance of the device's written tensors against the cpu's:
  // |dut - ref| <= atol + rtol * |ref|.
  double atol = 0, rtol = 0;
};

// The memory-bound ops at about n elements (rows of a realistic width where the op has
// rows). Byte counts are what each op must read and write at least, in 4-byte elements;
// dropout's mask is regenerated from its Philox state, never stored.
std::vector<BenchCase> memory_bound_bench_cases(int64_t n);

// A GEMM, c [m, n] = a [m, k] @ b [k, n] (trans_b: b is [n, k] and the product a bᵀ, as a
// linear layer's y = x wᵀ): fp32, TF32 or bf16 operands (with fp32 accumulation and a
// bf16 c). Operands: uniform in [-1, 1) (a seed 1, b seed 2), rounded to bf16 where bf16.
struct GemmBenchCase {
  std::string name;
  int64_t m, n, k;
  bool bf16, tf32, trans_b;
};

// A square GEMM of side `size` in fp32, TF32 and bf16 (a b, both row-major: the layout of
// the earlier figures), and the bf16 GEMMs of a GPT-2 124M step at `size` tokens (8192:
// batch 8 of 1024) as a linear layer runs them: the attention input projection, the MLP's
// two, the LM head (vocabulary padded to 50304, as llm.c does). The op tests take the same
// GEMMs of a narrower model (width, vocab).
std::vector<GemmBenchCase> gemm_bench_cases(int64_t size, int64_t width = 768, int64_t vocab = 50304);

// A fused attention (Backend::flash_attention_*), packed causal self-attention over
// qkv [b, t, 3 h d], sized as the FlashAttention papers' benchmarks: b t = tokens, h d =
// 2048. Forward FLOPs 4 b h t^2 d / 2 (causal), backward 2.5 times that (the FlashAttention
// convention: five products against two).
struct AttentionBenchCase {
  std::string name;
  int64_t b, t, h, d;
  bool bf16;
  double forward_flops() const { return 2.0 * static_cast<double>(b * h * d) * static_cast<double>(t * t); }
};
// bf16 at each sequence length of `seqs` with head dims 64 and 128, and fp32 at the first,
// d = 64; `tokens` tokens per run and `width` = h d (16384 and 2048 in the papers).
std::vector<AttentionBenchCase> attention_bench_cases(int64_t tokens, const std::vector<int64_t>& seqs,
                                                      int64_t width = 2048);

// The host values of a float tensor of a case (uniform, zeros; unread: zeros) and of an ids
// tensor: the same for the bench and the op tests.
std::vector<float> bench_values(const BenchTensor& t);
std::vector<int32_t> bench_ids(const BenchTensor& t);
// A tensor of a case on device d (unread: Tensor::empty).
Tensor make_bench_tensor(const BenchTensor& t, Device d);
// A GEMM operand on device d: uniform in [-1, 1) from `seed`, rounded to bf16 where bf16.
Tensor gemm_bench_operand(const Shape& s, uint32_t seed, bool bf16, Device d);

}  // namespace remat
