// The emulator's global-memory traffic counter (remat::emu::set_traffic_count): warp
// accesses, requested bytes and 32-byte sectors of access patterns whose figures are worked
// out by hand below. The kernels (kernels_traffic.cu) carry the instrumentation.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/emu/test_kernels.h"

namespace {

using emu_test::TrafficCase;

constexpr int kN = 1024, kThreads = 128;
constexpr uint64_t kWarps = kN / 32;  // one element per thread: 32 warps

struct Expect {
  uint64_t accesses;
  uint64_t load_requested, load_sectors;
  uint64_t store_requested, store_sectors;
};

class EmuTraffic : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(remat::emu::traffic_instrumented());
    // Room for the widest pattern (in[32 i] for i < kN).
    ASSERT_EQ(cudaMalloc(&in_, 32 * kN * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&out_, kN * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemset(in_, 0, 32 * kN * sizeof(float)), cudaSuccess);
    remat::emu::take_traffic();  // nothing left over from other tests
  }
  void TearDown() override {
    remat::emu::set_traffic_count(false);
    remat::emu::set_shuffle_lanes(0);
    cudaFree(in_);
    cudaFree(out_);
  }
  // Runs the case counted; returns the one kernel's counts.
  remat::emu::KernelTraffic run(TrafficCase c) {
    remat::emu::set_traffic_count(true);
    emu_test::traffic_case(c, in_, out_, kN, kThreads);
    remat::emu::set_traffic_count(false);
    const std::vector<remat::emu::KernelTraffic> t = remat::emu::take_traffic();
    EXPECT_EQ(t.size(), 1u);
    return t.empty() ? remat::emu::KernelTraffic{} : t[0];
  }
  static void check(const remat::emu::KernelTraffic& t, const Expect& e) {
    EXPECT_EQ(t.launches, 1u);
    EXPECT_EQ(t.warp_accesses, e.accesses);
    EXPECT_EQ(t.load_requested_bytes, e.load_requested);
    EXPECT_EQ(t.load_sectors, e.load_sectors);
    EXPECT_EQ(t.store_requested_bytes, e.store_requested);
    EXPECT_EQ(t.store_sectors, e.store_sectors);
    EXPECT_EQ(t.requested_bytes, e.load_requested + e.store_requested);
    EXPECT_EQ(t.sectors, e.load_sectors + e.store_sectors);
  }
  float* in_ = nullptr;
  float* out_ = nullptr;
};

// Each of the 32 warps loads 32 consecutive floats (128 bytes, 4 sectors) and stores as
// many: 100%, and every other pattern's store is this one.
TEST_F(EmuTraffic, ConsecutiveWordsAreFullyCoalesced) {
  const auto t = run(TrafficCase::kCoalesced);
  check(t, {2 * kWarps, kWarps * 128, kWarps * 4, kWarps * 128, kWarps * 4});
  EXPECT_EQ(t.efficiency(), 1.0);
  EXPECT_EQ(t.kernel, "traffic_kernel");
  EXPECT_EQ(t.worst_site, "");  // no instruction wasted a byte
}

// The order of the lanes within the warp does not matter: the same sectors.
TEST_F(EmuTraffic, APermutationWithinTheWarpIsFullyCoalesced) {
  check(run(TrafficCase::kReversedLanes), {2 * kWarps, kWarps * 128, kWarps * 4, kWarps * 128, kWarps * 4});
}

// Every other float: the warp's 128 requested bytes span 256 bytes, 8 sectors. Loads 50%,
// the kernel (128 + 128) / (32 x (8 + 4)) = 2/3.
TEST_F(EmuTraffic, StrideTwoHalvesTheLoads) {
  const auto t = run(TrafficCase::kStride2);
  check(t, {2 * kWarps, kWarps * 128, kWarps * 8, kWarps * 128, kWarps * 4});
  EXPECT_DOUBLE_EQ(t.efficiency(), 256.0 / 384.0);
  EXPECT_LT(t.efficiency(), 0.9);
  EXPECT_NE(t.worst_site.find("+0x"), std::string::npos) << t.worst_site;  // the load, by module offset
  EXPECT_DOUBLE_EQ(t.worst_site_efficiency, 0.5);
}

// 128 bytes apart: every lane its own sector, loads 4 / 32 = 12.5%.
TEST_F(EmuTraffic, StrideOfASectorOrMoreIsOneSectorPerLane) {
  const auto t = run(TrafficCase::kStride32);
  check(t, {2 * kWarps, kWarps * 128, kWarps * 32, kWarps * 128, kWarps * 4});
  EXPECT_DOUBLE_EQ(t.efficiency(), 256.0 / (32.0 * 36));
  EXPECT_DOUBLE_EQ(t.worst_site_efficiency, 0.125);
}

// Shifted by one float: bytes 4..131 of each 128-byte row, 5 sectors, loads 80%.
TEST_F(EmuTraffic, AMisalignedRowTouchesOneMoreSector) {
  check(run(TrafficCase::kOffsetByOne), {2 * kWarps, kWarps * 128, kWarps * 5, kWarps * 128, kWarps * 4});
}

// Every lane reads the same float: 4 distinct bytes requested, one sector.
TEST_F(EmuTraffic, ABroadcastRequestsItsBytesOnce) {
  check(run(TrafficCase::kBroadcast), {2 * kWarps, kWarps * 4, kWarps * 1, kWarps * 128, kWarps * 4});
}

// 16-byte accesses: 8 warps (256 float4), each 512 bytes in 16 sectors.
TEST_F(EmuTraffic, Float4AccessesAreFullyCoalesced) {
  const auto t = run(TrafficCase::kFloat4);
  check(t, {2 * 8, 8 * 512, 8 * 16, 8 * 512, 8 * 16});
  EXPECT_EQ(t.efficiency(), 1.0);
}

// A loop without synchronisation: the k-th execution of the load by each lane of a warp is
// one warp access (4 warps x 8 iterations); with a shuffle and a barrier in every iteration
// the same accesses; and in a shuffled lane order too.
TEST_F(EmuTraffic, LoopIterationsAreGroupedByExecutionCount) {
  const Expect e{2 * 4 * 8, kWarps * 128, kWarps * 4, kWarps * 128, kWarps * 4};
  check(run(TrafficCase::kLoop), e);
  check(run(TrafficCase::kLoopSynchronised), e);
  remat::emu::set_shuffle_lanes(12345);
  check(run(TrafficCase::kLoop), e);
  check(run(TrafficCase::kLoopSynchronised), e);
}

// Counting is off by default, and counts only kernels that carry the instrumentation: the
// accesses of one that does not are not seen (its launches are).
TEST_F(EmuTraffic, NothingIsCountedWhenOffOrUninstrumented) {
  emu_test::traffic_case(TrafficCase::kStride2, in_, out_, kN, kThreads);
  EXPECT_TRUE(remat::emu::take_traffic().empty());
  remat::emu::set_traffic_count(true);
  emu_test::axpy(2.0f, in_, out_, kN);  // kernels_semantics.cu: not instrumented
  remat::emu::set_traffic_count(false);
  const auto t = remat::emu::take_traffic();
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].launches, 1u);
  EXPECT_EQ(t[0].warp_accesses, 0u);
}

}  // namespace
