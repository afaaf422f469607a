// The CUDA backend: hand-written kernels (kernels/*.cu) for every op except GEMM, cuBLAS
// for GEMM, linear layers and the attention products, and an im2col + cuBLAS path for
// convolution (cuDNN's deterministic algorithms when built with cuDNN).
//
// The same sources build twice: against the CUDA toolkit (device cuda:N, in the remat
// library) and against the CUDA emulator (REMAT_EMULATE: device cuda-emu, library
// remat_cuda_emu), where kernels run on the host with CUDA's execution semantics and
// cuBLAS maps to OpenBLAS. REMAT_KERNELS_ABI_BEGIN keeps the two builds' symbols apart.
//
// One file per op family, as in the CPU backend: cuda_backend.cpp (device, stream,
// handles, gemm, linear), elementwise.cpp, softmax_loss.cpp, conv.cpp, pool.cpp,
// batchnorm.cpp, layernorm.cpp, embedding.cpp, attention.cpp, optim.cpp.
//
// Every op is enqueued on the backend's stream; ops that return a host value (accuracy,
// global_norm) synchronise it. Results are reproducible run to run (no floating-point
// atomics); they match the CPU backend within the tolerances of tests/backend_ops.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/common.cuh"
#include "remat/backend.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(Device device);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return device_; }
  std::string name() const override { return device_.is_cuda_emu() ? "cuda-emu" : "cuda"; }

  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  // TF32 tensor-core GEMMs (cuBLAS math mode); off by default, on with REMAT_TF32=1.
  void set_tf32(bool on);
  bool tf32() const { return tf32_; }

  // A small device buffer the backend owns (allocated once, outside the tensor allocator)
  // for values returned to the host (accuracy, global_norm, input checks) and for partial
  // sums inside one op (norms, losses). Ops run in order on the one stream, so an op may
  // use it freely between its first launch and its return.
  static constexpr size_t kScratchBytes = 64 * 1024;
  void* scratch() const { return scratch_; }
  // Copies `bytes` from device memory to the host and waits for the stream.
  void copy_to_host(void* dst, const void* src, size_t bytes) const;

 protected:
  void gemm_impl(const Tensor& a, const Tensor& b, const Tensor& c, const GemmParams& p) override;
  void linear_forward_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) override;
  void linear_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx, const Tensor& dw, const Tensor& db) override;
  void add_impl(const Tensor& a, const Tensor& b, const Tensor& y) override;
  void accumulate_impl(const Tensor& dst, const Tensor& src) override;
  void scale_impl(const Tensor& x, float alpha, const Tensor& y) override;
  void relu_forward_impl(const Tensor& x, const Tensor& y) override;
  void relu_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& dx) override;
  void gelu_forward_impl(const Tensor& x, GeluApprox approx, const Tensor& y) override;
  void gelu_backward_impl(const Tensor& dy, const Tensor& x, GeluApprox approx, const Tensor& dx) override;
  void dropout_forward_impl(const Tensor& x, float p, RngState rng, const Tensor& y) override;
  void dropout_backward_impl(const Tensor& dy, float p, RngState rng, const Tensor& dx) override;
  void softmax_forward_impl(const Tensor& x, bool log, const Tensor& y) override;
  void softmax_backward_impl(const Tensor& dy, const Tensor& y, bool log, const Tensor& dx) override;
  void cross_entropy_forward_impl(const Tensor& logits, const Tensor& targets, int ignore_index, const Tensor& loss, const Tensor& lse) override;
  void cross_entropy_backward_impl(float dloss, const Tensor& logits, const Tensor& targets, const Tensor& lse, int ignore_index, const Tensor& dlogits) override;
  int64_t accuracy_impl(const Tensor& logits, const Tensor& targets, int ignore_index, int64_t* counted) override;
  size_t conv2d_forward_workspace_impl(const Shape& x, const Shape& w, const Conv2dParams& p) override;
  void conv2d_forward_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p, const Tensor& y, const Tensor& workspace) override;
  size_t conv2d_backward_workspace_impl(const Shape& x, const Shape& w, const Conv2dParams& p) override;
  void conv2d_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, const Conv2dParams& p, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& workspace) override;
  void maxpool2d_forward_impl(const Tensor& x, const Pool2dParams& p, const Tensor& y, const Tensor& indices) override;
  void maxpool2d_backward_impl(const Tensor& dy, const Tensor& indices, const Tensor& dx) override;
  void avgpool2d_forward_impl(const Tensor& x, const Pool2dParams& p, const Tensor& y) override;
  void avgpool2d_backward_impl(const Tensor& dy, const Pool2dParams& p, const Tensor& dx) override;
  void global_avgpool_forward_impl(const Tensor& x, const Tensor& y) override;
  void global_avgpool_backward_impl(const Tensor& dy, const Tensor& dx) override;
  void batchnorm2d_forward_train_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean, const Tensor& running_var, const BatchNormParams& p, bool update_running, const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd) override;
  void batchnorm2d_forward_eval_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean, const Tensor& running_var, const BatchNormParams& p, const Tensor& y) override;
  void batchnorm2d_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) override;
  void layernorm_forward_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, const Tensor& y, const Tensor& mean, const Tensor& rstd) override;
  void layernorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) override;
  void embedding_forward_impl(const Tensor& ids, const Tensor& table, const Tensor& pos_table, const Tensor& y) override;
  void embedding_backward_impl(const Tensor& dy, const Tensor& ids, const Tensor& dtable, const Tensor& dpos_table) override;
  size_t attention_forward_workspace_impl(const Shape& qkv, const AttentionParams& p) override;
  void attention_forward_impl(const Tensor& qkv, const AttentionParams& p, RngState rng, const Tensor& out, const Tensor& probs, const Tensor& workspace) override;
  size_t attention_backward_workspace_impl(const Shape& qkv, const AttentionParams& p) override;
  void attention_backward_impl(const Tensor& dout, const Tensor& qkv, const Tensor& probs, const AttentionParams& p, RngState rng, const Tensor& dqkv, const Tensor& workspace) override;
  void permute_0213_impl(const Tensor& x, const Tensor& y) override;
  void sgd_step_impl(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& p, int64_t step) override;
  void adamw_step_impl(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq, const AdamWParams& p, int64_t step) override;
  double global_norm_impl(const std::vector<Tensor>& tensors) override;

 private:
  void activate() const;  // cudaSetDevice for cuda:N

  Device device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* scratch_ = nullptr;
  bool tf32_ = false;
};

REMAT_KERNELS_ABI_END
}  // namespace remat
