// Validators of softmax, cross-entropy and accuracy (src/backends/cpu/softmax_loss.cpp).
#include "backends/validate/check.h"

namespace remat::validate {

void check_softmax_forward(const Check& base, const Tensor& x, bool log, const Tensor& y) {
  const Check ck{log ? "log_softmax_forward" : "softmax_forward", base.device, base.be};
  ck.tensor("x", x);
  ck.tensor("y", y);
  ck.min_rank("x", x, 1);
  ck.same_shape("x", x, "y", y);
}

void check_softmax_backward(const Check& base, const Tensor& dy, const Tensor& y, bool log, const Tensor& dx) {
  const Check ck{log ? "log_softmax_backward" : "softmax_backward", base.device, base.be};
  ck.tensor("dy", dy);
  ck.tensor("y", y);
  ck.tensor("dx", dx);
  ck.min_rank("y", y, 1);
  ck.same_shape("dy", dy, "y", y);
  ck.same_shape("dx", dx, "y", y);
}

namespace {
void check_smoothing(const Check& ck, float smoothing) {
  if (!(smoothing >= 0.0f && smoothing < 1.0f))
    ck.fail("label smoothing must be in [0, 1), got " + std::to_string(smoothing));
}
}  // namespace

void check_cross_entropy_forward_workspace(const Check& ck, const Shape& logits, float smoothing) {
  if (logits.rank() != 2) ck.fail("logits " + logits.str() + " must have rank 2");
  check_smoothing(ck, smoothing);
}

void check_cross_entropy_forward(const Check& ck, const Tensor& logits, const Tensor& targets, int /*ignore_index*/,
                                 float smoothing, const Tensor& loss, const Tensor& lse, const Tensor& workspace) {
  check_smoothing(ck, smoothing);
  ck.tensor("logits", logits);
  ck.tensor("targets", targets, DType::i32);
  ck.rank("logits", logits, 2);
  ck.shape("targets", targets, Shape{logits.size(0)});
  ck.statistics("loss", loss);
  ck.shape("loss", loss, Shape{1});
  ck.statistics("lse", lse);
  ck.shape("lse", lse, Shape{logits.size(0)});
  ck.workspace(workspace, ck.be->cross_entropy_forward_workspace(logits.shape(), smoothing));
}

void check_cross_entropy_backward(const Check& ck, float /*dloss*/, const Tensor& logits, const Tensor& targets,
                                  const Tensor& lse, int /*ignore_index*/, float smoothing, const Tensor& dlogits) {
  check_smoothing(ck, smoothing);
  ck.tensor("logits", logits);
  ck.tensor("targets", targets, DType::i32);
  ck.rank("logits", logits, 2);
  ck.shape("targets", targets, Shape{logits.size(0)});
  ck.statistics("lse", lse);
  ck.shape("lse", lse, Shape{logits.size(0)});
  ck.tensor("dlogits", dlogits);
  ck.same_shape("dlogits", dlogits, "logits", logits);
}

void check_accuracy(const Check& ck, const Tensor& logits, const Tensor& targets, int /*ignore_index*/,
                    int64_t* /*counted*/) {
  ck.tensor("logits", logits);
  ck.tensor("targets", targets, DType::i32);
  ck.rank("logits", logits, 2);
  ck.shape("targets", targets, Shape{logits.size(0)});
}

}  // namespace remat::validate
