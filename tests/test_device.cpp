// Device strings and CUDA probing on machines with and without a GPU.
#include <gtest/gtest.h>

#include "remat/backend.h"
#include "remat/device.h"
#include "remat/tensor.h"
#include "support/expect_error.h"

using remat::Device;

TEST(Device, Parse) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("meta"), Device::meta());
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::parse("cuda-emu"), Device::cuda_emu());
  EXPECT_EQ(Device::cuda(1).str(), "cuda:1");
  EXPECT_EQ(Device::cuda_emu().str(), "cuda-emu");
  EXPECT_TRUE(Device::cpu().host_memory());
  EXPECT_FALSE(Device::cuda_emu().host_memory());  // the emulator's device memory, as a GPU's
  EXPECT_FALSE(Device::cuda(0).host_memory());
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "CPU", "", "cuda_emu", "cuda-emu:0"}) {
    EXPECT_REMAT_ERROR(Device::parse(bad), "unknown device");
  }
  EXPECT_REMAT_ERROR(Device::parse("gpu"), "cuda-emu");  // the error lists the choices
}

// This binary does not link remat_cuda_emu: asking for its backend names what is missing,
// and leaves nothing behind that a later registration would trip over.
TEST(Device, CudaEmuWithoutTheEmulatedBackendIsAClearError) {
  ASSERT_FALSE(remat::backend_registered(remat::DeviceType::cuda_emu));
  EXPECT_REMAT_ERROR(remat::backend_for(Device::cuda_emu()), "not linked with the emulated CUDA backend");
  EXPECT_REMAT_ERROR(remat::backend_for(Device::cuda_emu()), "register_cuda_emu_backend");
}

TEST(Device, CudaProbeIsConsistentAndNeverThrows) {
  const remat::CudaStatus& s = remat::cuda_status();
  const remat::CudaStatus& again = remat::cuda_status();
  EXPECT_EQ(&s, &again);  // probed once
#ifdef REMAT_WITH_CUDA
  EXPECT_TRUE(s.built);
  EXPECT_GT(s.runtime_version, 0);
#else
  EXPECT_FALSE(s.built);
#endif
  if (s.available) {
    EXPECT_GT(s.device_count, 0);
    EXPECT_EQ(static_cast<int>(s.devices.size()), s.device_count);
  } else {
    EXPECT_EQ(s.device_count, 0);
    EXPECT_FALSE(s.error.empty());
  }
}

TEST(Device, UnavailableCudaIsAClearErrorAndCpuStillWorks) {
  if (remat::cuda_status().available) GTEST_SKIP() << "a GPU is present";
  EXPECT_REMAT_ERROR(remat::Tensor::empty({4}, Device::cuda(0)), "device cuda:0 is not available: ");
  EXPECT_REMAT_ERROR(remat::require_available(Device::cuda(1)), "is not available");
  // Nothing of the failed probe leaks into later work.
  remat::Tensor t = remat::Tensor::full({3}, 2.0f);
  EXPECT_EQ(t.to_vector()[2], 2.0f);
  EXPECT_REMAT_ERROR(remat::Tensor::empty({4}, Device::cuda(0)), "is not available");
}

TEST(Device, BuildInfo) {
  auto b = remat::build_info();
  EXPECT_FALSE(b.version.empty());
  EXPECT_GE(b.cpu_threads, 1);
  EXPECT_NE(b.blas.find("OpenBLAS"), std::string::npos);
#ifdef REMAT_WITH_CUDA
  EXPECT_TRUE(b.cuda);
  EXPECT_FALSE(b.cuda_toolkit.empty());
  EXPECT_FALSE(b.cublas.empty());
#endif
}
