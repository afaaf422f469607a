// The meta backend: shapes and allocations only. Every op is validated like on the CPU
// and does nothing; the workspace queries are the CPU backend's, so a plan profiled on
// meta holds exactly what it holds on cpu, or those of a given backend (the workspace
// model: cuda's, to predict a GPU step). Results (accuracy, norms) are zero.
#include "backends/cpu/cpu_backend.h"

namespace remat {

namespace {

class MetaBackend final : public CpuBackend {
 public:
  explicit MetaBackend(Backend* workspace_model) : ws_(workspace_model) {}
  Device device() const override { return Device::meta(); }
  std::string name() const override { return "meta"; }

 protected:
  size_t conv2d_forward_workspace_impl(const Shape& x, const Shape& w, const Conv2dParams& p) override {
    return ws_ ? ws_->conv2d_forward_workspace(x, w, p) : CpuBackend::conv2d_forward_workspace_impl(x, w, p);
  }
  size_t conv2d_backward_workspace_impl(const Shape& x, const Shape& w, const Conv2dParams& p) override {
    return ws_ ? ws_->conv2d_backward_workspace(x, w, p) : CpuBackend::conv2d_backward_workspace_impl(x, w, p);
  }
  size_t attention_forward_workspace_impl(const Shape& qkv, const AttentionParams& p) override {
    return ws_ ? ws_->attention_forward_workspace(qkv, p) : CpuBackend::attention_forward_workspace_impl(qkv, p);
  }
  size_t attention_backward_workspace_impl(const Shape& qkv, const AttentionParams& p) override {
    return ws_ ? ws_->attention_backward_workspace(qkv, p) : CpuBackend::attention_backward_workspace_impl(qkv, p);
  }
  void gemm_impl(const Tensor&, const Tensor&, const Tensor&, const GemmParams&) override {}
  void linear_forward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void linear_backward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void add_impl(const Tensor&, const Tensor&, const Tensor&) override {}
  void accumulate_impl(const Tensor&, const Tensor&) override {}
  void scale_impl(const Tensor&, float, const Tensor&) override {}
  void relu_forward_impl(const Tensor&, const Tensor&) override {}
  void relu_backward_impl(const Tensor&, const Tensor&, const Tensor&) override {}
  void gelu_forward_impl(const Tensor&, GeluApprox, const Tensor&) override {}
  void gelu_backward_impl(const Tensor&, const Tensor&, GeluApprox, const Tensor&) override {}
  void dropout_forward_impl(const Tensor&, float, RngState, const Tensor&) override {}
  void dropout_backward_impl(const Tensor&, float, RngState, const Tensor&) override {}
  void softmax_forward_impl(const Tensor&, bool, const Tensor&) override {}
  void softmax_backward_impl(const Tensor&, const Tensor&, bool, const Tensor&) override {}
  void cross_entropy_forward_impl(const Tensor&, const Tensor&, int, const Tensor&, const Tensor&) override {}
  void cross_entropy_backward_impl(float, const Tensor&, const Tensor&, const Tensor&, int, const Tensor&) override {}
  int64_t accuracy_impl(const Tensor&, const Tensor&, int, int64_t* counted) override {
    if (counted) *counted = 0;
    return 0;
  }
  void conv2d_forward_impl(const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&, const Tensor&, const Tensor&) override {}
  void conv2d_backward_impl(const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void maxpool2d_forward_impl(const Tensor&, const Pool2dParams&, const Tensor&, const Tensor&) override {}
  void maxpool2d_backward_impl(const Tensor&, const Tensor&, const Tensor&) override {}
  void avgpool2d_forward_impl(const Tensor&, const Pool2dParams&, const Tensor&) override {}
  void avgpool2d_backward_impl(const Tensor&, const Pool2dParams&, const Tensor&) override {}
  void global_avgpool_forward_impl(const Tensor&, const Tensor&) override {}
  void global_avgpool_backward_impl(const Tensor&, const Tensor&) override {}
  void batchnorm2d_forward_train_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const BatchNormParams&, bool, const Tensor&, const Tensor&, const Tensor&) override {}
  void batchnorm2d_forward_eval_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const BatchNormParams&, const Tensor&) override {}
  void batchnorm2d_backward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void layernorm_forward_impl(const Tensor&, const Tensor&, const Tensor&, float, const Tensor&, const Tensor&, const Tensor&) override {}
  void layernorm_backward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void embedding_forward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void embedding_backward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void attention_forward_impl(const Tensor&, const AttentionParams&, RngState, const Tensor&, const Tensor&, const Tensor&) override {}
  void attention_backward_impl(const Tensor&, const Tensor&, const Tensor&, const AttentionParams&, RngState, const Tensor&, const Tensor&) override {}
  void permute_0213_impl(const Tensor&, const Tensor&) override {}
  void sgd_step_impl(const Tensor&, const Tensor&, const Tensor&, const SgdParams&, int64_t) override {}
  void adamw_step_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AdamWParams&, int64_t) override {}
  double global_norm_impl(const std::vector<Tensor>&) override { return 0.0; }

 private:
  Backend* ws_;  // answers the workspace queries when set
};

}  // namespace

std::unique_ptr<Backend> make_meta_backend(Backend* workspace_model) {
  return std::make_unique<MetaBackend>(workspace_model);
}

}  // namespace remat
