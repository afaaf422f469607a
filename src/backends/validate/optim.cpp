// Validators of the optimizer steps, the global norm and gradient clipping
// (src/backends/cpu/optim.cpp).
#include <vector>

#include "backends/validate/check.h"

namespace remat::validate {

void check_sgd_step(const Check& ck, const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                    const SgdParams& p, int64_t step) {
  ck.tensor("param", param);
  ck.tensor("grad", grad);
  ck.same_shape("param", param, "grad", grad);
  if (p.momentum != 0.0) {
    ck.tensor("momentum_buf", momentum_buf);
    ck.same_shape("param", param, "momentum_buf", momentum_buf);
  }
  if (step < 1) ck.fail("step counts from 1, got " + std::to_string(step));
  if (p.nesterov && (p.momentum <= 0.0 || p.dampening != 0.0))
    ck.fail("Nesterov momentum requires a momentum and zero dampening");
}

void check_sgd_step_multi(const Check& ck, const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                          const std::vector<Tensor>& momentum_bufs, const std::vector<SgdParams>& p, int64_t step) {
  const size_t n = params.size();
  if (grads.size() != n || momentum_bufs.size() != n || p.size() != n)
    ck.fail(std::to_string(n) + " params but " + std::to_string(grads.size()) + " grads, " +
            std::to_string(momentum_bufs.size()) + " momentum_bufs and " + std::to_string(p.size()) +
            " hyperparameter sets");
  for (size_t i = 0; i < n; ++i) check_sgd_step(ck, params[i], grads[i], momentum_bufs[i], p[i], step);
  if (step < 1) ck.fail("step counts from 1, got " + std::to_string(step));
}

void check_adamw_step(const Check& ck, const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                      const Tensor& exp_avg_sq, const AdamWParams& p, int64_t step) {
  ck.tensor("param", param);
  ck.tensor("grad", grad);
  ck.tensor("exp_avg", exp_avg);
  ck.tensor("exp_avg_sq", exp_avg_sq);
  ck.same_shape("param", param, "grad", grad);
  ck.same_shape("param", param, "exp_avg", exp_avg);
  ck.same_shape("param", param, "exp_avg_sq", exp_avg_sq);
  if (step < 1) ck.fail("step counts from 1, got " + std::to_string(step));
  if (!(p.beta1 >= 0.0 && p.beta1 < 1.0 && p.beta2 >= 0.0 && p.beta2 < 1.0)) ck.fail("betas must be in [0, 1)");
}

void check_adamw_step_multi(const Check& ck, const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                            const std::vector<Tensor>& exp_avgs, const std::vector<Tensor>& exp_avg_sqs,
                            const std::vector<AdamWParams>& p, int64_t step) {
  const size_t n = params.size();
  if (grads.size() != n || exp_avgs.size() != n || exp_avg_sqs.size() != n || p.size() != n)
    ck.fail(std::to_string(n) + " params but " + std::to_string(grads.size()) + " grads, " +
            std::to_string(exp_avgs.size()) + " exp_avgs, " + std::to_string(exp_avg_sqs.size()) + " exp_avg_sqs and " +
            std::to_string(p.size()) + " hyperparameter sets");
  for (size_t i = 0; i < n; ++i) check_adamw_step(ck, params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], p[i], step);
  if (step < 1) ck.fail("step counts from 1, got " + std::to_string(step));
}

void check_global_norm(const Check& ck, const std::vector<Tensor>& tensors) {
  for (const auto& t : tensors) ck.tensor("tensor", t);
}

void check_clip_grad_norm(const Check& ck, const std::vector<Tensor>& tensors, double max_norm) {
  for (const auto& t : tensors) ck.tensor("tensor", t);
  if (!(max_norm > 0.0)) ck.fail("max_norm must be positive, got " + std::to_string(max_norm));
}

}  // namespace remat::validate
