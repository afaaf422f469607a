// The sharded optimizer (ZeRO-1, training.shard_optimizer): the flat layout's shards cover
// every trainable element once, 64-byte aligned; N optimizers, each updating its shard and
// exchanging weights, give bitwise the weights and state of one unsharded optimizer (AdamW
// with and without clipping, SGD with momentum); the state gathers into and scatters from
// the checkpoint's whole tensors; the memory model counts 1/N of the state per rank.
// The ranks are threads here; tests/test_mpi.sh runs the same over MPI.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

#include "remat/optim.h"
#include "remat/profile.h"
#include "remat/train.h"
#include "support/dist_fixtures.h"

using remat::Device;
using remat::FlatLayout;
using remat::Optimizer;
using remat::ParamStore;
using remat::Tensor;

namespace {

remat::Config tiny_config(const std::string& optimizer) {
  return remat::test::tiny_dist_config(nlohmann::json::parse(optimizer));
}

std::vector<uint8_t> bytes(const Tensor& t) {
  const std::vector<float> v = t.to_vector();
  std::vector<uint8_t> b(v.size() * sizeof(float));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

using remat::test::Barrier;

// An allgather among `n` thread ranks: recv = the ranks' blocks of `count` floats in order.
struct ThreadAllGather {
  explicit ThreadAllGather(int n) : barrier(n), blocks(static_cast<size_t>(n)) {}
  void operator()(int rank, const float* send, float* recv, int64_t count) {
    blocks[static_cast<size_t>(rank)] = send;
    barrier.wait();
    for (size_t r = 0; r < blocks.size(); ++r) std::memcpy(recv + r * count, blocks[r], count * sizeof(float));
    barrier.wait();
  }
  Barrier barrier;
  std::vector<const float*> blocks;
};

void fill_grads(ParamStore& ps, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (Tensor& g : ps.grads) {
    if (!g.defined()) continue;
    std::vector<float> v(static_cast<size_t>(g.numel()));
    for (float& x : v) x = nd(rng);
    g.copy_from(Tensor::from_vector(v, g.shape()));
  }
}

TEST(FlatLayout, ShardsCoverEveryElementOnceAligned) {
  const remat::Config cfg = tiny_config(R"({"type": "adamw"})");
  const remat::Graph g = remat::build_config_graph(cfg, 4, 0);
  ParamStore ps(g, Device::cpu(), 1);
  for (int n : {1, 2, 3, 5, 64}) {
    const FlatLayout l(ps, n);
    EXPECT_EQ(l.size, l.shard * n);
    EXPECT_EQ(l.shard % FlatLayout::kAlign, 0);
    EXPECT_GE(l.size, l.elements);
    EXPECT_LT(l.shard, (l.elements + n - 1) / n + FlatLayout::kAlign * static_cast<int64_t>(ps.values.size() + 1));
    std::vector<int> seen(static_cast<size_t>(l.size), 0);
    int64_t covered = 0;
    for (int r = 0; r < n; ++r)
      for (const FlatLayout::Piece& pc : l.pieces(r)) {
        const int64_t flat = l.offset[pc.param] + pc.begin;
        EXPECT_GE(flat, l.shard * r);
        EXPECT_LE(l.offset[pc.param] + pc.end, l.shard * (r + 1));
        EXPECT_EQ(flat % FlatLayout::kAlign, 0) << "piece not aligned: param " << pc.param << " rank " << r;
        for (int64_t i = pc.begin; i < pc.end; ++i) ++seen[static_cast<size_t>(l.offset[pc.param] + i)];
        covered += pc.end - pc.begin;
      }
    EXPECT_EQ(covered, l.elements) << n << " ranks";
    for (size_t p = 0; p < ps.grads.size(); ++p) {
      if (!ps.grads[p].defined()) continue;
      for (int64_t i = 0; i < ps.grads[p].numel(); ++i) {
        EXPECT_EQ(seen[static_cast<size_t>(l.offset[p] + i)], 1);
      }
    }
  }
}

// N thread ranks with sharded optimizers against one unsharded optimizer, 4 steps, the
// same gradients everywhere (as after the reduction); then the gathered state against
// the unsharded one's, and a scatter into 3 ranks that continues bitwise.
void expect_bitwise_unsharded(const std::string& optimizer, int n) {
  SCOPED_TRACE(optimizer + ", " + std::to_string(n) + " ranks");
  const remat::Config cfg = tiny_config(optimizer);
  const remat::Graph g = remat::build_config_graph(cfg, 4, 0);
  ParamStore ref(g, Device::cpu(), 7);
  Optimizer ref_opt(cfg.optimizer, ref, remat::backend_for(Device::cpu()));
  std::vector<std::unique_ptr<ParamStore>> ps;
  std::vector<std::unique_ptr<Optimizer>> opt;
  for (int r = 0; r < n; ++r) {
    ps.push_back(std::make_unique<ParamStore>(g, Device::cpu(), 7));
    opt.push_back(std::make_unique<Optimizer>(cfg.optimizer, *ps.back(), remat::backend_for(Device::cpu()), r, n));
  }
  // Steps [from, to) of the reference and of the n ranks (ps, opt: swapped for a resume).
  auto run_steps = [&](int from, int to) {
    const FlatLayout& l = *opt[0]->layout();
    for (int step = from; step < to; ++step) {
      fill_grads(ref, 100 + step);
      ref_opt.step(0.05);
      for (int r = 0; r < n; ++r) {
        fill_grads(*ps[r], 100 + step);
        opt[r]->step(0.05);
      }
      // The weight all-gather: every rank's pieces to every rank.
      for (int r = 0; r < n; ++r)
        for (const FlatLayout::Piece& pc : l.pieces(r))
          for (int q = 0; q < n; ++q)
            if (q != r)
              std::memcpy(ps[q]->values[pc.param].f32() + pc.begin, ps[r]->values[pc.param].f32() + pc.begin,
                          (pc.end - pc.begin) * sizeof(float));
    }
  };
  run_steps(0, 4);
  for (int r = 0; r < n; ++r)
    for (size_t p = 0; p < ref.values.size(); ++p)
      ASSERT_EQ(bytes(ps[r]->values[p]), bytes(ref.values[p])) << "rank " << r << ", " << g.params[p].name;
  // The whole state, gathered on every rank, is the unsharded optimizer's.
  const auto want = ref_opt.checkpoint_state();
  std::vector<std::vector<std::pair<std::string, Tensor>>> got;
  for (int r = 0; r < n; ++r) got.push_back(opt[r]->checkpoint_state());
  ThreadAllGather ag(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back(
        [&, r] { opt[r]->gather_state(got[r], [&](const float* s, float* v, int64_t c) { ag(r, s, v, c); }); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(got[r].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[r][i].first, want[i].first);
      EXPECT_EQ(bytes(got[r][i].second), bytes(want[i].second)) << "rank " << r << ", " << want[i].first;
    }
  }
  // Resumed with 3 ranks from the gathered state: 2 more steps, still bitwise.
  const int m = 3;
  std::vector<std::unique_ptr<ParamStore>> ps3;
  std::vector<std::unique_ptr<Optimizer>> opt3;
  for (int r = 0; r < m; ++r) {
    ps3.push_back(std::make_unique<ParamStore>(g, Device::cpu(), 7));
    for (size_t p = 0; p < ref.values.size(); ++p) ps3[r]->values[p].copy_from(ps[0]->values[p]);
    opt3.push_back(std::make_unique<Optimizer>(cfg.optimizer, *ps3.back(), remat::backend_for(Device::cpu()), r, m));
    opt3[r]->scatter_state(got[0]);
    opt3[r]->set_steps_taken(opt[0]->steps_taken());
  }
  std::swap(ps, ps3);
  std::swap(opt, opt3);
  n = m;
  run_steps(4, 6);
  for (int r = 0; r < n; ++r)
    for (size_t p = 0; p < ref.values.size(); ++p)
      ASSERT_EQ(bytes(ps[r]->values[p]), bytes(ref.values[p])) << "resumed, rank " << r << ", " << g.params[p].name;
}

TEST(ShardOptimizer, AdamWBitwiseUnsharded) {
  for (int n : {1, 2, 3, 4}) expect_bitwise_unsharded(R"({"type": "adamw", "lr": 0.01, "weight_decay": 0.1})", n);
}

TEST(ShardOptimizer, AdamWWithClippingBitwiseUnsharded) {
  // Clipping reads every gradient (the trainer gathers the whole reduced gradient then).
  expect_bitwise_unsharded(R"({"type": "adamw", "lr": 0.01, "weight_decay": 0.1, "grad_clip": 0.5})", 3);
}

TEST(ShardOptimizer, SgdMomentumBitwiseUnsharded) {
  expect_bitwise_unsharded(R"({"type": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.01, "nesterov": true})", 2);
  expect_bitwise_unsharded(R"({"type": "sgd", "lr": 0.1})", 3);  // no state at all
}

// The update reads only the rank's shard of the gradients: garbage elsewhere changes
// nothing in the rank's pieces (what the trainer relies on without clipping).
TEST(ShardOptimizer, ReadsOnlyItsShardOfTheGradient) {
  const remat::Config cfg = tiny_config(R"({"type": "adamw", "lr": 0.01})");
  const remat::Graph g = remat::build_config_graph(cfg, 4, 0);
  ParamStore a(g, Device::cpu(), 3), b(g, Device::cpu(), 3);
  Optimizer oa(cfg.optimizer, a, remat::backend_for(Device::cpu()), 1, 3);
  Optimizer ob(cfg.optimizer, b, remat::backend_for(Device::cpu()), 1, 3);
  fill_grads(a, 5);
  fill_grads(b, 6);
  for (const FlatLayout::Piece& pc : oa.layout()->pieces(1))
    std::memcpy(b.grads[pc.param].f32() + pc.begin, a.grads[pc.param].f32() + pc.begin,
                (pc.end - pc.begin) * sizeof(float));
  oa.step(0.01);
  ob.step(0.01);
  for (const FlatLayout::Piece& pc : oa.layout()->pieces(1))
    EXPECT_EQ(0, std::memcmp(a.values[pc.param].f32() + pc.begin, b.values[pc.param].f32() + pc.begin,
                             (pc.end - pc.begin) * sizeof(float)));
}

// memprof --ranks N --shard-optimizer: each rank's optimizer state is one shard, 1/N of
// the unsharded state up to the alignment padding; measured on cpu == predicted on meta.
TEST(ShardOptimizer, MemoryModelCountsOneShardPerRank) {
  remat::Config cfg = tiny_config(R"({"type": "adamw"})");
  const remat::Graph g = remat::build_config_graph(cfg, 4, 0);
  const auto plan = remat::make_plan(g, "none");
  const size_t opt_cat = static_cast<size_t>(remat::MemoryCategory::optimizer_state);
  const int64_t whole = remat::profile_step(cfg, g, plan, Device::meta(), false).peak_by_category.bytes[opt_cat];
  EXPECT_GE(whole, 2 * 4 * g.parameter_count());
  cfg.training.shard_optimizer = true;
  for (int n : {2, 3, 4}) {
    cfg.training.ranks = n;
    const auto predicted = remat::profile_step(cfg, g, plan, Device::meta(), false);
    const auto measured = remat::profile_step(cfg, g, plan, Device::cpu(), false);
    ParamStore ps(g, Device::cpu(), 0);
    const FlatLayout l(ps, n);
    const int64_t state = predicted.peak_by_category.bytes[opt_cat];
    EXPECT_EQ(state, measured.peak_by_category.bytes[opt_cat]) << n;
    EXPECT_EQ(predicted.peak_bytes, measured.peak_bytes) << n;
    // Two flat moments of one shard, each at the allocator's rounded size.
    EXPECT_EQ(state, 2 * static_cast<int64_t>(remat::CachingAllocator::round_size(4 * l.shard))) << n << " ranks";
    EXPECT_LE(static_cast<double>(state), static_cast<double>(whole) / n + 2.0 * remat::CachingAllocator::kRounding)
        << n;
    EXPECT_EQ(predicted.ranks, n);
    EXPECT_TRUE(predicted.shard_optimizer);
  }
}

}  // namespace
