// Softmax and log-softmax over the last dimension, cross-entropy, accuracy
// (kernels/softmax_loss.cu). x, y, dy, dx and the logits may be bf16 (fbuf); lse and the
// loss are f32 (the statistics that need range).
//
// cross_entropy_forward checks the targets as the CPU does (a target outside [0, V) that
// is not ignore_index throws). Targets uploaded from the host carry their range
// (Storage::int_range): when it shows every target in [0, V) or equal to ignore_index, the
// op does not wait for the stream. Otherwise the loss kernel records the first bad row in
// the backend's scratch buffer, which is read back (one synchronisation). cross_entropy_backward keeps its scale
// (dloss / rows counted) in scratch between its two kernels; accuracy counts there.
#include <cstdint>

#include "backends/cuda/cuda_backend.h"
#include "kernels/softmax_loss.cuh"
#include "remat/cuda_check.h"
#include "remat/error.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

namespace {
int64_t rows_of(const Tensor& t) { return t.size(-1) == 0 ? 0 : t.numel() / t.size(-1); }
}  // namespace

void CudaBackend::softmax_forward_impl(const Tensor& x, bool log, const Tensor& y) {
  kernels::softmax_forward(fbuf(x), rows_of(x), x.size(-1), log, fbuf(y), stream());
}

void CudaBackend::softmax_backward_impl(const Tensor& dy, const Tensor& y, bool log, const Tensor& dx) {
  kernels::softmax_backward(fbuf(dy), fbuf(y), rows_of(y), y.size(-1), log, fbuf(dx), stream());
}

size_t CudaBackend::cross_entropy_forward_workspace_impl(const Shape& logits, float smoothing) {
  return smoothing > 0.0f ? static_cast<size_t>(logits[0]) * sizeof(float) : 0;  // the row means, as on the CPU
}

void CudaBackend::cross_entropy_forward_impl(const Tensor& logits, const Tensor& targets, int ignore_index,
                                             float smoothing, const Tensor& loss, const Tensor& lse,
                                             const Tensor& workspace) {
  const int64_t n = logits.size(0), v = logits.size(1);
  auto* check = static_cast<kernels::CrossEntropyCheck*>(scratch());
  float* row_mean = smoothing > 0.0f ? static_cast<float*>(workspace.raw_data()) : nullptr;
  kernels::cross_entropy_forward(fbuf(logits), targets.i32(), n, v, ignore_index, smoothing, loss.f32(), lse.f32(),
                                 row_mean, check, stream());
  // Checked on the host: no value above V - 1, and every value below 0 is ignore_index
  // (then it is the least value, and the next one up is not negative).
  const Storage::IntRange* known = targets.storage()->int_range();
  if (known && known->hi < v && (known->lo >= 0 || (known->lo == ignore_index && known->next >= 0))) return;
  kernels::CrossEntropyCheck found{};
  copy_to_host(&found, check, sizeof found);
  if (found.bad_row >= 0)
    REMAT_THROW("cross_entropy_forward: target ", found.bad_target, " at row ", found.bad_row, " is outside [0, ", v,
                ") for logits ", logits.str());
}

void CudaBackend::cross_entropy_backward_impl(float dloss, const Tensor& logits, const Tensor& targets,
                                              const Tensor& lse, int ignore_index, float smoothing,
                                              const Tensor& dlogits) {
  kernels::cross_entropy_backward(dloss, fbuf(logits), targets.i32(), lse.f32(), logits.size(0), logits.size(1),
                                  ignore_index, smoothing, fbuf(dlogits), static_cast<float*>(scratch()), stream());
}

int64_t CudaBackend::accuracy_impl(const Tensor& logits, const Tensor& targets, int ignore_index, int64_t* counted) {
  auto* counts = static_cast<unsigned long long*>(scratch());
  REMAT_CUDA_CHECK(cudaMemsetAsync(counts, 0, 2 * sizeof(unsigned long long), stream()));
  kernels::accuracy(fbuf(logits), targets.i32(), logits.size(0), logits.size(1), ignore_index, counts, stream());
  unsigned long long host[2] = {0, 0};
  copy_to_host(host, counts, sizeof host);
  if (counted) *counted = static_cast<int64_t>(host[0]);
  return static_cast<int64_t>(host[1]);
}

REMAT_KERNELS_ABI_END
}  // namespace remat
