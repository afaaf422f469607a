// The meta backend (memory profiling without data) allocates exactly what the cpu backend
// allocates, over chains of ops of several families as layers call them: an MLP head and a
// transformer block's ops. (Each family's own meta tests are in its test_<family>.cpp.)
#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "ops/op_test.h"
#include "remat/backend.h"
#include "remat/memory.h"
#include "remat/ops.h"
#include "support/golden.h"

namespace remat::test {
namespace {

TEST(OpsMeta, MlpChainAllocatesWhatCpuAllocates) {
  auto run = [](Device d) {
    auto& alloc = remat::allocator_for(d);
    alloc.reset_peak();
    const auto before = alloc.stats();
    Backend& be = remat::backend_for(d);
    {
      remat::TagScope scope(remat::MemoryCategory::activation, "mlp", remat::Phase::forward);
      Tensor x = Tensor::empty({8, 33}, d), w = Tensor::empty({17, 33}, d), b = Tensor::empty({17}, d);
      Tensor h = ops::linear(be, x, w, b);
      Tensor a = ops::gelu(be, h);
      Tensor y = ops::dropout(be, a, 0.1f, {1, 0});
      Tensor targets = Tensor::empty({8}, d, remat::DType::i32);
      auto ce = ops::cross_entropy(be, y, targets);
      (void)ce;
    }
    const auto after = alloc.stats();
    return std::make_pair(after.peak_allocated - before.allocated, after.num_allocs - before.num_allocs);
  };
  // On cpu the data are uninitialised; only the targets must be valid for cross-entropy.
  auto cpu_run = [&] {
    auto& alloc = remat::allocator_for(Device::cpu());
    alloc.reset_peak();
    const auto before = alloc.stats();
    Backend& be = cpu();
    {
      remat::TagScope scope(remat::MemoryCategory::activation, "mlp", remat::Phase::forward);
      Tensor x = Tensor::zeros({8, 33}), w = Tensor::zeros({17, 33}), b = Tensor::zeros({17});
      Tensor h = ops::linear(be, x, w, b);
      Tensor a = ops::gelu(be, h);
      Tensor y = ops::dropout(be, a, 0.1f, {1, 0});
      Tensor targets = Tensor::from_ints(std::vector<int32_t>(8, 0), {8});
      auto ce = ops::cross_entropy(be, y, targets);
      (void)ce;
    }
    const auto after = alloc.stats();
    return std::make_pair(after.peak_allocated - before.allocated, after.num_allocs - before.num_allocs);
  };
  auto m = run(Device::meta());
  auto c = cpu_run();
  EXPECT_EQ(m.first, c.first);
  EXPECT_EQ(m.second, c.second);
  EXPECT_GT(m.first, 0);
}

struct AllocDelta {
  int64_t allocated, peak, requested, allocs, frees, workspace_peak;
  bool operator==(const AllocDelta& o) const {
    return allocated == o.allocated && peak == o.peak && requested == o.requested && allocs == o.allocs &&
           frees == o.frees && workspace_peak == o.workspace_peak;
  }
};

std::ostream& operator<<(std::ostream& os, const AllocDelta& d) {
  return os << "{allocated " << d.allocated << ", peak " << d.peak << ", requested " << d.requested << ", allocs "
            << d.allocs << ", frees " << d.frees << ", workspace peak " << d.workspace_peak << "}";
}

// Allocator activity of the transformer ops' wrappers on device d (inputs allocated beforehand).
AllocDelta transformer_allocations(Device d, const AttentionParams& p) {
  Backend& be = backend_for(d);
  auto& alloc = allocator_for(d);
  const bool data = d.is_cpu();
  auto input = [&](const Shape& s, uint32_t seed) { return data ? random_tensor(s, seed) : Tensor::empty(s, d); };
  const Tensor qkv = input(Shape{2, 9, 48}, 141), dout = input(Shape{2, 9, 16}, 142);
  const Tensor x = input(Shape{18, 16}, 143), gamma = input(Shape{16}, 144), beta = input(Shape{16}, 145);
  const Tensor ids = data ? random_ids(Shape{2, 9}, 6, 146) : Tensor::empty(Shape{2, 9}, d, DType::i32);
  const Tensor table = input(Shape{6, 16}, 147), pos = input(Shape{9, 16}, 148);
  alloc.reset_peak();
  const MemoryStats s0 = alloc.stats();
  {
    TagScope tag(MemoryCategory::activation, "block0", Phase::forward);
    const Tensor e = ops::embedding(be, ids, table, pos);
    const auto ln = ops::layernorm(be, x, gamma, beta);
    const auto a = ops::attention(be, qkv, p, RngState{1, 0});
    const Tensor dqkv = ops::attention_backward(be, dout, qkv, a.probs, p, RngState{1, 0});
    const Tensor perm = ops::permute_0213(be, a.probs);
  }
  const MemoryStats s1 = alloc.stats();
  return AllocDelta{s1.allocated - s0.allocated,
                    s1.peak_allocated - s0.allocated,
                    s1.requested - s0.requested,
                    s1.num_allocs - s0.num_allocs,
                    s1.num_frees - s0.num_frees,
                    s1.peak_by_category[MemoryCategory::workspace] - s0.by_category[MemoryCategory::workspace]};
}

TEST(OpsMeta, TransformerOpsAllocateExactlyWhatCpuAllocates) {
  for (float drop : {0.0f, 0.1f}) {
    SCOPED_TRACE("dropout " + std::to_string(drop));
    const AttentionParams p{2, true, drop};
    const AllocDelta c = transformer_allocations(Device::cpu(), p);
    const AllocDelta m = transformer_allocations(Device::meta(), p);
    EXPECT_EQ(c, m);
    // Not vacuous: outputs were allocated and freed, and the workspace peak is the larger
    // of the two attention workspaces (all 4 heads of [9, 9] fit one group).
    EXPECT_GT(c.peak, 0);
    EXPECT_GE(c.allocs, 9);
    EXPECT_EQ(c.allocs, c.frees);
    const int64_t head = 9 * 9 * sizeof(float);
    EXPECT_EQ(cpu().attention_forward_workspace(Shape{2, 9, 48}, p), drop > 0.0f ? 4 * head : 0);
    EXPECT_EQ(cpu().attention_backward_workspace(Shape{2, 9, 48}, p), drop > 0.0f ? 8 * head : 4 * head);
    EXPECT_EQ(c.workspace_peak, static_cast<int64_t>(CachingAllocator::round_size(drop > 0.0f ? 8 * head : 4 * head)));
  }
}

}  // namespace
}  // namespace remat::test
