#include "support/golden.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <sstream>

namespace remat::test {

namespace {
std::string golden_root() { return std::string(REMAT_SOURCE_DIR) + "/tests/golden/"; }
}  // namespace

SafetensorsFile load_golden(const std::string& name) {
  return SafetensorsFile::load(golden_root() + name + ".safetensors");
}

std::vector<std::string> golden_cases(const std::string& family) {
  std::vector<std::string> out;
  const std::filesystem::path dir = golden_root() + family;
  if (!std::filesystem::is_directory(dir)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") out.push_back(family + "/" + e.path().stem().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string meta_str(const SafetensorsFile& f, const std::string& key) {
  auto it = f.metadata().find(key);
  if (it == f.metadata().end()) throw std::runtime_error("golden file has no metadata key \"" + key + "\"");
  return it->second;
}

int64_t meta_int(const SafetensorsFile& f, const std::string& key) { return std::stoll(meta_str(f, key)); }
double meta_float(const SafetensorsFile& f, const std::string& key) { return std::stod(meta_str(f, key)); }

::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  if (actual.shape() != expected.shape())
    return ::testing::AssertionFailure() << "shape " << actual.shape().str() << " vs expected "
                                         << expected.shape().str();
  const auto a = actual.to_vector(), e = expected.to_vector();
  int64_t bad = 0, worst = -1;
  double worst_excess = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = e[i];
    if (std::isnan(y) || std::isinf(y) || std::isnan(x) || std::isinf(x)) {
      const bool same = (std::isnan(x) && std::isnan(y)) || x == y;
      if (!same) {
        ++bad;
        if (worst < 0 || std::isinf(worst_excess) == false) {
          worst = static_cast<int64_t>(i);
          worst_excess = INFINITY;
        }
      }
      continue;
    }
    const double excess = std::fabs(x - y) - (atol + rtol * std::fabs(y));
    if (excess > 0) {
      ++bad;
      if (excess > worst_excess) {
        worst_excess = excess;
        worst = static_cast<int64_t>(i);
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << a.size() << " elements differ (rtol " << rtol << ", atol "
                                       << atol << "); worst at flat index " << worst << ": "
                                       << a[static_cast<size_t>(worst)] << " vs expected "
                                       << e[static_cast<size_t>(worst)];
}

::testing::AssertionResult bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype())
    return ::testing::AssertionFailure() << a.str() << " vs " << b.str();
  const Tensor ha = a.device().is_cpu() ? a : a.to(Device::cpu());
  const Tensor hb = b.device().is_cpu() ? b : b.to(Device::cpu());
  const auto* pa = static_cast<const unsigned char*>(ha.raw_data());
  const auto* pb = static_cast<const unsigned char*>(hb.raw_data());
  for (size_t i = 0; i < ha.nbytes(); ++i)
    if (pa[i] != pb[i])
      return ::testing::AssertionFailure() << "first differing byte at " << i << " of " << ha.nbytes();
  return ::testing::AssertionSuccess();
}

Tensor random_tensor(const Shape& shape, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (auto& x : v) x = dist(rng);
  return Tensor::from_vector(v, shape);
}

double dot(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector(), y = b.to_vector();
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += static_cast<double>(x[i]) * y[i];
  return s;
}

}  // namespace remat::test
