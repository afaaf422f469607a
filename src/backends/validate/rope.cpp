// Validators of rotary position embeddings (src/backends/cpu/rope.cpp).
#include <string>

#include "backends/validate/check.h"

namespace remat::validate {

namespace {

void check_rope(const Check& ck, const char* in_name, const Tensor& x, const RopeParams& p, const char* out_name,
                const Tensor& y) {
  ck.tensor(in_name, x);
  ck.rank(in_name, x, 3);
  ck.tensor(out_name, y);
  ck.same_shape(in_name, x, out_name, y);
  if (p.heads < 1 || p.rotated < 0 || p.rotated > p.heads)
    ck.fail("heads " + std::to_string(p.heads) + " and rotated " + std::to_string(p.rotated) +
            ": expected 0 <= rotated <= heads, heads >= 1");
  if (!(p.theta > 0.0)) ck.fail("theta must be positive, got " + std::to_string(p.theta));
  const RopeScaling& s = p.scaling;
  if (s.type != RopeScalingType::none && !(s.factor > 0.0))
    ck.fail("scaling factor must be positive, got " + std::to_string(s.factor));
  if (s.type == RopeScalingType::llama3 &&
      !(s.low_freq_factor > 0.0 && s.high_freq_factor > s.low_freq_factor && s.original_max_position > 0.0))
    ck.fail("llama3 scaling needs 0 < low_freq_factor < high_freq_factor and original_max_position > 0, got " +
            std::to_string(s.low_freq_factor) + ", " + std::to_string(s.high_freq_factor) + ", " +
            std::to_string(s.original_max_position));
  const int64_t c = x.size(-1);
  if (c % p.heads != 0 || (c / p.heads) % 2 != 0)
    ck.fail(std::string(in_name) + "'s last size " + std::to_string(c) + " is not " + std::to_string(p.heads) +
            " heads of an even size");
}

}  // namespace

void check_rope_forward(const Check& ck, const Tensor& x, const RopeParams& p, const Tensor& y) {
  check_rope(ck, "x", x, p, "y", y);
}

void check_rope_backward(const Check& ck, const Tensor& dy, const RopeParams& p, const Tensor& dx) {
  check_rope(ck, "dy", dy, p, "dx", dx);
}

}  // namespace remat::validate
