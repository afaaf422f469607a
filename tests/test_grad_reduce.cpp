// The data-parallel reduction (src/train/grad_reduce.*) with threads as ranks, through a
// Comm whose collectives run between the threads: the ordered reduction gives every rank
// bitwise the fixed-order sum of the micro-batches' gradients that one process computes
// on the host, for 1 to 4 ranks, whole or per shard; buckets overlapped with the backward
// sweep (any bucket size, reported in backward's order or not at all) change no bit; the
// fast reduction stays close. tests/test_mpi.sh runs the same over MPI.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "remat/dist.h"
#include "remat/profile.h"
#include "support/dist_fixtures.h"
#include "support/expect_error.h"
#include "train/grad_reduce.h"

using remat::Device;
using remat::FlatLayout;
using remat::GradReducer;
using remat::ParamStore;
using remat::ReduceOptions;
using remat::Tensor;

namespace {

remat::Graph tiny_graph() { return remat::test::tiny_dist_graph(); }

// Micro-batch m's gradient: normal values from seed 1000 + m, per parameter.
std::vector<std::vector<float>> micro_grads(const ParamStore& ps, int64_t m) {
  return remat::test::seeded_grads(ps, static_cast<uint32_t>(1000 + m));
}

using remat::test::Barrier;

// What the ranks of a ThreadComm share: each posts its buffers, all meet at a barrier,
// each copies what it receives, all meet again before a buffer may change.
struct Hub {
  explicit Hub(int n) : barrier(n), send(static_cast<size_t>(n)), op(static_cast<size_t>(n)) {}
  struct Op {
    bool alltoallv = false;
    const float* send = nullptr;
    float* data = nullptr;  // allreduce
    int64_t count = 0;
    std::vector<int64_t> send_count, send_offset, recv_count, recv_offset;
    float* recv = nullptr;
  };
  Barrier barrier;
  std::vector<const void*> send;
  std::vector<const Op*> op;
};

// Threads as ranks. Non-blocking collectives complete in wait_all, in the order they
// started (which must be the same on every rank).
class ThreadComm final : public remat::dist::Comm {
 public:
  ThreadComm(Hub& hub, int rank, int size) : hub_(hub), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return rank_; }
  int local_size() const override { return size_; }
  std::string engine() const override { return "threads"; }
  void abort(int) override {}

 protected:
  void alltoall_impl(const void* send, void* recv, int64_t bytes) override {
    post(send);
    for (int r = 0; r < size_; ++r)
      std::memcpy(static_cast<char*>(recv) + r * bytes, static_cast<const char*>(hub_.send[r]) + rank_ * bytes,
                  static_cast<size_t>(bytes));
    hub_.barrier.wait();
  }
  void allgather_impl(const void* send, void* recv, int64_t bytes) override {
    post(send);
    for (int r = 0; r < size_; ++r)
      std::memcpy(static_cast<char*>(recv) + r * bytes, hub_.send[r], static_cast<size_t>(bytes));
    hub_.barrier.wait();
  }
  void allreduce_sum_impl(float* data, int64_t count) override {
    post(data);
    std::vector<float> sum(static_cast<size_t>(count), 0.0f);  // rank order
    for (int r = 0; r < size_; ++r)
      for (int64_t i = 0; i < count; ++i) sum[static_cast<size_t>(i)] += static_cast<const float*>(hub_.send[r])[i];
    hub_.barrier.wait();
    std::copy(sum.begin(), sum.end(), data);
  }
  void start_alltoallv_impl(const float* send, const std::vector<int64_t>& send_count,
                            const std::vector<int64_t>& send_offset, float* recv,
                            const std::vector<int64_t>& recv_count, const std::vector<int64_t>& recv_offset) override {
    Hub::Op o;
    o.alltoallv = true;
    o.send = send;
    o.recv = recv;
    o.send_count = send_count;
    o.send_offset = send_offset;
    o.recv_count = recv_count;
    o.recv_offset = recv_offset;
    pending_.push_back(o);
  }
  void start_allreduce_sum_impl(float* data, int64_t count) override {
    Hub::Op o;
    o.data = data;
    o.count = count;
    pending_.push_back(o);
  }
  int poll_impl() override { return 0; }
  void wait_all_impl() override {
    for (const Hub::Op& o : pending_) {
      hub_.op[static_cast<size_t>(rank_)] = &o;
      hub_.barrier.wait();
      if (o.alltoallv) {
        for (int s = 0; s < size_; ++s) {
          const Hub::Op& from = *hub_.op[static_cast<size_t>(s)];
          ASSERT_TRUE(from.alltoallv) << "ranks started different collectives";
          ASSERT_EQ(from.send_count[static_cast<size_t>(rank_)], o.recv_count[static_cast<size_t>(s)]);
          std::memcpy(o.recv + o.recv_offset[static_cast<size_t>(s)],
                      from.send + from.send_offset[static_cast<size_t>(rank_)],
                      static_cast<size_t>(o.recv_count[static_cast<size_t>(s)]) * sizeof(float));
        }
        hub_.barrier.wait();
      } else {
        std::vector<float> sum(static_cast<size_t>(o.count), 0.0f);
        for (int s = 0; s < size_; ++s) {
          const Hub::Op& from = *hub_.op[static_cast<size_t>(s)];
          ASSERT_EQ(from.count, o.count) << "ranks started different collectives";
          for (int64_t i = 0; i < o.count; ++i) sum[static_cast<size_t>(i)] += from.data[i];
        }
        hub_.barrier.wait();
        std::copy(sum.begin(), sum.end(), o.data);
      }
    }
    pending_.clear();
  }

 private:
  void post(const void* send) {
    hub_.send[static_cast<size_t>(rank_)] = send;
    hub_.barrier.wait();
  }
  Hub& hub_;
  int rank_, size_;
  std::vector<Hub::Op> pending_;
};

enum class Hook { backward_order, parameter_order, none };

struct Reduced {
  std::vector<std::vector<std::vector<float>>> grads;  // per rank, per parameter
  std::vector<remat::dist::CommStats> stats;           // per rank
  int buckets = 0;
};

// K micro-batches on n thread ranks: round j, rank r adds micro-batch j n + r.
Reduced reduce(const remat::Graph& g, int n, int64_t k, ReduceOptions ro, Hook hook, bool whole = true) {
  Hub hub(n);
  Reduced out;
  out.grads.resize(static_cast<size_t>(n));
  out.stats.resize(static_cast<size_t>(n));
  std::vector<int> buckets(static_cast<size_t>(n), 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      remat::Backend& be = remat::backend_for(Device::cpu());
      ParamStore ps(g, Device::cpu(), 7);
      ThreadComm comm(hub, r, n);
      GradReducer red(ps, be, comm, ro);
      buckets[static_cast<size_t>(r)] = red.buckets();
      const int64_t rounds = k / n;
      for (int64_t j = 0; j < rounds; ++j) {
        const auto gm = micro_grads(ps, j * n + r);
        for (size_t p = 0; p < ps.grads.size(); ++p)
          if (ps.grads[p].defined()) std::memcpy(ps.grads[p].f32(), gm[p].data(), gm[p].size() * sizeof(float));
        red.begin_round(j, j + 1 == rounds);
        const size_t np = ps.grads.size();
        if (hook == Hook::backward_order)
          for (size_t q = np; q-- > 0;) red.grads_final({static_cast<int>(q)});
        if (hook == Hook::parameter_order)
          for (size_t q = 0; q < np; ++q) red.grads_final({static_cast<int>(q)});
        red.add_round(j);
      }
      red.finish(1.0f / static_cast<float>(k), whole);
      for (const Tensor& t : ps.grads)
        out.grads[static_cast<size_t>(r)].push_back(t.defined() ? t.to_vector() : std::vector<float>());
      out.stats[static_cast<size_t>(r)] = comm.stats();
    });
  for (auto& t : threads) t.join();
  out.buckets = buckets[0];
  return out;
}

// The step's gradient as one process defines it: g_0 + g_1 + ... + g_{K-1} left to right,
// times 1/K, in float.
std::vector<std::vector<float>> reference(const remat::Graph& g, int64_t k) {
  ParamStore ps(g, Device::cpu(), 7);
  std::vector<std::vector<float>> sum = micro_grads(ps, 0);
  for (int64_t m = 1; m < k; ++m) {
    const auto gm = micro_grads(ps, m);
    for (size_t p = 0; p < sum.size(); ++p)
      for (size_t i = 0; i < sum[p].size(); ++i) sum[p][i] += gm[p][i];
  }
  const float scale = 1.0f / static_cast<float>(k);
  for (auto& v : sum)
    for (float& x : v) x *= scale;
  return sum;
}

}  // namespace

TEST(GradReduce, OrderedIsTheFixedOrderSumForAnyRankCountWithAndWithoutOverlap) {
  const remat::Graph g = tiny_graph();
  for (int n : {1, 2, 3, 4}) {
    const int64_t k = 12;
    const auto want = reference(g, k);
    for (bool overlap : {false, true})
      for (int64_t bucket : {int64_t{1}, int64_t{200}, int64_t{1000}, int64_t{1} << 20})
        for (Hook hook : {Hook::backward_order, Hook::parameter_order, Hook::none}) {
          if (!overlap && (bucket != 1 || hook != Hook::backward_order)) continue;
          SCOPED_TRACE(std::to_string(n) + " ranks, overlap " + (overlap ? "on" : "off") + ", bucket " +
                       std::to_string(bucket) + " bytes, hook " + std::to_string(static_cast<int>(hook)));
          ReduceOptions ro;
          ro.overlap = overlap;
          ro.bucket_bytes = bucket;
          const Reduced run = reduce(g, n, k, ro, hook);
          for (int r = 0; r < n; ++r)
            for (size_t p = 0; p < want.size(); ++p)
              ASSERT_EQ(run.grads[static_cast<size_t>(r)][p], want[p]) << "rank " << r << ", " << g.params[p].name;
          if (overlap && n > 1) {
            // Whole parameters per bucket: 1 byte closes a bucket at every parameter.
            const auto trainable = std::count_if(want.begin(), want.end(), [](const auto& v) { return !v.empty(); });
            if (bucket == 1) {
              EXPECT_EQ(run.buckets, static_cast<int>(trainable));
            } else if (bucket == int64_t{1} << 20) {
              EXPECT_EQ(run.buckets, 1);
            }
          } else {
            EXPECT_EQ(run.buckets, 0);
          }
        }
  }
}

TEST(GradReduce, ShardOwnersGetTheirShardBitwiseWithOverlap) {
  // A sharded optimizer without clipping reads only its shard (finish(whole = false)).
  const remat::Graph g = tiny_graph();
  const int64_t k = 6;
  const auto want = reference(g, k);
  for (int n : {2, 3}) {
    ReduceOptions ro;
    ro.overlap = true;
    ro.bucket_bytes = 100;
    const Reduced run = reduce(g, n, k, ro, Hook::backward_order, /*whole=*/false);
    ParamStore ps(g, Device::cpu(), 7);
    const FlatLayout layout(ps, n);
    int64_t checked = 0;
    for (int r = 0; r < n; ++r)
      for (const FlatLayout::Piece& pc : layout.pieces(r))
        for (int64_t i = pc.begin; i < pc.end; ++i, ++checked)
          ASSERT_EQ(run.grads[static_cast<size_t>(r)][pc.param][static_cast<size_t>(i)],
                    want[pc.param][static_cast<size_t>(i)])
              << n << " ranks, rank " << r << ", " << g.params[pc.param].name << "[" << i << "]";
    EXPECT_EQ(checked, layout.elements);
  }
}

TEST(GradReduce, FastIsCloseAndOverlapChangesNothing) {
  const remat::Graph g = tiny_graph();
  const int64_t k = 6;
  const auto want = reference(g, k);
  for (int n : {2, 3}) {
    ReduceOptions ro;
    ro.ordered = false;
    const Reduced plain = reduce(g, n, k, ro, Hook::backward_order);
    ro.overlap = true;
    ro.bucket_bytes = 300;
    const Reduced over = reduce(g, n, k, ro, Hook::backward_order);
    EXPECT_GT(over.buckets, 1);
    for (size_t p = 0; p < want.size(); ++p)
      for (size_t i = 0; i < want[p].size(); ++i) {
        ASSERT_NEAR(plain.grads[0][p][i], want[p][i], 1e-5f) << g.params[p].name;
        ASSERT_EQ(over.grads[1][p][i], plain.grads[1][p][i]) << g.params[p].name;  // both sum ranks in rank order
      }
  }
}

TEST(GradReduce, BucketsCountTheBytesTheyExchange) {
  // One round on 2 ranks: the all-to-all moves half the flat gradient (N-1)/N either way;
  // the all-gather the other half.
  const remat::Graph g = tiny_graph();
  ParamStore ps(g, Device::cpu(), 7);
  const FlatLayout layout(ps, 2);
  for (bool overlap : {false, true}) {
    ReduceOptions ro;
    ro.overlap = overlap;
    ro.bucket_bytes = 64;
    const Reduced run = reduce(g, 2, 2, ro, Hook::backward_order);
    for (int r = 0; r < 2; ++r) {
      const remat::dist::CommStats& s = run.stats[static_cast<size_t>(r)];
      EXPECT_EQ(s.bytes, layout.size / 2 * 4 * 2) << "rank " << r << ", overlap " << overlap;
      EXPECT_GE(s.ms, s.wait_ms);
      EXPECT_GE(s.wait_ms, 0.0);
      EXPECT_EQ(s.calls, overlap ? run.buckets + 1 : 2);
    }
  }
}

TEST(Dist, SingleProcessCollectivesCopyAndAccount) {
  if (remat::dist::launched_by_mpirun()) GTEST_SKIP() << "under mpirun: world() is MPI's";
  remat::dist::Comm& c = remat::dist::world();
  ASSERT_EQ(c.size(), 1);
  c.reset_stats();
  const std::vector<float> send{1, 2, 3, 4, 5, 6};
  std::vector<float> recv(6, 0.0f);
  c.start_alltoallv(send.data(), {3}, {2}, recv.data(), {3}, {1});
  EXPECT_EQ(c.in_flight(), 1);
  c.poll();
  EXPECT_EQ(c.in_flight(), 0);
  EXPECT_EQ(recv, (std::vector<float>{0, 3, 4, 5, 0, 0}));
  std::vector<float> data{1.5f, -2.0f};
  c.start_allreduce_sum(data.data(), 2);
  c.wait_all();
  EXPECT_EQ(data, (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(c.stats().bytes, 0);  // nothing leaves a single process
  EXPECT_EQ(c.stats().calls, 2);
  EXPECT_GE(c.stats().ms, c.stats().wait_ms);
  EXPECT_REMAT_ERROR(c.start_alltoallv(send.data(), {1, 1}, {0, 0}, recv.data(), {1}, {0}), "one entry per rank");
  c.reset_stats();
}

TEST(Dist, DeviceCollectivesNeedNccl) {
  if (remat::dist::built_with_nccl()) GTEST_SKIP() << "built with NCCL: test_nccl_gpu runs it on a GPU";
  EXPECT_REMAT_ERROR(remat::dist::make_nccl_comm(remat::dist::world(), 0), "built without NCCL");
}
