#include "support/gradcheck.h"

#include <cmath>

namespace remat::test {

::testing::AssertionResult check_gradient(const std::string& what, const Tensor& input, const Tensor& analytic,
                                          const std::function<double()>& loss, const GradCheckOptions& opt) {
  if (input.shape() != analytic.shape())
    return ::testing::AssertionFailure() << what << ": gradient " << analytic.str() << " does not match input "
                                         << input.str();
  const int64_t n = input.numel();
  const auto grad = analytic.to_vector();
  float* x = input.f32();
  const int64_t count = std::min<int64_t>(n, opt.max_elements);
  int checked = 0;
  for (int64_t j = 0; j < count; ++j) {
    // Spread the checked elements over the tensor, always including the first and last.
    const int64_t i = count == 1 ? 0 : j * (n - 1) / (count - 1);
    if (opt.skip && opt.skip(i)) continue;
    const float saved = x[i];
    x[i] = static_cast<float>(saved + opt.eps);
    const double lp = loss();
    x[i] = static_cast<float>(saved - opt.eps);
    const double lm = loss();
    x[i] = saved;
    // The perturbation actually applied, after float rounding:
    const double h = (static_cast<double>(static_cast<float>(saved + opt.eps)) -
                      static_cast<double>(static_cast<float>(saved - opt.eps)));
    const double numeric = (lp - lm) / h;
    const double a = grad[static_cast<size_t>(i)];
    if (std::fabs(numeric - a) > opt.atol + opt.rtol * std::fabs(numeric)) {
      return ::testing::AssertionFailure() << what << ": element " << i << ": analytic " << a << " vs numeric "
                                           << numeric << " (eps " << opt.eps << ")";
    }
    ++checked;
  }
  if (checked == 0) return ::testing::AssertionFailure() << what << ": no element was checked";
  return ::testing::AssertionSuccess();
}

}  // namespace remat::test
