// Validators of 2-D batch normalisation (src/backends/cpu/batchnorm.cpp).
#include <initializer_list>
#include <utility>

#include "backends/validate/check.h"

namespace remat::validate {

namespace {

// Per-channel tensors of x: parameters (gamma, beta: bf16 working copies under bf16) and
// statistics (save_mean, save_invstd, running_mean, running_var: f32 always).
void check_bn_params(const Check& ck, const Tensor& x,
                     std::initializer_list<std::pair<const char*, const Tensor*>> ps) {
  ck.tensor("x", x);
  ck.rank("x", x, 4);
  for (auto& [name, t] : ps) {
    const std::string_view n(name);
    if (n == "gamma" || n == "beta")
      ck.tensor(name, *t);
    else
      ck.statistics(name, *t);
    ck.shape(name, *t, Shape{x.size(1)});
  }
}

}  // namespace

void check_batchnorm2d_forward_train(const Check& ck, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                     const Tensor& running_mean, const Tensor& running_var,
                                     const BatchNormParams& /*p*/, bool update_running, const Tensor& y,
                                     const Tensor& save_mean, const Tensor& save_invstd) {
  check_bn_params(ck, x,
                  {{"gamma", &gamma}, {"beta", &beta}, {"save_mean", &save_mean}, {"save_invstd", &save_invstd}});
  if (update_running) check_bn_params(ck, x, {{"running_mean", &running_mean}, {"running_var", &running_var}});
  ck.tensor("y", y);
  ck.same_shape("x", x, "y", y);
  if (x.size(0) * x.size(2) * x.size(3) < 2 && update_running)
    ck.fail("x " + x.str() + ": batch statistics need more than one value per channel");
}

void check_batchnorm2d_forward_eval(const Check& ck, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                    const Tensor& running_mean, const Tensor& running_var, const BatchNormParams& /*p*/,
                                    const Tensor& y) {
  check_bn_params(ck, x,
                  {{"gamma", &gamma}, {"beta", &beta}, {"running_mean", &running_mean}, {"running_var", &running_var}});
  ck.tensor("y", y);
  ck.same_shape("x", x, "y", y);
}

void check_batchnorm2d_backward(const Check& ck, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                const Tensor& save_mean, const Tensor& save_invstd, const Tensor& dx,
                                const Tensor& dgamma, const Tensor& dbeta) {
  check_bn_params(ck, x, {{"gamma", &gamma}, {"save_mean", &save_mean}, {"save_invstd", &save_invstd}});
  ck.tensor("dy", dy);
  ck.same_shape("dy", dy, "x", x);
  ck.optional("dx", dx, x.shape());
  ck.optional("dgamma", dgamma, Shape{x.size(1)});
  ck.optional("dbeta", dbeta, Shape{x.size(1)});
}

}  // namespace remat::validate
