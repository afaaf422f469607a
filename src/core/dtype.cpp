#include "remat/dtype.h"

#include "remat/error.h"

namespace remat {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::u8: return 1;
  }
  REMAT_THROW("unknown dtype ", static_cast<int>(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  if (s == "f32" || s == "float32") return DType::f32;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "f16" || s == "float16") return DType::f16;
  if (s == "i32" || s == "int32") return DType::i32;
  if (s == "u8" || s == "uint8") return DType::u8;
  REMAT_THROW("unknown dtype \"", s, "\" (expected f32, bf16, f16, i32 or u8)");
}

namespace {
thread_local DType g_activation_dtype = DType::f32;
}  // namespace

DType activation_dtype() { return g_activation_dtype; }

ActivationDTypeScope::ActivationDTypeScope(DType d) : prev_(g_activation_dtype) {
  REMAT_CHECK(d == DType::f32 || d == DType::bf16, "activation dtype ", dtype_name(d), ": expected f32 or bf16");
  g_activation_dtype = d;
}
ActivationDTypeScope::~ActivationDTypeScope() { g_activation_dtype = prev_; }

}  // namespace remat
