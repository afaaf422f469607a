// cuDNN's convolutions for the CUDA backend's conv2d (conv.cpp), through cuDNN's legacy
// convolution API (cudnn_cnn, still part of cuDNN 9).
//
// Only deterministic algorithms, and only those that compute like a direct convolution
// (the implicit/explicit GEMM and direct families; FFT and Winograd transforms are left
// out for their larger fp32 error), in FMA math unless the backend runs TF32. Among those,
// the first in cuDNN's heuristic ranking (cudnnGetConvolution*Algorithm_v7: no benchmark,
// so nothing is allocated and the choice depends only on the shapes and the GPU) whose
// workspace is at most kMaxConvWorkspaceBytes. A shape with no such algorithm in a
// direction falls back to the im2col path there (plan.forward_ok / backward_ok).
//
// bf16 plans (training.precision bf16): x, y and w described as CUDNN_DATA_BFLOAT16 with
// fp32 compute (cuDNN's PSEUDO_BFLOAT16 configuration), tensor-op math (the inputs are bf16
// already: no conversion is allowed), the same deterministic direct-family algorithms, for
// forward and the data gradient. No filter gradient (filter_ok false): cuDNN writes dw in
// the filters' dtype, bf16, and remat's parameter gradients are f32 (im2col computes it).
//
// Planning never fails: when cuDNN cannot be used for a shape (a missing or mismatched
// cuDNN 9 sub-library, a handle that cannot be made, a tensor of 2^31 elements or more, any
// error of a descriptor or heuristic call) the plan says im2col in both directions and the
// first such fallback of the process is logged as one warning naming the cause (later ones
// at debug level). Errors of the convolution calls themselves stay errors.
#pragma once

#if defined(REMAT_WITH_CUDNN) && !defined(REMAT_EMULATE)

#include <cudnn.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "backends/cuda/cuda_backend.h"

namespace remat {

class CudnnConv {
 public:
  static constexpr size_t kMaxConvWorkspaceBytes = size_t{32} << 20;

  // Descriptors and algorithms of one convolution shape.
  struct Plan {
    cudnnTensorDescriptor_t x = nullptr, y = nullptr;
    cudnnFilterDescriptor_t w = nullptr;
    cudnnConvolutionDescriptor_t conv = nullptr;
    bool forward_ok = false, data_ok = false, filter_ok = false;
    bool backward_ok = false;  // data_ok && filter_ok
    cudnnConvolutionFwdAlgo_t fwd_algo{};
    cudnnConvolutionBwdDataAlgo_t data_algo{};
    cudnnConvolutionBwdFilterAlgo_t filter_algo{};
    size_t fwd_bytes = 0, data_bytes = 0, filter_bytes = 0;

    Plan() = default;
    Plan(const Plan&) = delete;
    Plan& operator=(const Plan&) = delete;
    ~Plan();
    size_t bwd_bytes() const { return data_bytes > filter_bytes ? data_bytes : filter_bytes; }
  };

  // The instance of `backend` (created on first use, on the current device, which must be
  // the backend's: call from a CudaBackend op, which entered the device); nullptr when no
  // cuDNN handle can be made (warned about once: the callers take the im2col path).
  static CudnnConv* of(const CudaBackend& backend);

  // The plan for a non-empty convolution (cached per shape; TF32 or FMA math; bf16 tensors).
  const Plan& plan(const Shape& x, const Shape& w, const Conv2dParams& p, bool tf32, bool bf16);

  // Logs why cuDNN is not used: a warning the first time in the process, then debug.
  static void warn_fallback(const std::string& why);

  // y = conv(x, w) + beta * y (f32 arrays, or bf16 ones for a bf16 plan).
  void forward(const Plan& plan, const void* x, const void* w, float beta, void* y, void* workspace);
  // dx = the gradient of the input.
  void backward_data(const Plan& plan, const void* w, const void* dy, void* dx, void* workspace);
  // dw += the gradient of the filters (an fp32 plan).
  void backward_filter(const Plan& plan, const void* x, const void* dy, float* dw, void* workspace);

  CudnnConv(const CudnnConv&) = delete;
  CudnnConv& operator=(const CudnnConv&) = delete;

 private:
  explicit CudnnConv(cudaStream_t stream);
  // Fills `pl` (throws remat::Error on a cuDNN error; plan() turns that into im2col).
  void make_plan(Plan& pl, const Shape& x, const Shape& w, const Conv2dParams& p, bool tf32, bool bf16);

  using Key = std::array<int64_t, 17>;
  cudnnHandle_t handle_ = nullptr;
  std::mutex mutex_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace remat

#endif
