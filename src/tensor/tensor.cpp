#include "remat/tensor.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "remat/bf16.h"
#include "remat/device_registry.h"
#include "remat/error.h"

namespace remat {

namespace {

// The device kind of memory that host code cannot address (a GPU's), with its copies.
const DeviceKind& device_memory_kind(Device d) {
  const DeviceKind& k = device_kind(d);
  REMAT_CHECK(k.copy && k.fill_f32 && k.zero, "device ", d.str(), "'s memory is not host memory, and its kind ",
              "registers no copies or fills for it");
  return k;
}

// `bytes` from src (memory of sd) to dst (memory of dd); neither may be meta.
void copy_bytes(void* dst, Device dd, const void* src, Device sd, size_t bytes) {
  if (bytes == 0) return;
  if (dd.host_memory() && sd.host_memory()) {
    std::memmove(dst, src, bytes);
  } else if (!dd.host_memory() && !sd.host_memory() && dd.type != sd.type) {
    // Two kinds of device memory (cuda and cuda-emu): through the host.
    std::vector<unsigned char> staging(bytes);
    device_memory_kind(sd).copy(staging.data(), Device::cpu(), src, sd, bytes);
    device_memory_kind(dd).copy(dst, dd, staging.data(), Device::cpu(), bytes);
  } else {
    device_memory_kind(dd.host_memory() ? sd : dd).copy(dst, dd, src, sd, bytes);
  }
}

}  // namespace

Storage::Storage(CachingAllocator& allocator, size_t bytes, const AllocTag& tag)
    : allocator_(allocator), block_(allocator.allocate(bytes, tag)), nbytes_(bytes) {}

Storage::~Storage() { allocator_.free(block_); }

void* Storage::data() const {
  REMAT_CHECK(allocator_.has_data(), "tensor on ", device().str(), " has no data (meta tensors hold only a shape)");
  return block_->ptr;
}

Storage::IntRange int_range_of(const int32_t* v, int64_t n) {
  Storage::IntRange r;
  r.lo = r.hi = v[0];
  for (int64_t i = 1; i < n; ++i) {
    r.lo = std::min(r.lo, v[i]);
    r.hi = std::max(r.hi, v[i]);
  }
  for (int64_t i = 0; i < n; ++i)
    if (v[i] > r.lo) r.next = std::min(r.next, v[i]);
  return r;
}

Device Tensor::device() const {
  REMAT_CHECK(defined(), "use of an undefined tensor");
  return storage_->device();
}

Tensor Tensor::empty(const Shape& shape, Device device, DType dtype) {
  return empty(shape, device, dtype, current_tag());
}

Tensor Tensor::empty(const Shape& shape, Device device, DType dtype, const AllocTag& tag) {
  require_available(device);
  return empty_in(allocator_for(device), shape, dtype, tag);
}

Tensor Tensor::empty_in(CachingAllocator& alloc, const Shape& shape, DType dtype, const AllocTag& tag) {
  const auto esize = static_cast<int64_t>(dtype_size(dtype));
  REMAT_CHECK(shape.numel() <= INT64_MAX / esize, "tensor of shape ", shape.str(), " and dtype ", dtype_name(dtype),
              " is too large to address");
  Tensor t;
  t.storage_ = std::make_shared<Storage>(alloc, static_cast<size_t>(shape.numel() * esize), tag);
  if (alloc.event_logging()) alloc.note_shape(&t.storage_->block(), shape.str() + " " + dtype_name(dtype));
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, Device device, DType dtype) {
  Tensor t = empty(shape, device, dtype);
  if (t.storage_->has_data() && t.nbytes() > 0) {
    if (device.host_memory()) {
      std::memset(t.raw_data(), 0, t.nbytes());
    } else {
      device_memory_kind(device).zero(t.raw_data(), device, t.nbytes());
    }
  }
  return t;
}

Tensor Tensor::full(const Shape& shape, float value, Device device) {
  Tensor t = empty(shape, device, DType::f32);
  t.fill_(value);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape, Device device) {
  REMAT_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "from_vector: ", values.size(),
              " values do not fill shape ", shape.str(), " (", shape.numel(), " elements)");
  Tensor t = empty(shape, device, DType::f32);
  if (device.host_memory()) {
    std::copy(values.begin(), values.end(), t.f32());
  } else if (t.storage_->has_data()) {
    copy_bytes(t.raw_data(), device, values.data(), Device::cpu(), t.nbytes());
  }
  return t;
}

Tensor Tensor::from_u8(const std::vector<uint8_t>& values, const Shape& shape, Device device) {
  REMAT_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "from_u8: ", values.size(),
              " values do not fill shape ", shape.str(), " (", shape.numel(), " elements)");
  Tensor t = empty(shape, device, DType::u8);
  if (device.host_memory()) {
    std::copy(values.begin(), values.end(), t.u8());
  } else if (t.storage_->has_data()) {
    copy_bytes(t.raw_data(), device, values.data(), Device::cpu(), t.nbytes());
  }
  return t;
}

Tensor Tensor::from_ints(const std::vector<int32_t>& values, const Shape& shape, Device device) {
  REMAT_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "from_ints: ", values.size(),
              " values do not fill shape ", shape.str(), " (", shape.numel(), " elements)");
  Tensor t = empty(shape, device, DType::i32);
  if (device.host_memory()) {
    std::copy(values.begin(), values.end(), t.i32());
  } else if (t.storage_->has_data()) {
    copy_bytes(t.raw_data(), device, values.data(), Device::cpu(), t.nbytes());
  }
  if (!values.empty() && t.storage_->has_data()) t.storage_->set_int_range(int_range_of(values.data(), t.numel()));
  return t;
}

Tensor Tensor::reshape(const std::vector<int64_t>& dims) const {
  REMAT_CHECK(defined(), "reshape of an undefined tensor");
  std::vector<int64_t> d = dims;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] == -1) {
      REMAT_CHECK(infer < 0, "reshape ", str(), ": more than one -1 dimension");
      infer = static_cast<int>(i);
    } else {
      REMAT_CHECK(d[i] >= 0, "reshape ", str(), ": negative dimension ", d[i]);
      known *= d[i];
    }
  }
  if (infer >= 0) {
    REMAT_CHECK(known > 0 && numel() % known == 0, "reshape ", str(), ": cannot infer the -1 dimension");
    d[static_cast<size_t>(infer)] = numel() / known;
  }
  return view(Shape(d));
}

Tensor Tensor::view_at(int64_t element_offset, const Shape& shape) const {
  REMAT_CHECK(defined(), "view_at of an undefined tensor");
  REMAT_CHECK(element_offset >= 0 && shape.numel() <= numel() - element_offset, "view_at(", element_offset, ", ",
              shape.str(), ") does not fit in ", str());
  Tensor t = *this;
  t.shape_ = shape;
  t.offset_ += static_cast<size_t>(element_offset) * dtype_size(dtype_);
  return t;
}

Tensor Tensor::view(const Shape& shape) const {
  REMAT_CHECK(defined(), "reshape of an undefined tensor");
  REMAT_CHECK(shape.numel() == numel(), "cannot reshape ", str(), " to ", shape.str(), ": element counts differ (",
              numel(), " vs ", shape.numel(), ")");
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

void* Tensor::raw_data() const {
  REMAT_CHECK(defined(), "use of an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_;
}

float* Tensor::f32() const {
  REMAT_CHECK(dtype_ == DType::f32, "tensor ", str(), " is not f32");
  return static_cast<float*>(raw_data());
}

int32_t* Tensor::i32() const {
  REMAT_CHECK(dtype_ == DType::i32, "tensor ", str(), " is not i32");
  return static_cast<int32_t*>(raw_data());
}

uint8_t* Tensor::u8() const {
  REMAT_CHECK(dtype_ == DType::u8, "tensor ", str(), " is not u8");
  return static_cast<uint8_t*>(raw_data());
}

uint16_t* Tensor::bf16() const {
  REMAT_CHECK(dtype_ == DType::bf16, "tensor ", str(), " is not bf16");
  return static_cast<uint16_t*>(raw_data());
}

std::vector<int32_t> Tensor::to_ints() const {
  REMAT_CHECK(dtype_ == DType::i32 || dtype_ == DType::u8, "to_ints of ", str(), ": not i32 or u8");
  std::vector<int32_t> out(static_cast<size_t>(numel()));
  if (dtype_ == DType::u8) {  // widened
    std::vector<uint8_t> bytes(out.size());
    if (device().host_memory())
      std::copy(u8(), u8() + numel(), bytes.begin());
    else
      copy_bytes(bytes.data(), Device::cpu(), raw_data(), device(), nbytes());
    std::copy(bytes.begin(), bytes.end(), out.begin());
    return out;
  }
  if (device().host_memory()) {
    std::copy(i32(), i32() + numel(), out.begin());
  } else {
    copy_bytes(out.data(), Device::cpu(), raw_data(), device(), nbytes());
  }
  return out;
}

std::vector<float> Tensor::to_vector() const {
  REMAT_CHECK(dtype_ == DType::f32 || dtype_ == DType::bf16, "to_vector of ", str(),
              ": only f32 and bf16 are supported");
  std::vector<float> out(static_cast<size_t>(numel()));
  if (dtype_ == DType::bf16) {  // widened exactly
    std::vector<uint16_t> bits(out.size());
    if (device().host_memory())
      std::copy(bf16(), bf16() + numel(), bits.begin());
    else
      copy_bytes(bits.data(), Device::cpu(), raw_data(), device(), nbytes());
    for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_float(bits[i]);
    return out;
  }
  if (device().host_memory()) {
    std::copy(f32(), f32() + numel(), out.begin());
  } else {
    copy_bytes(out.data(), Device::cpu(), raw_data(), device(), nbytes());
  }
  return out;
}

Tensor Tensor::to(Device d) const {
  REMAT_CHECK(defined(), "copy of an undefined tensor");
  AllocTag tag{storage_->block().category, current_tag().owner, current_tag().phase};
  Tensor t = empty(shape_, d, dtype_, tag);
  t.copy_from(*this);
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  REMAT_CHECK(defined() && src.defined(), "copy between undefined tensors");
  REMAT_CHECK(numel() == src.numel() && dtype_ == src.dtype_, "copy_from: ", src.str(), " does not fit ", str());
  const Device dd = device(), sd = src.device();
  if (dd.is_meta() || sd.is_meta()) {
    REMAT_CHECK(dd.is_meta(), "cannot copy data from a meta tensor into ", str());
    return;  // nothing to move
  }
  if (nbytes() == 0) return;
  copy_bytes(raw_data(), dd, src.raw_data(), sd, nbytes());
  // i32 values written from host memory over the whole storage: their range is known.
  storage_->clear_int_range();
  if (dtype_ == DType::i32 && sd.is_cpu() && offset_ == 0 && nbytes() == storage_->nbytes())
    storage_->set_int_range(int_range_of(src.i32(), numel()));
}

void Tensor::fill_(float value) {
  REMAT_CHECK(dtype_ == DType::f32, "fill_ of ", str(), ": only f32 is supported");
  const Device d = device();
  if (d.is_meta()) return;
  storage_->clear_int_range();
  if (d.host_memory()) {
    std::fill(f32(), f32() + numel(), value);
  } else if (numel() > 0) {
    device_memory_kind(d).fill_f32(f32(), d, numel(), value);
  }
}

std::string Tensor::str() const {
  if (!defined()) return "undefined tensor";
  return std::string(dtype_name(dtype_)) + shape_.str() + " on " + device().str();
}

}  // namespace remat
