// Backend's public op entry points, generated from remat/backend_ops.def at the end of this
// file: each validates its arguments (validate::check_<op>, src/backends/validate/<family>.cpp,
// shared by every backend; errors name the op, the argument and the shapes), enters the
// backend (Backend::enter_op) and calls the backend's <op>_impl. An op without a validator
// does not link (src/backends/validate/check.h declares one per op).
#include "remat/backend.h"

#include <string_view>

#include "backends/validate/check.h"
#include "remat/error.h"

namespace remat {

// ---- The public ops: validate, enter the backend, run --------------------------------------
// Backend::gemm, Backend::linear_forward, ...: one per op of the op list (the index at the end
// of remat/backend_ops.def names each one with the files of its validator and implementations).

#define REMAT_ARGS(...) __VA_ARGS__
// The name errors give: the op's, or for a workspace query the op it sizes.
#define REMAT_OP_NAME_op(name) std::string_view(#name)
#define REMAT_OP_NAME_result(name) std::string_view(#name)
#define REMAT_OP_NAME_workspace(name) std::string_view(#name, sizeof(#name) - sizeof("_workspace"))
#define REMAT_OP(kind, R, name, params, args)                                                             \
  R Backend::name params {                                                                                \
    validate::check_##name(validate::Check{REMAT_OP_NAME_##kind(name), device(), this}, REMAT_ARGS args); \
    enter_op();                                                                                           \
    return name##_impl args;                                                                              \
  }
#include "remat/backend_ops.def"
#undef REMAT_OP
#undef REMAT_ARGS

// ---- Activation offload: what a backend without a second memory answers ---------------------
// (cpu; meta and the CUDA backend override these: meta_backend.cpp, cuda_memory.cpp)

std::string Backend::offload_unsupported() const {
  return "the " + name() + " backend has no memory apart from the host's to offload to";
}
std::unique_ptr<RawAllocator> Backend::make_pinned_allocator(size_t) {
  REMAT_THROW("activation offload on ", device().str(), ": ", offload_unsupported());
}
uint64_t Backend::copy_async(const Tensor&, const Tensor&) {
  REMAT_THROW("activation offload on ", device().str(), ": ", offload_unsupported());
}
void Backend::wait_copy(uint64_t) {
  REMAT_THROW("activation offload on ", device().str(), ": ", offload_unsupported());
}

}  // namespace remat
