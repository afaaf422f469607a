// Shape: up to five dimensions, each >= 0, whose element count fits in int64.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace remat {

class Shape {
 public:
  static constexpr int kMaxDims = 5;

  Shape() = default;  // a scalar: rank 0, one element
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(const std::vector<int64_t>& dims);

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(normalize(i))]; }
  int64_t numel() const { return numel_; }
  std::vector<int64_t> dims() const { return {dims_.begin(), dims_.begin() + rank_}; }

  // Index `i` with Python's negative indexing; throws when out of range.
  int normalize(int i) const;

  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }

  std::string str() const;  // "[2, 3, 4]"

 private:
  void init(const int64_t* dims, size_t n);
  std::array<int64_t, kMaxDims> dims_{};
  int rank_ = 0;
  int64_t numel_ = 1;
};

}  // namespace remat
