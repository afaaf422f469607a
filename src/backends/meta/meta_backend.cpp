// The meta backend: shapes and allocations only. Every op is validated like on any other
// backend and then does nothing; its ops are generated from remat/backend_ops.def, so a
// new op needs no code here. The workspace queries are those of a workspace model: the
// CPU's size functions by default (so a plan profiled on meta holds exactly what it holds
// on cpu), or a given backend's (cuda's, to predict a GPU step). Results (accuracy,
// norms) are zero.
#include "backends/cpu/cpu_backend.h"

namespace remat {

namespace {

// What the `result` ops of the op list answer on meta. A new result op without an entry
// here does not compile.
struct MetaResults {
  static int64_t accuracy(const Tensor&, const Tensor&, int, int64_t* counted) {
    if (counted) *counted = 0;
    return 0;
  }
  static double global_norm(const std::vector<Tensor>&) { return 0.0; }
};

// The CPU's workspace sizes, by op name (for the generated queries below).
struct CpuWorkspaces {
  static size_t conv2d_forward_workspace(const Shape& x, const Shape& w, const Conv2dParams& p) {
    return cpu::conv2d_forward_workspace(x, w, p);
  }
  static size_t conv2d_backward_workspace(const Shape& x, const Shape& w, const Conv2dParams& p) {
    return cpu::conv2d_backward_workspace(x, w, p);
  }
  static size_t attention_forward_workspace(const Shape& qkv, const AttentionParams& p) {
    return cpu::attention_forward_workspace(qkv, p);
  }
  static size_t attention_backward_workspace(const Shape& qkv, const AttentionParams& p) {
    return cpu::attention_backward_workspace(qkv, p);
  }
  static size_t flash_attention_backward_workspace(const Shape& xq, const Shape& xkv, const FlashAttentionParams& p) {
    return cpu::flash_attention_backward_workspace(xq, xkv, p);
  }
  static size_t layernorm_backward_workspace(const Shape& x) { return cpu::layernorm_backward_workspace(x); }
  static size_t cross_entropy_forward_workspace(const Shape& logits, float smoothing) {
    return cpu::cross_entropy_forward_workspace(logits, smoothing);
  }
  static size_t embedding_backward_workspace(const Shape& dy) { return cpu::embedding_backward_workspace(dy); }
};

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"

class MetaBackend final : public Backend {
 public:
  explicit MetaBackend(Backend* workspace_model) : model_(workspace_model) {}
  Device device() const override { return Device::meta(); }
  std::string name() const override { return "meta"; }
  bool supports_bf16() const override { return true; }  // the memory model of every precision
  // Offload's memory model: a host pool that holds no data, copies that do nothing.
  std::string offload_unsupported() const override { return ""; }
  std::unique_ptr<RawAllocator> make_pinned_allocator(size_t) override { return make_meta_raw_allocator(); }
  uint64_t copy_async(const Tensor&, const Tensor&) override { return ++copies_; }
  void wait_copy(uint64_t) override {}

 protected:
#define REMAT_META_op(R, name, params, args) \
  void name##_impl params override {}
#define REMAT_META_result(R, name, params, args) \
  R name##_impl params override { return MetaResults::name args; }
#define REMAT_META_workspace(R, name, params, args) \
  size_t name##_impl params override { return model_ ? model_->name args : CpuWorkspaces::name args; }
#define REMAT_OP(kind, R, name, params, args) REMAT_META_##kind(R, name, params, args)
#include "remat/backend_ops.def"
#undef REMAT_OP
#undef REMAT_META_op
#undef REMAT_META_result
#undef REMAT_META_workspace

 private:
  Backend* model_;  // answers the workspace queries when set
  uint64_t copies_ = 0;
};

#pragma GCC diagnostic pop

}  // namespace

std::unique_ptr<Backend> make_meta_backend(Backend* workspace_model) {
  return std::make_unique<MetaBackend>(workspace_model);
}

}  // namespace remat
