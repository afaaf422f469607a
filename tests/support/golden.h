// Golden values from PyTorch (tools/reference/gen_golden.py writes tests/golden/<family>/<case>.safetensors)
// and comparison helpers shared by the op tests.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "remat/io.h"
#include "remat/tensor.h"

namespace remat::test {

// Loads tests/golden/<name>.safetensors (name like "basic/linear_small").
SafetensorsFile load_golden(const std::string& name);
// Lists the case names of one family ("basic" -> {"basic/linear_small", ...}), sorted.
std::vector<std::string> golden_cases(const std::string& family);

// Metadata accessors that fail the test clearly when a key is missing or malformed.
int64_t meta_int(const SafetensorsFile& f, const std::string& key);
double meta_float(const SafetensorsFile& f, const std::string& key);
std::string meta_str(const SafetensorsFile& f, const std::string& key);

// Max |a - b| <= atol + rtol * |b| elementwise; NaN/inf must match exactly in position.
// Reports the worst element and the count of mismatches.
::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double rtol, double atol);
::testing::AssertionResult bitwise_equal(const Tensor& a, const Tensor& b);

// A tensor of uniform values in [lo, hi) from a fixed seed (host std::mt19937).
Tensor random_tensor(const Shape& shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f);

// sum(a * b) in double (for finite-difference losses).
double dot(const Tensor& a, const Tensor& b);

}  // namespace remat::test

#define EXPECT_ALL_CLOSE(actual, expected, rtol, atol) \
  EXPECT_TRUE(::remat::test::all_close(actual, expected, rtol, atol))
#define ASSERT_ALL_CLOSE(actual, expected, rtol, atol) \
  ASSERT_TRUE(::remat::test::all_close(actual, expected, rtol, atol))
