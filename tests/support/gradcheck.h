// Finite-difference gradient checks, independent of PyTorch.
//
// For an op y = f(inputs) and a fixed random upstream gradient dy, the scalar
// L = sum(dy * y) has dL/dinput = the op's backward applied to dy. check_gradient perturbs
// elements of `input` by +-eps, re-evaluates L through `loss` (central differences, in
// double), and compares with `analytic` at those elements.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "remat/tensor.h"

namespace remat::test {

struct GradCheckOptions {
  double eps = 1e-2;  // perturbation (inputs are O(1) fp32 values)
  double rtol = 2e-2;
  double atol = 2e-3;
  int max_elements = 48;  // checked elements, spread over the tensor (all if fewer)
  // Skip elements where the loss is not differentiable nearby (e.g. |x| < eps for ReLU):
  std::function<bool(int64_t index)> skip;
};

// `loss` must recompute L from the current contents of `input` (a cpu f32 tensor).
::testing::AssertionResult check_gradient(const std::string& what, const Tensor& input, const Tensor& analytic,
                                          const std::function<double()>& loss, const GradCheckOptions& opt = {});

}  // namespace remat::test
