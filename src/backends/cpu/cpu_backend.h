// The CPU backend: the reference every other backend is tested against (fp32, OpenBLAS
// for GEMM, OpenMP for the rest). Results are bitwise reproducible for a given thread
// count: no reduction order depends on scheduling.
//
// One file per op family: gemm.cpp (gemm, linear), elementwise.cpp, softmax_loss.cpp,
// conv.cpp, pool.cpp, batchnorm.cpp, layernorm.cpp, embedding.cpp, attention.cpp,
// optim.cpp.
#pragma once

#include "remat/backend.h"

namespace remat {

class CpuBackend : public Backend {
 public:
  Device device() const override { return Device::cpu(); }
  std::string name() const override { return "cpu"; }

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
};

}  // namespace remat
