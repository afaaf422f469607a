// Validators of the GEMM and linear ops (src/backends/cpu/gemm.cpp).
#include "backends/validate/check.h"

namespace remat::validate {

void check_gemm(const Check& ck, const Tensor& a, const Tensor& b, const Tensor& c, const GemmParams& p) {
  ck.tensor("a", a);
  ck.tensor("b", b);
  ck.tensor("c", c);
  ck.min_rank("a", a, 2);
  ck.min_rank("b", b, 2);
  ck.min_rank("c", c, 2);
  const int64_t m = p.trans_a ? a.size(-1) : a.size(-2), k = p.trans_a ? a.size(-2) : a.size(-1);
  const int64_t kb = p.trans_b ? b.size(-1) : b.size(-2), n = p.trans_b ? b.size(-2) : b.size(-1);
  if (k != kb)
    ck.fail("a " + a.str() + " and b " + b.str() + ": inner dimensions differ (" + std::to_string(k) + " vs " +
            std::to_string(kb) + ")");
  if (c.size(-2) != m || c.size(-1) != n)
    ck.fail("c " + c.str() + ": expected [..., " + std::to_string(m) + ", " + std::to_string(n) + "]");
  const int64_t batch = a.numel() / std::max<int64_t>(m * k, 1);
  if (c.numel() / std::max<int64_t>(m * n, 1) != batch ||
      (b.rank() > 2 && b.numel() / std::max<int64_t>(k * n, 1) != batch))
    ck.fail("batch dimensions of a " + a.str() + ", b " + b.str() + " and c " + c.str() + " differ");
}

void check_linear_forward(const Check& ck, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  ck.tensor("x", x);
  ck.tensor("w", w);
  ck.tensor("y", y);
  ck.rank("w", w, 2);
  ck.min_rank("x", x, 1);
  if (x.size(-1) != w.size(1))
    ck.fail("x " + x.str() + " and w " + w.str() + ": in_features differ (" + std::to_string(x.size(-1)) + " vs " +
            std::to_string(w.size(1)) + ")");
  ck.shape("y", y, with_last(x.shape(), w.size(0)));
  ck.optional("b", b, Shape{w.size(0)});
}

void check_linear_backward(const Check& ck, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx,
                           const Tensor& dw, const Tensor& db) {
  ck.tensor("dy", dy);
  ck.tensor("x", x);
  ck.tensor("w", w);
  ck.rank("w", w, 2);
  ck.min_rank("x", x, 1);
  if (x.size(-1) != w.size(1)) ck.fail("x " + x.str() + " and w " + w.str() + ": in_features differ");
  ck.shape("dy", dy, with_last(x.shape(), w.size(0)));
  ck.optional("dx", dx, x.shape());
  ck.optional("dw", dw, w.shape());
  ck.optional("db", db, Shape{w.size(0)});
}

}  // namespace remat::validate
