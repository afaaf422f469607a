// Element types. Only f32 has kernels today; bf16 and f16 are named so that storage
// sizes and configs can speak of them.
#pragma once

#include <cstddef>
#include <string>

namespace remat {

// i32: token ids and class targets; u8: max pooling's saved indices (an offset within the
// pooling window, include/remat/backend_ops.def).
enum class DType { f32, bf16, f16, i32, u8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
DType parse_dtype(const std::string& s);  // "f32" | "bf16" | "f16" | "i32" | "u8"; throws otherwise

// The storage dtype of the float activations that ops and layers allocate on the calling
// thread: f32, or bf16 inside an ActivationDTypeScope (training.precision bf16, see
// docs/memory.md). What needs range stays f32 whatever it says: normalisation statistics,
// the loss and cross-entropy's row statistics, parameter gradients, optimizer state.
// The validators accept it where they expect f32 (statistics excepted: they say so). The
// meta backend models bf16; every op of the CPU backend (src/backends/cpu/mixed.h) and of
// the CUDA backend (kernels/bf16.cuh) computes on bf16 storage in fp32.
DType activation_dtype();
class ActivationDTypeScope {
 public:
  explicit ActivationDTypeScope(DType d);
  ~ActivationDTypeScope();
  ActivationDTypeScope(const ActivationDTypeScope&) = delete;
  ActivationDTypeScope& operator=(const ActivationDTypeScope&) = delete;

 private:
  DType prev_;
};

}  // namespace remat
