// main() for every remat test binary: after the tests, the process-wide cpu and meta
// (and cuda-emu, where linked)
// allocators must hold no live allocation (a leaked tensor fails the binary).
#include <gtest/gtest.h>

#include "remat/backend.h"
#include "remat/memory.h"

namespace {

class LeakCheck : public ::testing::Environment {
 public:
  void TearDown() override {
    std::vector<remat::Device> devices{remat::Device::cpu(), remat::Device::meta()};
    if (remat::backend_registered(remat::DeviceType::cuda_emu)) devices.push_back(remat::Device::cuda_emu());
    for (auto d : devices) {
      const auto s = remat::allocator_for(d).stats();
      EXPECT_EQ(s.live_blocks, 0) << "allocations still live on " << d.str() << " after the tests";
      EXPECT_EQ(s.allocated, 0) << "bytes still allocated on " << d.str() << " after the tests";
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new LeakCheck);
  return RUN_ALL_TESTS();
}
