// Validators of layer normalisation and its workspace query (src/backends/cpu/layernorm.cpp).
#include "backends/validate/check.h"

namespace remat::validate {

void check_layernorm_forward(const Check& ck, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                             const LayerNormParams& p, const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  ck.tensor("x", x);
  ck.min_rank("x", x, 1);
  const int64_t c = x.size(-1), n = rows_of(x.shape());
  ck.tensor("gamma", gamma);
  ck.shape("gamma", gamma, Shape{c});
  ck.tensor("beta", beta);
  ck.shape("beta", beta, Shape{c});
  ck.tensor("y", y);
  ck.same_shape("x", x, "y", y);
  ck.statistics("mean", mean);
  ck.shape("mean", mean, Shape{n});
  ck.statistics("rstd", rstd);
  ck.shape("rstd", rstd, Shape{n});
  if (!(p.eps > 0.0f)) ck.fail("eps must be positive, got " + std::to_string(p.eps));
}

void check_layernorm_backward_workspace(const Check& ck, const Shape& x) {
  if (x.rank() < 1) ck.fail("x " + x.str() + " must have rank >= 1");
}

void check_layernorm_backward(const Check& ck, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                              const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                              const Tensor& dbeta, const Tensor& workspace) {
  ck.tensor("x", x);
  ck.min_rank("x", x, 1);
  const int64_t c = x.size(-1), n = rows_of(x.shape());
  ck.tensor("dy", dy);
  ck.same_shape("dy", dy, "x", x);
  ck.tensor("gamma", gamma);
  ck.shape("gamma", gamma, Shape{c});
  ck.statistics("mean", mean);
  ck.shape("mean", mean, Shape{n});
  ck.statistics("rstd", rstd);
  ck.shape("rstd", rstd, Shape{n});
  ck.optional("dx", dx, x.shape());
  ck.optional("dgamma", dgamma, Shape{c});
  ck.optional("dbeta", dbeta, Shape{c});
  if (dgamma.defined() || dbeta.defined()) ck.workspace(workspace, ck.be->layernorm_backward_workspace(x.shape()));
}

}  // namespace remat::validate
