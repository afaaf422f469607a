// Devices: cpu, cuda:N (when built with CUDA and a driver and GPU exist), meta (no
// data; every allocation is still accounted, so plans can be profiled without memory) and
// cuda-emu: remat's CUDA backend with its real kernels run on the CUDA emulator
// (kernels/emu) over the emulator's device memory, for machines without a GPU. cuda-emu exists in programs
// that link remat_cuda_emu and call register_cuda_emu_backend() (the remat command and
// the tests do).
#pragma once

#include <string>
#include <vector>

namespace remat {

enum class DeviceType { cpu, cuda, meta, cuda_emu };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device meta() { return {DeviceType::meta, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::cuda, i}; }
  static Device cuda_emu() { return {DeviceType::cuda_emu, 0}; }

  // "cpu", "meta", "cuda", "cuda:N", "cuda-emu". Throws remat::Error for anything else.
  static Device parse(const std::string& s);
  std::string str() const;

  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool is_meta() const { return type == DeviceType::meta; }
  bool is_cuda_emu() const { return type == DeviceType::cuda_emu; }
  // Its memory is host memory (cpu): host code may read and write it. A GPU's is not, and
  // neither is the emulated GPU's (cuda-emu: the emulator's protected cudaMalloc arena);
  // their copies and fills go through their device kind (device_registry.h).
  bool host_memory() const { return type == DeviceType::cpu; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  size_t total_memory = 0;
};

// What the CUDA runtime says about this machine. Probed once; probing never throws and
// never leaves a CUDA error behind for later calls to trip over.
struct CudaStatus {
  bool built = false;      // remat was compiled with CUDA
  bool available = false;  // a driver and at least one GPU
  int device_count = 0;
  int error_code = 0;       // cudaGetDeviceCount's return code when not available
  std::string error;        // human-readable reason when not available
  int runtime_version = 0;  // cudaRuntimeGetVersion, e.g. 13000
  int driver_version = 0;   // 0 without a driver
  std::vector<CudaDeviceInfo> devices;
};
const CudaStatus& cuda_status();

// Throws remat::Error naming the device and the reason when it cannot hold tensors.
void require_available(Device d);

// Library versions compiled in (empty when absent).
struct BuildInfo {
  std::string version;
  bool cuda = false;
  std::string cuda_toolkit;  // e.g. "13.0"
  std::string cublas;
  std::string cudnn;
  std::string curand;
  std::string blas;  // OpenBLAS config string
  std::string compiler;
  int cpu_threads = 1;  // OpenMP threads
};
BuildInfo build_info();

}  // namespace remat
