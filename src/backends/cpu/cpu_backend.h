// The CPU backend: the reference every other backend is tested against (fp32, OpenBLAS
// for GEMM, OpenMP for the rest). Results are bitwise reproducible for a given thread
// count: no reduction order depends on scheduling.
//
// One file per op family (gemm.cpp holds gemm and linear; the others are named after
// their family), each defining its CpuBackend::*_impl.
#pragma once

#include "remat/backend.h"

namespace remat {

// The workspace sizes of the CPU ops, as functions of shapes alone: the CPU backend's
// queries, and the meta backend's default model (it must never run CPU code).
namespace cpu {
size_t conv2d_forward_workspace(const Shape& x, const Shape& w, const Conv2dParams& p);  // conv.cpp
size_t conv2d_backward_workspace(const Shape& x, const Shape& w, const Conv2dParams& p);
size_t attention_forward_workspace(const Shape& qkv, const AttentionParams& p);  // attention.cpp
size_t attention_backward_workspace(const Shape& qkv, const AttentionParams& p);
size_t flash_attention_backward_workspace(const Shape& xq, const Shape& xkv,
                                          const FlashAttentionParams& p);      // flash_attention.cpp
size_t layernorm_backward_workspace(const Shape& x);                           // layernorm.cpp: 0 (sums in place)
size_t cross_entropy_forward_workspace(const Shape& logits, float smoothing);  // softmax_loss.cpp: the row means
size_t embedding_backward_workspace(const Shape& dy);  // embedding.cpp: 0 (channel blocks in place)
}  // namespace cpu

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::cpu(); }
  std::string name() const override { return "cpu"; }
  bool supports_bf16() const override { return true; }  // fp32 math on bf16 storage (mixed.h)

 protected:
#define REMAT_OP(kind, R, name, params, args) R name##_impl params override;
#include "remat/backend_ops.def"
#undef REMAT_OP
};

}  // namespace remat
