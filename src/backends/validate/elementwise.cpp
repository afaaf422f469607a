// Validators of the elementwise ops: add, accumulate, scale, cast_multi, ReLU, GELU, SiLU, mul,
// dropout
// (src/backends/cpu/elementwise.cpp).
#include <string>
#include <utility>
#include <vector>

#include "backends/validate/check.h"

namespace remat::validate {

void check_add(const Check& ck, const Tensor& a, const Tensor& b, const Tensor& y) {
  ck.tensor("a", a);
  ck.tensor("b", b);
  ck.tensor("y", y);
  ck.same_shape("a", a, "b", b);
  ck.same_shape("a", a, "y", y);
}

void check_accumulate(const Check& ck, const Tensor& dst, const Tensor& src) {
  ck.tensor("dst", dst);
  ck.tensor("src", src);
  if (dst.numel() != src.numel()) ck.same_shape("dst", dst, "src", src);
}

void check_scale(const Check& ck, const Tensor& x, float /*alpha*/, const Tensor& y) {
  ck.tensor("x", x);
  ck.tensor("y", y);
  ck.same_shape("x", x, "y", y);
}

void check_relu_forward(const Check& ck, const Tensor& x, const Tensor& y) {
  ck.tensor("x", x);
  ck.tensor("y", y);
  ck.same_shape("x", x, "y", y);
}

void check_relu_backward(const Check& ck, const Tensor& dy, const Tensor& x, const Tensor& dx) {
  ck.tensor("dy", dy);
  ck.tensor("x", x);
  ck.tensor("dx", dx);
  ck.same_shape("dy", dy, "x", x);
  ck.same_shape("dx", dx, "x", x);
}

void check_gelu_forward(const Check& ck, const Tensor& x, GeluApprox /*approx*/, const Tensor& y) {
  ck.tensor("x", x);
  ck.tensor("y", y);
  ck.same_shape("x", x, "y", y);
}

void check_gelu_backward(const Check& ck, const Tensor& dy, const Tensor& x, GeluApprox /*approx*/, const Tensor& dx) {
  ck.tensor("dy", dy);
  ck.tensor("x", x);
  ck.tensor("dx", dx);
  ck.same_shape("dy", dy, "x", x);
  ck.same_shape("dx", dx, "x", x);
}

void check_silu_forward(const Check& ck, const Tensor& x, const Tensor& y) {
  ck.tensor("x", x);
  ck.tensor("y", y);
  ck.same_shape("x", x, "y", y);
}

void check_silu_backward(const Check& ck, const Tensor& dy, const Tensor& x, const Tensor& dx) {
  ck.tensor("dy", dy);
  ck.tensor("x", x);
  ck.tensor("dx", dx);
  ck.same_shape("dy", dy, "x", x);
  ck.same_shape("dx", dx, "x", x);
}

void check_mul_forward(const Check& ck, const Tensor& a, const Tensor& b, const Tensor& y) {
  ck.tensor("a", a);
  ck.tensor("b", b);
  ck.tensor("y", y);
  ck.same_shape("a", a, "b", b);
  ck.same_shape("a", a, "y", y);
}

void check_mul_backward(const Check& ck, const Tensor& dy, const Tensor& a, const Tensor& b, const Tensor& da,
                        const Tensor& db) {
  ck.tensor("dy", dy);
  ck.tensor("a", a);
  ck.tensor("b", b);
  ck.same_shape("a", a, "b", b);
  ck.same_shape("dy", dy, "a", a);
  ck.optional("da", da, a.shape());
  ck.optional("db", db, a.shape());
  // da is written before db reads dy and a (each backend runs them as two passes).
  for (const auto& [name, g] : {std::pair<const char*, const Tensor*>{"da", &da}, {"db", &db}}) {
    if (!g->defined()) continue;
    if (g->shares_storage(dy) || g->shares_storage(a) || g->shares_storage(b))
      ck.fail(std::string(name) + " " + g->str() + " must not share storage with dy, a or b");
  }
  if (da.defined() && db.defined() && da.shares_storage(db)) ck.fail("da and db must not share storage");
}

void check_dropout_forward(const Check& ck, const Tensor& x, float p, RngState /*rng*/, const Tensor& y) {
  ck.tensor("x", x);
  ck.tensor("y", y);
  ck.same_shape("x", x, "y", y);
  ck.probability("p", p);
}

void check_dropout_backward(const Check& ck, const Tensor& dy, float p, RngState /*rng*/, const Tensor& dx) {
  ck.tensor("dy", dy);
  ck.tensor("dx", dx);
  ck.same_shape("dy", dy, "dx", dx);
  ck.probability("p", p);
}

void check_cast_multi(const Check& ck, const std::vector<Tensor>& src, const std::vector<Tensor>& dst) {
  if (src.size() != dst.size())
    ck.fail(std::to_string(src.size()) + " sources but " + std::to_string(dst.size()) + " destinations");
  for (size_t i = 0; i < src.size(); ++i) {
    // Any float dtype on either side, whatever activation_dtype() says: converting is the op.
    for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"src", &src[i]}, {"dst", &dst[i]}}) {
      if (!t->defined()) ck.fail(std::string(name) + " " + std::to_string(i) + " is undefined");
      if (t->dtype() != DType::f32 && t->dtype() != DType::bf16)
        ck.fail(std::string(name) + " " + std::to_string(i) + " " + t->str() + ": expected dtype f32 or bf16");
      if (t->device() != ck.device)
        ck.fail(std::string(name) + " " + std::to_string(i) + " " + t->str() + ": expected a tensor on " +
                ck.device.str());
    }
    if (src[i].shape() != dst[i].shape())
      ck.fail("src " + std::to_string(i) + " " + src[i].str() + " and dst " + dst[i].str() +
              " must have the same shape");
    if (src[i].shares_storage(dst[i]))
      ck.fail("src " + std::to_string(i) + " " + src[i].str() + " and dst " + dst[i].str() + " must not share storage");
  }
}

}  // namespace remat::validate
