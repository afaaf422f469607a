// The validators of the op list (remat/backend_ops.def), one file per op family, named as
// the cpu backend's (src/backends/validate/<family>.cpp beside src/backends/cpu/<family>.cpp):
// check_<op>(Check, the op's arguments) throws remat::Error naming the op, the argument and
// the shapes. Backend's public entry points (src/backends/backend.cpp) call check_<op> before
// entering the backend, so every backend validates alike. Internal to src/backends.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "remat/backend.h"
#include "remat/error.h"

namespace remat::validate {

// What a validator reports against: the op's name (errors start with it), the backend's
// device (every tensor must live there) and the backend itself (its workspace queries).
struct Check {
  std::string_view op;
  Device device;
  Backend* be = nullptr;  // the backend being validated (its workspace queries); null for shape helpers

  [[noreturn]] void fail(const std::string& msg) const { REMAT_THROW(op, ": ", msg); }

  // A defined tensor of the dtype, on this backend's device.
  void tensor(const char* name, const Tensor& t, DType dtype = DType::f32) const {
    if (!t.defined()) fail(std::string(name) + " is undefined");
    const bool activation = dtype == DType::f32 && t.dtype() == activation_dtype();  // bf16 storage
    if (t.dtype() != dtype && !activation)
      fail(std::string(name) + " " + t.str() + ": expected dtype " + dtype_name(dtype));
    if (t.device() != device) fail(std::string(name) + " " + t.str() + ": expected a tensor on " + device.str());
  }
  // A tensor that stays f32 whatever activation_dtype() says: normalisation statistics, the
  // loss and cross-entropy's row statistics (they need fp32's range and precision).
  void statistics(const char* name, const Tensor& t) const {
    if (!t.defined()) fail(std::string(name) + " is undefined");
    if (t.dtype() != DType::f32)
      fail(std::string(name) + " " + t.str() + ": expected dtype f32 (statistics stay f32 under bf16 activations)");
    if (t.device() != device) fail(std::string(name) + " " + t.str() + ": expected a tensor on " + device.str());
  }
  void rank(const char* name, const Tensor& t, int r) const {
    if (t.rank() != r) fail(std::string(name) + " " + t.str() + ": expected rank " + std::to_string(r));
  }
  void min_rank(const char* name, const Tensor& t, int r) const {
    if (t.rank() < r) fail(std::string(name) + " " + t.str() + ": expected rank >= " + std::to_string(r));
  }
  void shape(const char* name, const Tensor& t, const Shape& want) const {
    if (t.shape() != want) fail(std::string(name) + " " + t.str() + ": expected shape " + want.str());
  }
  void same_shape(const char* an, const Tensor& a, const char* bn, const Tensor& b) const {
    if (a.shape() != b.shape())
      fail(std::string(an) + " " + a.str() + " and " + bn + " " + b.str() + " must have the same shape");
  }
  void optional(const char* name, const Tensor& t, const Shape& want, DType dtype = DType::f32) const {
    if (!t.defined()) return;
    tensor(name, t, dtype);
    shape(name, t, want);
  }
  void positive(const char* name, int64_t v) const {
    if (v <= 0) fail(std::string(name) + " must be positive, got " + std::to_string(v));
  }
  void non_negative(const char* name, int64_t v) const {
    if (v < 0) fail(std::string(name) + " must be non-negative, got " + std::to_string(v));
  }
  void probability(const char* name, float p) const {
    if (!(p >= 0.0f && p <= 1.0f)) fail(std::string(name) + " must be in [0, 1], got " + std::to_string(p));
  }
  void workspace(const Tensor& ws, size_t need) const {
    if (need == 0) return;
    if (!ws.defined() || ws.nbytes() < need)
      fail("workspace of " + std::to_string(need) + " bytes needed, got " +
           (ws.defined() ? std::to_string(ws.nbytes()) : std::string("none")));
    if (ws.device() != device) fail("workspace " + ws.str() + ": expected a tensor on " + device.str());
  }
};

// The shape s with its last dimension replaced.
inline Shape with_last(const Shape& s, int64_t last) {
  auto d = s.dims();
  d.back() = last;
  return Shape(d);
}

// The number of rows of a [..., C] shape (1 for a scalar).
inline int64_t rows_of(const Shape& s) { return s.rank() == 0 ? 1 : s.numel() / std::max<int64_t>(s[-1], 1); }

// The validators, declared from the op list: one `void check_<op>(const Check&, <the op's
// parameters>)` per REMAT_OP entry (a workspace query's validator takes the query's
// parameters). A validator takes all the op's arguments; those it does not check stay
// unnamed (`float /*alpha*/`). An op without a validator fails to link with
//   undefined reference to `remat::validate::check_<op>(remat::validate::Check const&, ...)'
// -- define check_<op> in src/backends/validate/<family>.cpp, the family of the op's
// section in backend_ops.def (docs/adding-an-op.md).
#define REMAT_VALIDATE_PARAMS(...) __VA_ARGS__
#define REMAT_OP(kind, R, name, params, args) void check_##name(const Check& ck, REMAT_VALIDATE_PARAMS params);
#include "remat/backend_ops.def"
#undef REMAT_OP
#undef REMAT_VALIDATE_PARAMS

}  // namespace remat::validate
