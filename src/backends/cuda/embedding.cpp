// Token (+ position) embedding on the GPU (kernels/embedding.cu).
//
// The CPU backend checks the ids before it starts. Ids uploaded from the host carry their
// range (Storage::int_range, computed on the host as they were copied): when it lies in
// [0, rows) the op trusts them and never waits for the stream. Otherwise (ids written on
// the device, or a range that fails) a kernel flags the first out-of-range position in
// the backend's scratch; the op reads the flag back (one synchronisation) and throws the
// CPU backend's error before it writes anything. The table gradient is a deterministic scatter: no
// floating-point atomics; each id's positions are summed by segments of at most 32 in
// parallel, the segment sums (in the op's workspace) then added in segment order
// (kernels/embedding.cuh): an order fixed by the ids, not the CPU backend's.
#include <cstdint>

#include "backends/cuda/cuda_backend.h"
#include "kernels/embedding.cuh"
#include "remat/cuda_check.h"
#include "remat/error.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

namespace {

// Throws (as the CPU backend) if any id is outside [0, rows); names the first offending
// position.
void check_ids(const CudaBackend& be, const char* op, const Tensor& ids, int64_t rows, const char* table_name,
               const Tensor& table) {
  const Storage::IntRange* known = ids.storage()->int_range();
  if (known && known->lo >= 0 && known->hi < rows) return;  // checked on the host
  constexpr unsigned long long kNone = ~0ull;
  auto* flag = static_cast<unsigned long long*>(be.scratch());
  REMAT_CUDA_CHECK(cudaMemsetAsync(flag, 0xff, sizeof(*flag), be.stream()));  // kNone
  kernels::find_bad_id(ids.i32(), ids.numel(), rows, flag, be.stream());
  unsigned long long first = kNone;
  be.copy_to_host(&first, flag, sizeof(first));
  if (first == kNone) return;
  int32_t id = 0;
  be.copy_to_host(&id, ids.i32() + first, sizeof(id));
  const int64_t t = ids.size(1), i = static_cast<int64_t>(first);
  REMAT_THROW(op, ": ids[", i / t, ", ", i % t, "] = ", id, " is out of range [0, ", rows, ") of ", table_name, " ",
              table.str(), " (ids ", ids.str(), ")");
}

}  // namespace

void CudaBackend::embedding_forward_impl(const Tensor& ids, const Tensor& table, const Tensor& pos_table,
                                         const Tensor& y) {
  if (ids.numel() == 0) return;
  check_ids(*this, "embedding_forward", ids, table.size(0), "table", table);
  kernels::embedding_forward(ids.i32(), ids.numel(), ids.size(1), fbuf(table), table.size(1), fbuf(pos_table), fbuf(y),
                             stream_);
}

size_t CudaBackend::embedding_backward_workspace_impl(const Shape& dy) {
  return kernels::embedding_backward_table_workspace(dy[0] * dy[1], dy[2]);
}

void CudaBackend::embedding_backward_impl(const Tensor& dy, const Tensor& ids, const Tensor& dtable,
                                          const Tensor& dpos_table, const Tensor& workspace) {
  if (ids.numel() == 0) return;
  const int64_t c = dy.size(2);
  if (dtable.defined()) {
    check_ids(*this, "embedding_backward", ids, dtable.size(0), "dtable", dtable);
    // The kernels keep positions and ranks in int32.
    REMAT_CHECK(ids.numel() <= INT32_MAX, "embedding_backward: ", ids.numel(), " positions (at most ", INT32_MAX,
                " on the GPU)");
    kernels::embedding_backward_table(fbuf(dy), ids.i32(), ids.numel(), c, dtable.f32(), workspace.raw_data(), stream_);
  }
  if (dpos_table.defined())
    kernels::embedding_backward_pos(fbuf(dy), ids.size(0), ids.size(1), c, dpos_table.f32(), stream_);
}

REMAT_KERNELS_ABI_END
}  // namespace remat
