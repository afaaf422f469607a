// Every registered op case (cases_*.cpp) on the device under test, against the cpu
// backend. Built twice (tests/CMakeLists.txt): on cuda-emu (label kernels) and on cuda
// (label gpu, skipped without a GPU). REMAT_TEST_DEVICE names the device.
#include <gtest/gtest.h>

#include <cstdio>

#include "backend_ops/harness.h"
#include "remat/device.h"
#include "remat/error.h"

namespace remat::test {
namespace {

#if defined(REMAT_TEST_EMU)
const bool kRegistered = (register_cuda_emu_backend(), true);
#endif

class BackendOps : public ::testing::TestWithParam<const OpCase*> {};

TEST_P(BackendOps, MatchesCpu) {
  const Device dut = Device::parse(REMAT_TEST_DEVICE);
  if (dut.is_cuda() && !cuda_status().available) GTEST_SKIP() << "no CUDA device: " << cuda_status().error;
  const OpCase& c = *GetParam();
  // Every backend implements every op (remat/backend_ops.def): an error here is a failure.
  OpCheck check(backend_for(Device::cpu()), backend_for(dut),
                /*seed=*/0x5eed0000u + std::hash<std::string>{}(c.name) % 1000);
  c.fn(check);
  if (perf_iterations()) {
    const PerfTotals& p = check.perf();
    std::printf("perf %-48s %3d runs %10.4f ms %10.3f MB %8.1f GB/s\n", (c.family + "_" + c.name).c_str(), p.runs, p.ms,
                p.bytes / 1e6, p.ms > 0 ? p.bytes / (p.ms * 1e-3) / 1e9 : 0.0);
    RecordProperty("device_ms", std::to_string(p.ms));
    RecordProperty("bytes", std::to_string(p.bytes));
  }
}

std::string case_name(const ::testing::TestParamInfo<const OpCase*>& info) {
  return info.param->family + "_" + info.param->name;
}

INSTANTIATE_TEST_SUITE_P(Ops, BackendOps, ::testing::ValuesIn(op_cases()), case_name);

}  // namespace
}  // namespace remat::test
