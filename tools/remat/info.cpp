// `remat info`: what remat was built with and which devices it can use.
#include <unistd.h>

#include <cstdio>

#include "commands.h"
#include "remat/backend.h"
#include "remat/device.h"
#include "remat/dist.h"
#include "remat/memory.h"

namespace remat::cli {

Runner add_info_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("info", "Print the build (CUDA, cuBLAS, cuDNN versions), the devices found and threads");
  return [cmd]() -> int {
    if (!cmd->parsed()) return -1;
    const BuildInfo b = build_info();
    std::printf("remat %s\n", b.version.c_str());
    std::printf("build\n");
    std::printf("  compiler        %s\n", b.compiler.c_str());
    std::printf("  CUDA            %s\n", b.cuda ? "on" : "off (built with REMAT_CUDA=OFF)");
    if (b.cuda) {
      std::printf("  CUDA toolkit    %s\n", b.cuda_toolkit.c_str());
      std::printf("  cuBLAS          %s\n", b.cublas.empty() ? "unknown" : b.cublas.c_str());
      std::printf("  cuDNN           %s\n", b.cudnn.empty() ? "not built" : b.cudnn.c_str());
      std::printf("  cuRAND          %s\n", b.curand.empty() ? "unknown" : b.curand.c_str());
    }
    std::printf("  BLAS            %s\n", b.blas.c_str());
    std::printf("  MPI             %s\n",
                dist::built_with_mpi() ? "on (data parallel under mpirun)" : "off (not found)");
    if (b.cuda)
      std::printf("  NCCL            %s\n", dist::built_with_nccl() ? dist::nccl_version().c_str() : "not built");
    std::printf("devices\n");
    const int64_t ram = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
    std::printf("  cpu             %d OpenMP thread(s), %s of memory\n", b.cpu_threads, format_bytes(ram).c_str());
    const CudaStatus& cs = cuda_status();
    if (cs.available) {
      for (const auto& d : cs.devices) {
        std::printf("  cuda:%-10d  %s, sm_%d%d, %d SMs, %s\n", d.index, d.name.c_str(), d.sm_major, d.sm_minor,
                    d.multiprocessors, format_bytes(static_cast<int64_t>(d.total_memory)).c_str());
      }
      std::printf("  (driver %d.%d, runtime %d.%d)\n", cs.driver_version / 1000, cs.driver_version % 1000 / 10,
                  cs.runtime_version / 1000, cs.runtime_version % 1000 / 10);
    } else {
      std::printf("  cuda            unavailable: %s\n", cs.error.c_str());
    }
    if (backend_registered(DeviceType::cuda_emu))
      std::printf("  cuda-emu        available (the CUDA kernels on the host emulator: exact semantics, slow)\n");
    std::printf("  meta            available (shapes and allocations only, no data)\n");
    return 0;
  };
}

}  // namespace remat::cli
