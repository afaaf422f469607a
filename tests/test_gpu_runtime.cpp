// GPU runtime checks (label `gpu`): run on a machine with a CUDA device, skipped elsewhere.
#include <gtest/gtest.h>

#include "remat/device.h"
#include "remat/memory.h"
#include "remat/tensor.h"
#include "support/expect_error.h"

using remat::Device;
using remat::Tensor;

#define REQUIRE_GPU()                                                 \
  if (!remat::cuda_status().available) {                              \
    GTEST_SKIP() << "no CUDA device: " << remat::cuda_status().error; \
  }

TEST(GpuRuntime, RoundTripAndFillKernel) {
  REQUIRE_GPU();
  std::vector<float> v(100003);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.5f;
  Tensor g = Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, Device::cuda(0));
  EXPECT_EQ(g.to_vector(), v);
  g.fill_(3.25f);
  for (float x : g.to_vector()) ASSERT_EQ(x, 3.25f);
  Tensor z = Tensor::zeros({7, 9}, Device::cuda(0));
  for (float x : z.to_vector()) ASSERT_EQ(x, 0.0f);
  Tensor back = g.to(Device::cpu());
  EXPECT_EQ(back.to_vector()[100002], 3.25f);
}

TEST(GpuRuntime, AllocatorAccountsCudaMemoryLikeCpu) {
  REQUIRE_GPU();
  auto& a = remat::allocator_for(Device::cuda(0));
  const auto before = a.stats();
  {
    remat::TagScope scope(remat::MemoryCategory::activation, "gpu_test", remat::Phase::forward);
    Tensor t = Tensor::empty({1000}, Device::cuda(0));
    EXPECT_EQ(a.stats().allocated - before.allocated, 4096);
    EXPECT_EQ(a.stats().by_category[remat::MemoryCategory::activation] -
                  before.by_category[remat::MemoryCategory::activation],
              4096);
  }
  EXPECT_EQ(a.stats().allocated, before.allocated);
}

TEST(GpuRuntime, OutOfMemoryIsAClearError) {
  REQUIRE_GPU();
  EXPECT_REMAT_ERROR(Tensor::empty({int64_t{1} << 50}, Device::cuda(0)), "out of memory on cuda:0");
  Tensor ok = Tensor::full({16}, 1.0f, Device::cuda(0));  // the device still works
  EXPECT_EQ(ok.to_vector()[15], 1.0f);
}
