// The race checker of the emulator (REMAT_EMU_RACECHECK=1 or remat::emu::set_racecheck):
// reductions missing a barrier are reported with the kernel, block, threads and offset;
// the fixed ones are clean. The kernels (kernels_race.cu) carry the race instrumentation.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "remat/error.h"
#include "tests/emu/test_kernels.h"

namespace {

using emu_test::RaceCase;

constexpr int kThreads = 128, kBlocks = 3;

class EmuRace : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<float> h(kThreads * kBlocks);
    for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>(i % 7);  // exact sums in any order
    ASSERT_EQ(cudaMalloc(&in_, h.size() * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&out_, kBlocks * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(in_, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    for (int b = 0; b < kBlocks; ++b) {
      float s = 0;
      for (int t = 0; t < kThreads; ++t) s += h[b * kThreads + t];
      want_.push_back(s);
    }
  }
  void TearDown() override {
    remat::emu::set_racecheck(false);
    cudaFree(in_);
    cudaFree(out_);
  }
  // Runs the case; returns the race report ("" when none).
  std::string run(RaceCase which, bool check) {
    remat::emu::set_racecheck(check);
    EXPECT_EQ(cudaMemset(out_, 0, kBlocks * sizeof(float)), cudaSuccess);
    try {
      emu_test::race_reduction(which, in_, out_, kBlocks);
    } catch (const remat::Error& e) {
      return e.what();
    }
    return "";
  }
  std::vector<float> out() const {
    std::vector<float> h(kBlocks);
    EXPECT_EQ(cudaMemcpy(h.data(), out_, kBlocks * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  float* in_ = nullptr;
  float* out_ = nullptr;
  std::vector<float> want_;
};

TEST_F(EmuRace, MissingBarrierInStaticSharedReductionIsCaught) {
  const std::string msg = run(RaceCase::kStaticMissingBarrier, true);
  ASSERT_FALSE(msg.empty()) << "race not reported";
  EXPECT_NE(msg.find("static_reduce_kernel<false>"), std::string::npos) << msg;
  EXPECT_NE(msg.find("block (0,0,0)"), std::string::npos) << msg;
  // Thread 0 reads s[64] (stride 64) before thread 64 stores it, with no barrier between.
  EXPECT_NE(msg.find("shared-memory race (read-write) on static __shared__ "), std::string::npos) << msg;
  EXPECT_NE(msg.find("static_reduce_kernel<false>(float const*, float*)::s + 256"), std::string::npos) << msg;
  EXPECT_NE(msg.find("thread (0,0,0) and thread (64,0,0)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("after the start of the block"), std::string::npos) << msg;
}

TEST_F(EmuRace, WithoutRacecheckTheMissingBarrierReadsPoison) {
  EXPECT_EQ(run(RaceCase::kDynamicMissingBarrier, false), "");
  for (float v : out()) EXPECT_TRUE(std::isnan(v)) << v;  // thread 0 read s[64] before thread 64 stored it
}

TEST_F(EmuRace, FixedStaticSharedReductionIsClean) {
  EXPECT_EQ(run(RaceCase::kStaticFixed, true), "");
  EXPECT_EQ(out(), want_);
}

TEST_F(EmuRace, MissingBarrierInDynamicSharedReductionIsCaught) {
  const std::string msg = run(RaceCase::kDynamicMissingBarrier, true);
  ASSERT_FALSE(msg.empty()) << "race not reported";
  EXPECT_NE(msg.find("dynamic_reduce_kernel<false>"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(read-write) on dynamic shared memory byte 256"), std::string::npos) << msg;  // s[64]
  EXPECT_NE(msg.find("thread (0,0,0) and thread (64,0,0)"), std::string::npos) << msg;
}

TEST_F(EmuRace, FixedDynamicSharedReductionIsClean) {
  EXPECT_EQ(run(RaceCase::kDynamicFixed, true), "");
  EXPECT_EQ(out(), want_);
}

TEST_F(EmuRace, WarpSynchronousCodeWithoutSyncwarpIsCaught) {
  const std::string msg = run(RaceCase::kWarpWithoutSyncwarp, true);
  ASSERT_FALSE(msg.empty()) << "race not reported";
  EXPECT_NE(msg.find("warp_tail_reduce_kernel<false>"), std::string::npos) << msg;
  EXPECT_NE(msg.find("after the barrier at tests/emu/kernels_race.cu:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("thread (0,0,0) and thread (1,0,0)"), std::string::npos) << msg;  // lanes of one warp
  // Unchecked, it computes a wrong sum, as on Volta and later GPUs.
  EXPECT_EQ(run(RaceCase::kWarpWithoutSyncwarp, false), "");
  EXPECT_NE(out(), want_);
}

TEST_F(EmuRace, WarpSynchronousCodeWithSyncwarpIsClean) {
  EXPECT_EQ(run(RaceCase::kWarpWithSyncwarp, true), "");
  EXPECT_EQ(out(), want_);
}

TEST_F(EmuRace, SharedAtomicsAreNotRaces) {
  EXPECT_EQ(run(RaceCase::kSharedAtomics, true), "");
  EXPECT_EQ(out(), want_);
}

}  // namespace

// Static + dynamic shared memory against the GPU's limits (known under race checking, where
// the instrumented accesses name the __shared__ variables).
TEST(EmuSharedLimits, StaticPlusDynamicSharedOverTheLimitIsCaught) {
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, sizeof(float)), cudaSuccess);
  auto error = [&](int static_kib, size_t dynamic_bytes) -> std::string {
    try {
      emu_test::big_static_shared(static_kib, dynamic_bytes, out);
    } catch (const remat::Error& e) {
      return e.what();
    }
    return "";
  };
  remat::emu::set_racecheck(true);
  EXPECT_EQ(error(40, 8 * 1024), "") << "40 + 8 KiB fit in 48 KiB";
  std::string msg = error(40, 16 * 1024);
  EXPECT_NE(msg.find("static __shared__ memory of 40960 bytes + 16384 bytes of dynamic shared memory exceed the 49152"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("big_static_shared_kernel"), std::string::npos) << msg;
  EXPECT_NE(msg.find("big (40960)"), std::string::npos) << "names the variable: " << msg;
  msg = error(50, 0);
  EXPECT_NE(msg.find("static __shared__ memory of 51200 bytes exceeds 48 KiB"), std::string::npos) << msg;
  // After opting in, static + dynamic may reach 227 KiB.
  ASSERT_EQ(emu_test::allow_big_static_dynamic(64 * 1024), cudaSuccess);
  EXPECT_EQ(error(40, 16 * 1024), "");
  msg = error(40, 64 * 1024);
  EXPECT_EQ(msg, "") << "40 + 64 KiB fit in 227 KiB after opting in";
  // Without race checking the static size is not known: not checked (docs/kernels.md, limits).
  remat::emu::set_racecheck(false);
  EXPECT_EQ(error(50, 0), "");
  cudaFree(out);
}
