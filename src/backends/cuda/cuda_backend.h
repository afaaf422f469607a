// The CUDA backend: hand-written kernels (kernels/*.cu) for every op except GEMM, cuBLAS
// for GEMM, linear layers and the attention products, and an im2col + cuBLAS path for
// convolution (cuDNN's deterministic algorithms when built with cuDNN).
//
// The same sources build twice: against the CUDA toolkit (device cuda:N, in the remat
// library) and against the CUDA emulator (REMAT_EMULATE: device cuda-emu, library
// remat_cuda_emu), where kernels run on the host with CUDA's execution semantics and
// cuBLAS maps to OpenBLAS. REMAT_KERNELS_ABI_BEGIN keeps the two builds' symbols apart.
//
// One file per op family, as in the CPU backend (cuda_backend.cpp holds the device,
// stream and handles, gemm and linear), each defining its CudaBackend::*_impl.
//
// Every op is enqueued on the backend's stream; ops that return a host value (accuracy,
// global_norm) synchronise it, and so do index checks the host could not make
// (embedding ids, cross-entropy targets without a host-known range). Results are reproducible run to run (no
// floating-point atomics); they match the CPU backend within the tolerances of tests/backend_ops.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <memory>
#include <vector>

#include "kernels/bf16.cuh"
#include "kernels/common.cuh"
#include "remat/backend.h"
#include "remat/backend_tuning.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

// A float tensor as a kernel's array: its device pointer and whether its elements are bf16
// (training.precision bf16; kernels/bf16.cuh). Undefined: a null pointer.
inline kernels::FloatBuf fbuf(const Tensor& t) {
  if (!t.defined()) return {};
  return kernels::FloatBuf{t.raw_data(), t.dtype() == DType::bf16};
}

// The backend is its own tuning (remat/backend_tuning.h): CUDA events, the L2 flush, TF32,
// attention's scratch groups and, on the emulator, the traffic counters.
class CudaBackend : public Backend, public BackendTuning {
 public:
  explicit CudaBackend(Device device);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return device_; }
  std::string name() const override { return device_.is_cuda_emu() ? "cuda-emu" : "cuda"; }

  cudaStream_t stream() const { return stream_; }
  void* native_stream() const override { return stream_; }
  BackendTuning& tuning() override { return *this; }
  cublasHandle_t cublas() const { return cublas_; }
  // TF32 tensor-core GEMMs (cuBLAS math mode); off by default, on with REMAT_TF32=1.
  bool set_tf32(bool on) override;
  bool tf32() const override { return tf32_; }
  // While TF32 is off, GEMMs run in CUBLAS_DEFAULT_MATH (fp32, the fastest kernels, the
  // same bits run to run on one GPU); pedantic math (CUBLAS_PEDANTIC_MATH: the prescribed
  // precision in every phase, also under NVIDIA_TF32_OVERRIDE, slower) is off by default,
  // on with REMAT_CUBLAS_PEDANTIC=1 or here.
  void set_pedantic_math(bool on);
  bool pedantic_math() const { return pedantic_; }
  // Attention's [T, T] scratch per group of batch elements (attention.cpp): 64 MiB per
  // buffer by default (0).
  int64_t set_attention_group_bytes(int64_t bytes) override;

  // A small device buffer the backend owns (allocated once, outside the tensor allocator)
  // for values returned to the host (accuracy, global_norm, input checks) and for partial
  // sums inside one op (norms, losses). Ops run in order on the one stream, so an op may
  // use it freely between its first launch and its return.
  static constexpr size_t kScratchBytes = 64 * 1024;
  void* scratch() const { return scratch_; }
  // Copies `bytes` from device memory to the host and waits for the stream.
  void copy_to_host(void* dst, const void* src, size_t bytes) const;

  void synchronize() override;
  // How many times the host has waited for this backend's stream (synchronize, copies to or
  // from host memory, values read back, time_ms): each one drains the GPU's queue of work.
  // tests/test_device_exec.cpp bounds them per training step (docs/kernels.md).
  int64_t stream_drains() const { return drains_; }
  void note_drain() const { ++drains_; }
  // CUDA events on the stream (host clocks on the emulator, whose launches are synchronous).
  double time_ms(const std::function<void()>& body) override;
  void flush_caches() override;  // rewrites a buffer of twice the L2
  Properties properties() const override;
  // Every op takes bf16 activations (kernels/bf16.cuh; docs/kernels.md "bf16 kernels").
  bool supports_bf16() const override { return true; }
  // Activation offload (cuda_memory.cpp): copies on a non-blocking copy stream, ordered
  // with the ops by events; pinned host memory from cudaMallocHost in large chunks.
  std::string offload_unsupported() const override { return ""; }
  std::unique_ptr<RawAllocator> make_pinned_allocator(size_t chunk) override;
  uint64_t copy_async(const Tensor& dst, const Tensor& src) override;
  void wait_copy(uint64_t ticket) override;
#if defined(REMAT_EMULATE)
  // The emulator's traffic counter (kernels/emu/traffic.cpp).
  bool count_traffic(bool on) override;
  std::vector<KernelTraffic> take_traffic() override;
#endif

 protected:
  void enter_op() override { activate(); }

#define REMAT_OP(kind, R, name, params, args) R name##_impl params override;
#include "remat/backend_ops.def"
#undef REMAT_OP

 private:
  void activate() const;  // cudaSetDevice for cuda:N (every op enters through enter_op)

  Device device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* scratch_ = nullptr;
  bool tf32_ = false;
  bool pedantic_ = false;
  mutable int64_t drains_ = 0;
  int64_t attn_group_bytes_ = 0;
  void apply_math_mode();
  // Offload's copy stream and events, made on first use; a ticket's event until waited for.
  cudaStream_t copy_stream_ = nullptr;
  std::vector<cudaEvent_t> spare_events_;
  // A pending copy: its event, and the device tensor it reads (copy-out) or writes
  // (copy-in), which must stay held until the copy is waited for.
  struct PendingCopy {
    cudaEvent_t done = nullptr;
    std::weak_ptr<const Storage> device_side;
    bool out = false;
  };
  std::map<uint64_t, PendingCopy> copies_;
  uint64_t next_ticket_ = 0;
  cudaEvent_t take_event();
  // For time_ms and flush_caches, made on first use.
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  void* flush_ = nullptr;
  size_t flush_bytes_ = 0;
  int flushes_ = 0;
};

REMAT_KERNELS_ABI_END
}  // namespace remat
