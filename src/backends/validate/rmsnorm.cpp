// Validators of RMS normalisation (src/backends/cpu/rmsnorm.cpp).
#include "backends/validate/check.h"

namespace remat::validate {

void check_rmsnorm_forward(const Check& ck, const Tensor& x, const Tensor& gamma, const RmsNormParams& p,
                           const Tensor& y, const Tensor& rstd) {
  ck.tensor("x", x);
  ck.min_rank("x", x, 1);
  ck.tensor("gamma", gamma);
  ck.shape("gamma", gamma, Shape{x.size(-1)});
  ck.tensor("y", y);
  ck.same_shape("x", x, "y", y);
  ck.statistics("rstd", rstd);
  ck.shape("rstd", rstd, Shape{rows_of(x.shape())});
  if (!(p.eps > 0.0f)) ck.fail("eps must be positive, got " + std::to_string(p.eps));
}

void check_rmsnorm_backward(const Check& ck, const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                            const Tensor& dx, const Tensor& dgamma) {
  ck.tensor("x", x);
  ck.min_rank("x", x, 1);
  ck.tensor("dy", dy);
  ck.same_shape("dy", dy, "x", x);
  ck.tensor("gamma", gamma);
  ck.shape("gamma", gamma, Shape{x.size(-1)});
  ck.statistics("rstd", rstd);
  ck.shape("rstd", rstd, Shape{rows_of(x.shape())});
  ck.optional("dx", dx, x.shape());
  ck.optional("dgamma", dgamma, Shape{x.size(-1)});
}

}  // namespace remat::validate
