// Tensor: a shape, a dtype, a device and contiguous storage from the device's caching
// allocator. Copies of a Tensor share storage; reshape returns a view (no copy).
// Storage is returned to the allocator when the last tensor using it goes away.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "remat/device.h"
#include "remat/dtype.h"
#include "remat/memory.h"
#include "remat/shape.h"

namespace remat {

class Storage {
 public:
  Storage(CachingAllocator& allocator, size_t bytes, const AllocTag& tag);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const;  // throws on meta
  size_t nbytes() const { return nbytes_; }
  Device device() const { return allocator_.device(); }
  bool has_data() const { return allocator_.has_data(); }
  const Block& block() const { return *block_; }

  // The range of an i32 storage's values, known when the whole storage was last written
  // from host values (Tensor::from_ints, Tensor::to and copy_from out of host memory): a
  // device op checks indices against it instead of reading them back (docs/kernels.md,
  // "stream drains"). Every other write clears it: fill_, a copy from device memory or into
  // part of the storage, and backend ops that write i32 outputs (max_pool's indices).
  struct IntRange {
    int32_t lo = 0, hi = 0;                              // the least and the greatest value
    int32_t next = std::numeric_limits<int32_t>::max();  // the least value above lo (max: none)
  };
  const IntRange* int_range() const { return has_range_ ? &range_ : nullptr; }
  void set_int_range(const IntRange& r) const {
    range_ = r;
    has_range_ = true;
  }
  void clear_int_range() const { has_range_ = false; }

 private:
  CachingAllocator& allocator_;
  Block* block_;
  size_t nbytes_;
  mutable IntRange range_;
  mutable bool has_range_ = false;
};

// The IntRange of n values (n > 0).
Storage::IntRange int_range_of(const int32_t* v, int64_t n);

class Tensor {
 public:
  Tensor() = default;  // undefined: holds no storage

  // Uninitialised storage tagged with the thread's current tag (see TagScope) or `tag`.
  static Tensor empty(const Shape& shape, Device device = Device::cpu(), DType dtype = DType::f32);
  static Tensor empty(const Shape& shape, Device device, DType dtype, const AllocTag& tag);
  // As empty, from a given allocator (an executor's pinned host pool, remat/executor.h);
  // the tensor's device is the allocator's. The allocator must outlive the tensor.
  static Tensor empty_in(CachingAllocator& allocator, const Shape& shape, DType dtype, const AllocTag& tag);
  static Tensor zeros(const Shape& shape, Device device = Device::cpu(), DType dtype = DType::f32);
  static Tensor full(const Shape& shape, float value, Device device = Device::cpu());
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape, Device device = Device::cpu());
  static Tensor from_ints(const std::vector<int32_t>& values, const Shape& shape, Device device = Device::cpu());
  static Tensor from_u8(const std::vector<uint8_t>& values, const Shape& shape, Device device = Device::cpu());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  int64_t numel() const { return shape_.numel(); }
  int64_t size(int dim) const { return shape_[dim]; }
  DType dtype() const { return dtype_; }
  Device device() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  // A view with a new shape of the same element count; one dimension may be -1.
  Tensor reshape(const std::vector<int64_t>& dims) const;
  Tensor view(const Shape& shape) const;  // as reshape, with a complete shape
  // A contiguous view of `shape` starting `element_offset` elements into this tensor.
  Tensor view_at(int64_t element_offset, const Shape& shape) const;

  // Raw and typed element access. Throw on undefined or meta tensors and wrong dtypes.
  void* raw_data() const;
  float* f32() const;
  int32_t* i32() const;
  uint16_t* bf16() const;  // the raw bits of bf16 elements (include/remat/bf16.h)
  uint8_t* u8() const;

  std::vector<float> to_vector() const;  // copy to host (f32; bf16 widened exactly)
  std::vector<int32_t> to_ints() const;  // copy to host (i32; u8 widened)
  Tensor to(Device device) const;        // copy to another device (same tag)
  Tensor clone() const { return to(device()); }
  void copy_from(const Tensor& src);  // same element count and dtype; any devices
  void fill_(float value);
  void zero_() { fill_(0.0f); }

  bool shares_storage(const Tensor& o) const { return storage_ && storage_ == o.storage_; }
  // The same elements: one storage, offset, shape and dtype (a copy of this Tensor or an
  // equal view), as an op whose operands may be one tensor asks.
  bool same_view(const Tensor& o) const {
    return shares_storage(o) && offset_ == o.offset_ && shape_ == o.shape_ && dtype_ == o.dtype_;
  }
  long storage_use_count() const { return storage_.use_count(); }
  const Storage* storage() const { return storage_.get(); }
  // A handle that tells whether the storage is still held (a pending copy's check).
  std::weak_ptr<const Storage> storage_ref() const { return storage_; }

  std::string str() const;  // "f32[2, 3] on cpu"

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  DType dtype_ = DType::f32;
  size_t offset_ = 0;  // bytes into storage
};

}  // namespace remat
