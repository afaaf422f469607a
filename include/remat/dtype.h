// Element types. Only f32 has kernels today; bf16 and f16 are named so that storage
// sizes and configs can speak of them.
#pragma once

#include <cstddef>
#include <string>

namespace remat {

enum class DType { f32, bf16, f16, i32 };  // i32: token ids, class targets, pooling indices

size_t dtype_size(DType t);
const char* dtype_name(DType t);
DType parse_dtype(const std::string& s);  // "f32" | "bf16" | "f16" | "i32"; throws otherwise

}  // namespace remat
