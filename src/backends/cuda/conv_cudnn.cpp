// cuDNN's convolutions for the CUDA backend (see conv_cudnn.h).
#include "backends/cuda/conv_cudnn.h"

#if defined(REMAT_WITH_CUDNN) && !defined(REMAT_EMULATE)

#include <atomic>
#include <limits>
#include <string>
#include <utility>

#include "remat/cuda_check.h"
#include "remat/error.h"
#include "remat/log.h"

namespace remat {

namespace {

bool fits_int(int64_t v) { return v >= 0 && v <= std::numeric_limits<int>::max(); }

// Deterministic, and no arithmetic below the tensors' own precision: fp32 plans without
// tensor ops (TF32 only when the backend allows it), bf16 plans with them (bf16 inputs, fp32
// accumulation); never a conversion of the inputs to a narrower type.
template <typename Perf>
bool acceptable(const Perf& perf, bool tf32, bool bf16) {
  return perf.status == CUDNN_STATUS_SUCCESS && perf.determinism == CUDNN_DETERMINISTIC &&
         perf.mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION &&
         (bf16 || tf32 || perf.mathType != CUDNN_TENSOR_OP_MATH);
}

// The algorithm families that sum like a direct convolution (no FFT or Winograd transform).
bool direct_family(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
}
// ALGO_0 of both backward passes (and the filter's ALGO_3) accumulate with atomics.
bool direct_family(cudnnConvolutionBwdDataAlgo_t a) { return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1; }
bool direct_family(cudnnConvolutionBwdFilterAlgo_t a) { return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1; }

// The first of cuDNN's ranked candidates (perf[0, count)) that is acceptable, of the direct
// family and within the workspace cap; workspace(algo, &bytes) is cuDNN's size query.
template <typename Perf, typename Algo, typename WorkspaceQuery>
bool pick(const Perf* perf, int count, bool tf32, bool bf16, Algo* algo, size_t* bytes,
          const WorkspaceQuery& workspace) {
  for (int k = 0; k < count; ++k) {
    size_t need = 0;
    if (!acceptable(perf[k], tf32, bf16) || !direct_family(perf[k].algo)) continue;
    if (workspace(perf[k].algo, &need) != CUDNN_STATUS_SUCCESS || need > CudnnConv::kMaxConvWorkspaceBytes) continue;
    *algo = perf[k].algo;
    *bytes = need;
    return true;
  }
  return false;
}

std::string algo_str(bool ok, int algo, size_t bytes) {
  return ok ? "algorithm " + std::to_string(algo) + " (" + std::to_string(bytes) + " bytes)" : "im2col";
}

}  // namespace

CudnnConv::Plan::~Plan() {
  if (conv) cudnnDestroyConvolutionDescriptor(conv);
  if (w) cudnnDestroyFilterDescriptor(w);
  if (y) cudnnDestroyTensorDescriptor(y);
  if (x) cudnnDestroyTensorDescriptor(x);
}

CudnnConv::CudnnConv(cudaStream_t stream) {
  REMAT_CUDNN_CHECK(cudnnCreate(&handle_));
  REMAT_CUDNN_CHECK(cudnnSetStream(handle_, stream));
}

void CudnnConv::warn_fallback(const std::string& why) {
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    log().warn(
        "cuDNN cannot be used ({}): convolutions take the im2col path (remat's kernels + cuBLAS) instead; "
        "REMAT_CONV=im2col silences this",
        why);
  else
    log().debug("cuDNN cannot be used ({}): im2col", why);
}

CudnnConv* CudnnConv::of(const CudaBackend& backend) {
  // One instance per (device, stream), kept to the end of the process: its handle is never
  // destroyed, as the CUDA runtime may already be gone when static objects are. A failure
  // to make one is remembered (nullptr) and not retried.
  static std::mutex mutex;
  static auto* instances = new std::map<std::pair<int, cudaStream_t>, std::unique_ptr<CudnnConv>>();
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(backend.device().index, backend.stream());
  if (auto it = instances->find(key); it != instances->end()) return it->second.get();
  std::unique_ptr<CudnnConv> made;
  try {
    made.reset(new CudnnConv(backend.stream()));
  } catch (const Error& e) {
    warn_fallback(std::string("no cuDNN handle: ") + e.what());
  }
  return ((*instances)[key] = std::move(made)).get();
}

const CudnnConv::Plan& CudnnConv::plan(const Shape& x, const Shape& w, const Conv2dParams& p, bool tf32, bool bf16) {
  const Key key{x[0],       x[1],    x[2],    x[3],         w[0],         w[1],     w[2], w[3], p.stride_h,
                p.stride_w, p.pad_h, p.pad_w, p.dilation_h, p.dilation_w, p.groups, tf32, bf16};
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;

  auto plan = std::make_unique<Plan>();
  try {
    make_plan(*plan, x, w, p, tf32, bf16);
  } catch (const Error& e) {
    plan = std::make_unique<Plan>();  // im2col both ways; the descriptors made so far are freed
    warn_fallback("planning conv2d x " + x.str() + " w " + w.str() + ": " + e.what());
  }
  const Plan& pl = *plan;
  log().debug("conv2d x {} w {}{}: cuDNN forward {}, backward data {}, filter {}", x.str(), w.str(),
              bf16 ? " (bf16)" : "", algo_str(pl.forward_ok, pl.fwd_algo, pl.fwd_bytes),
              algo_str(pl.data_ok, pl.data_algo, pl.data_bytes),
              algo_str(pl.filter_ok, pl.filter_algo, pl.filter_bytes));
  return *(plans_[key] = std::move(plan));
}

void CudnnConv::make_plan(Plan& pl, const Shape& x, const Shape& w, const Conv2dParams& p, bool tf32, bool bf16) {
  const Shape y = conv2d_output_shape(x, w, p);
  // cuDNN's legacy API indexes with 32-bit ints: every dimension and every element count.
  bool dims_ok = true;
  for (const Shape* s : {&x, &w, &y}) {
    for (int d = 0; d < 4; ++d) dims_ok = dims_ok && fits_int((*s)[d]);
    dims_ok = dims_ok && fits_int(s->numel());
  }
  if (!dims_ok) {
    warn_fallback("conv2d x " + x.str() + " w " + w.str() + " has a tensor of 2^31 elements or more");
    return;
  }
  {
    REMAT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&pl.x));
    REMAT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&pl.y));
    REMAT_CUDNN_CHECK(cudnnCreateFilterDescriptor(&pl.w));
    REMAT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&pl.conv));
    auto i = [](int64_t v) { return static_cast<int>(v); };
    const cudnnDataType_t dt = bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;  // compute: fp32 either way
    REMAT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(pl.x, CUDNN_TENSOR_NCHW, dt, i(x[0]), i(x[1]), i(x[2]), i(x[3])));
    REMAT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(pl.y, CUDNN_TENSOR_NCHW, dt, i(y[0]), i(y[1]), i(y[2]), i(y[3])));
    REMAT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(pl.w, dt, CUDNN_TENSOR_NCHW, i(w[0]), i(w[1]), i(w[2]), i(w[3])));
    REMAT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(pl.conv, p.pad_h, p.pad_w, p.stride_h, p.stride_w, p.dilation_h,
                                                      p.dilation_w, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    REMAT_CUDNN_CHECK(cudnnSetConvolutionGroupCount(pl.conv, p.groups));
    REMAT_CUDNN_CHECK(cudnnSetConvolutionMathType(
        pl.conv, bf16 ? CUDNN_TENSOR_OP_MATH : (tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH)));
    int on = 0, oc = 0, oh = 0, ow = 0;  // cuDNN's idea of y must be ours
    REMAT_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(pl.conv, pl.x, pl.w, &on, &oc, &oh, &ow));
    const Shape cudnn_y{on, oc, oh, ow};
    REMAT_CHECK(cudnn_y == y, "conv2d: cuDNN's output ", cudnn_y.str(), " differs from ", y.str());

    // A heuristic that fails (a sub-library that does not load, a shape it does not take)
    // leaves its direction to im2col, with the warning.
    auto heuristic = [&](cudnnStatus_t st, const char* what) {
      if (st == CUDNN_STATUS_SUCCESS) return true;
      warn_fallback(std::string(what) + " heuristic for conv2d x " + x.str() + " w " + w.str() + ": " +
                    cudnnGetErrorString(st));
      return false;
    };
    int returned = 0;
    cudnnConvolutionFwdAlgoPerf_t fwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    if (heuristic(cudnnGetConvolutionForwardAlgorithm_v7(handle_, pl.x, pl.w, pl.conv, pl.y,
                                                         CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, fwd),
                  "forward"))
      pl.forward_ok = pick(fwd, returned, tf32, bf16, &pl.fwd_algo, &pl.fwd_bytes, [&](auto algo, size_t* bytes) {
        return cudnnGetConvolutionForwardWorkspaceSize(handle_, pl.x, pl.w, pl.conv, pl.y, algo, bytes);
      });
    cudnnConvolutionBwdDataAlgoPerf_t data[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    if (heuristic(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle_, pl.w, pl.y, pl.conv, pl.x,
                                                              CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned, data),
                  "backward data"))
      pl.data_ok = pick(data, returned, tf32, bf16, &pl.data_algo, &pl.data_bytes, [&](auto algo, size_t* bytes) {
        return cudnnGetConvolutionBackwardDataWorkspaceSize(handle_, pl.w, pl.y, pl.conv, pl.x, algo, bytes);
      });
    cudnnConvolutionBwdFilterAlgoPerf_t filter[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    if (!bf16 &&
        heuristic(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                      handle_, pl.x, pl.y, pl.conv, pl.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned, filter),
                  "backward filter"))
      pl.filter_ok =
          pick(filter, returned, tf32, bf16, &pl.filter_algo, &pl.filter_bytes, [&](auto algo, size_t* bytes) {
            return cudnnGetConvolutionBackwardFilterWorkspaceSize(handle_, pl.x, pl.y, pl.conv, pl.w, algo, bytes);
          });
    if (!pl.data_ok) pl.data_bytes = 0;
    if (!pl.filter_ok) pl.filter_bytes = 0;
    pl.backward_ok = pl.data_ok && pl.filter_ok;
  }
}

void CudnnConv::forward(const Plan& pl, const void* x, const void* w, float beta, void* y, void* workspace) {
  const float one = 1.0f;
  REMAT_CUDNN_CHECK(cudnnConvolutionForward(handle_, &one, pl.x, x, pl.w, w, pl.conv, pl.fwd_algo, workspace,
                                            pl.fwd_bytes, &beta, pl.y, y));
}

void CudnnConv::backward_data(const Plan& pl, const void* w, const void* dy, void* dx, void* workspace) {
  const float one = 1.0f, zero = 0.0f;
  REMAT_CUDNN_CHECK(cudnnConvolutionBackwardData(handle_, &one, pl.w, w, pl.y, dy, pl.conv, pl.data_algo, workspace,
                                                 pl.data_bytes, &zero, pl.x, dx));
}

void CudnnConv::backward_filter(const Plan& pl, const void* x, const void* dy, float* dw, void* workspace) {
  const float one = 1.0f;  // beta = 1: accumulate into dw
  REMAT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(handle_, &one, pl.x, x, pl.y, dy, pl.conv, pl.filter_algo, workspace,
                                                   pl.filter_bytes, &one, pl.w, dw));
}

}  // namespace remat

#endif
