// NCCL on a GPU (label gpu; skipped, saying why, without a CUDA device or without NCCL in
// the build). One rank on one GPU exercises the whole device path: the unique id through
// the host Comm, the communicator, the grouped all-to-all, the all-gather and the
// all-reduce on the backend's stream, the timing events and the deadline's wait; the
// reducer's device path (packing into flat device buffers, the fold and scaling with the
// backend's ops) gives bitwise the local fold's gradient and the host's fixed-order sum.
// tools/gpu/gpu_check.sh adds mpirun -np 1 `remat train` on cuda against one process.
#include <gtest/gtest.h>

#include <cstring>

#include "remat/device.h"
#include "remat/dist.h"
#include "remat/profile.h"
#include "support/dist_fixtures.h"
#include "train/grad_reduce.h"

using remat::Device;
using remat::GradReducer;
using remat::ParamStore;
using remat::ReduceOptions;
using remat::Tensor;

#define REQUIRE_NCCL_GPU()                                                                         \
  if (!remat::cuda_status().available) {                                                           \
    GTEST_SKIP() << "no CUDA device: " << remat::cuda_status().error;                              \
  }                                                                                                \
  if (!remat::dist::built_with_nccl()) {                                                           \
    GTEST_SKIP() << "remat was built without NCCL (CMake found no nccl.h and libnccl; NCCL_ROOT)"; \
  }                                                                                                \
  if (remat::dist::world().size() != 1) {                                                          \
    GTEST_SKIP() << "run by mpirun with several ranks: this test is one rank's";                   \
  }

namespace {

remat::Graph tiny_graph() { return remat::test::tiny_dist_graph(); }

std::vector<std::vector<float>> micro_grads(const ParamStore& ps, int64_t m) {
  return remat::test::seeded_grads(ps, static_cast<uint32_t>(2000 + m));
}

// K micro-batches through a reducer on cuda:0 (with NCCL or the local fold); the gradients.
std::vector<std::vector<float>> reduce_on_gpu(const remat::Graph& g, int64_t k, bool ordered, bool nccl, bool whole) {
  remat::Backend& be = remat::backend_for(Device::cuda(0));
  ParamStore ps(g, Device::cuda(0), 7);
  ReduceOptions ro;
  ro.ordered = ordered;
  std::unique_ptr<remat::dist::DeviceComm> dc;
  if (nccl) dc = remat::dist::make_nccl_comm(remat::dist::world(), 0);
  GradReducer red(ps, be, remat::dist::world(), ro, std::move(dc));
  EXPECT_EQ(red.engine().rfind(nccl ? "nccl " : "local", 0), 0u) << red.engine();
  for (int64_t m = 0; m < k; ++m) {
    const auto gm = micro_grads(ps, m);
    for (size_t p = 0; p < ps.grads.size(); ++p)
      if (ps.grads[p].defined()) ps.grads[p].copy_from(Tensor::from_vector(gm[p], ps.grads[p].shape()));
    red.begin_round(m, m + 1 == k);
    red.add_round(m);
  }
  red.finish(1.0f / static_cast<float>(k), whole);
  if (nccl) {
    const remat::dist::CommStats s = red.device_stats();
    EXPECT_GT(s.calls, 0);
    EXPECT_EQ(s.bytes, 0);  // one rank sends nothing to others
    EXPECT_GT(s.ms, 0.0);   // the events around the collectives were read
  }
  std::vector<std::vector<float>> out;
  for (const Tensor& t : ps.grads) out.push_back(t.defined() ? t.to_vector() : std::vector<float>());
  return out;
}

}  // namespace

TEST(Nccl, OneRankCollectivesOnTheBackendStream) {
  REQUIRE_NCCL_GPU();
  remat::Backend& be = remat::backend_for(Device::cuda(0));
  auto dc = remat::dist::make_nccl_comm(remat::dist::world(), 0);
  EXPECT_EQ(dc->size(), 1);
  EXPECT_EQ(dc->engine().rfind("nccl 2.", 0), 0u) << dc->engine();
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.25f - 3.0f;
  const Tensor a = Tensor::from_vector(v, {1000}, Device::cuda(0));
  const Tensor b = Tensor::zeros({1000}, Device::cuda(0));
  dc->alltoall(a.f32(), b.f32(), 1000, be.native_stream());
  dc->wait(be.native_stream());
  EXPECT_EQ(b.to_vector(), v);
  const Tensor c = Tensor::zeros({1000}, Device::cuda(0));
  dc->allgather(a.f32(), c.f32(), 1000, be.native_stream());
  dc->allreduce_sum(c.f32(), 1000, be.native_stream());  // one rank: the sum is itself
  dc->wait(be.native_stream());
  EXPECT_EQ(c.to_vector(), v);
  EXPECT_EQ(dc->stats().calls, 3);
  EXPECT_GT(dc->stats().ms, 0.0);
  EXPECT_EQ(dc->stats().ms, dc->stats().wait_ms);  // on the backend's stream: nothing hidden
}

TEST(Nccl, ReducerIsBitwiseTheLocalFoldAndTheHostSum) {
  REQUIRE_NCCL_GPU();
  const remat::Graph g = tiny_graph();
  const int64_t k = 5;
  // The host's fixed-order sum, times 1/K, in float.
  ParamStore host(g, Device::cpu(), 7);
  std::vector<std::vector<float>> want = micro_grads(host, 0);
  for (int64_t m = 1; m < k; ++m) {
    const auto gm = micro_grads(host, m);
    for (size_t p = 0; p < want.size(); ++p)
      for (size_t i = 0; i < want[p].size(); ++i) want[p][i] += gm[p][i];
  }
  for (auto& v : want)
    for (float& x : v) x *= 1.0f / static_cast<float>(k);
  const auto local = reduce_on_gpu(g, k, /*ordered=*/true, /*nccl=*/false, true);
  for (bool ordered : {true, false})
    for (bool whole : {true, false}) {
      SCOPED_TRACE(std::string(ordered ? "ordered" : "fast") + (whole ? ", whole" : ", shard"));
      const auto got = reduce_on_gpu(g, k, ordered, /*nccl=*/true, whole);
      for (size_t p = 0; p < want.size(); ++p) {
        EXPECT_EQ(got[p], want[p]) << g.params[p].name;
        EXPECT_EQ(got[p], local[p]) << g.params[p].name;
      }
    }
}

TEST(Nccl, GatherWeightsBringsTheShardBack) {
  REQUIRE_NCCL_GPU();
  const remat::Graph g = tiny_graph();
  remat::Backend& be = remat::backend_for(Device::cuda(0));
  ParamStore ps(g, Device::cuda(0), 7);
  ParamStore ref(g, Device::cpu(), 7);  // the same initial weights, on the host
  GradReducer red(ps, be, remat::dist::world(), ReduceOptions{}, remat::dist::make_nccl_comm(remat::dist::world(), 0));
  red.gather_weights();
  for (size_t p = 0; p < ps.values.size(); ++p)
    EXPECT_EQ(ps.values[p].to_vector(), ref.values[p].to_vector()) << g.params[p].name;
}
