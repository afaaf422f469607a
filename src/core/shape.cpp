#include "remat/shape.h"

#include <limits>

#include "remat/error.h"

namespace remat {

Shape::Shape(std::initializer_list<int64_t> dims) { init(dims.begin(), dims.size()); }
Shape::Shape(const std::vector<int64_t>& dims) { init(dims.data(), dims.size()); }

void Shape::init(const int64_t* dims, size_t n) {
  std::vector<int64_t> given(dims, dims + n);
  auto describe = [&] {
    std::string s = "[";
    for (size_t i = 0; i < given.size(); ++i) s += (i ? ", " : "") + std::to_string(given[i]);
    return s + "]";
  };
  REMAT_CHECK(n <= static_cast<size_t>(kMaxDims), "invalid shape ", describe(), ": rank ", n,
              " exceeds the maximum of ", kMaxDims);
  rank_ = static_cast<int>(n);
  numel_ = 1;
  for (size_t i = 0; i < n; ++i) {
    REMAT_CHECK(dims[i] >= 0, "invalid shape ", describe(), ": dimension ", i, " is negative");
    if (dims[i] != 0 && numel_ > std::numeric_limits<int64_t>::max() / dims[i]) {
      REMAT_THROW("invalid shape ", describe(), ": element count overflows int64");
    }
    numel_ *= dims[i];
    dims_[i] = dims[i];
  }
}

int Shape::normalize(int i) const {
  int j = i < 0 ? i + rank_ : i;
  REMAT_CHECK(j >= 0 && j < rank_, "dimension index ", i, " out of range for shape ", str());
  return j;
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
  return s + "]";
}

}  // namespace remat
