// Token (+ position) embedding: y[b, t] = table[ids[b, t]] (+ pos_table[t]).
//
// Backward scatters dy into dtable by id. Ids repeat, so rows of dtable receive several
// contributions: the work is split over fixed blocks of channels (never over tokens),
// and inside a block the tokens are added in their flat order, so there are no races
// and the result does not depend on the thread count. dpos_table is parallel over
// positions, summing the batch in order.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/mixed.h"
#include "backends/cpu/parallel.h"
#include "remat/error.h"

namespace remat {

namespace {

constexpr int64_t kChannelBlock = 16;  // one 64-byte cache line of floats
// Throws if any id is outside [0, rows); names the first offending position.
void check_ids(const char* op, const Tensor& ids, int64_t rows, const char* table_name, const Tensor& table) {
  const int32_t* id = ids.i32();
  const int64_t t = ids.size(1), n = ids.numel();
  for (int64_t i = 0; i < n; ++i) {
    if (id[i] < 0 || id[i] >= rows) {
      REMAT_THROW(op, ": ids[", i / t, ", ", i % t, "] = ", id[i], " is out of range [0, ", rows, ") of ", table_name,
                  " ", table.str(), " (ids ", ids.str(), ")");
    }
  }
}

}  // namespace

void CpuBackend::embedding_forward_impl(const Tensor& ids, const Tensor& table, const Tensor& pos_table,
                                        const Tensor& y) {
  check_ids("embedding_forward", ids, table.size(0), "table", table);
  const int64_t t = ids.size(1), n = ids.numel(), c = table.size(1);
  const int32_t* id = ids.i32();
  // table, pos_table and y may be bf16 (rows staged in fp32, mixed.h).
#pragma omp parallel for schedule(static) if (n * c >= cpu::kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) {
    cpu::F32Reader rtab(table, 0);
    cpu::F32Writer wy(y, 2);
    const float* src = rtab.row(id[i], c);
    float* dst = wy.row(i, c);
    if (pos_table.defined()) {
      cpu::F32Reader rpos(pos_table, 1);
      const float* pr = rpos.row(i % t, c);
      for (int64_t j = 0; j < c; ++j) dst[j] = src[j] + pr[j];
    } else if (c > 0) {
      std::memcpy(dst, src, static_cast<size_t>(c) * sizeof(float));
    }
    wy.put();
  }
}

size_t cpu::embedding_backward_workspace(const Shape&) { return 0; }

size_t CpuBackend::embedding_backward_workspace_impl(const Shape& dy) { return cpu::embedding_backward_workspace(dy); }

void CpuBackend::embedding_backward_impl(const Tensor& dy, const Tensor& ids, const Tensor& dtable,
                                         const Tensor& dpos_table, const Tensor& /*workspace: none needed*/) {
  const int64_t bsz = ids.size(0), t = ids.size(1), n = ids.numel(), c = dy.size(2);
  // dy may be bf16 (staged in fp32, mixed.h); dtable and dpos_table are f32 gradients.
  if (dtable.defined()) {
    check_ids("embedding_backward", ids, dtable.size(0), "dtable", dtable);
    const int32_t* id = ids.i32();
    float* dt = dtable.f32();
    const int64_t nblocks = (c + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) if (n * c >= cpu::kParallelMinWork)
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const int64_t j0 = blk * kChannelBlock;
      const int64_t w = std::min(kChannelBlock, c - j0);
      cpu::F32Reader rdy(dy, 0);
      for (int64_t i = 0; i < n; ++i) {
        float* dst = dt + static_cast<int64_t>(id[i]) * c + j0;
        const float* src = rdy.get(i * c + j0, w);
        for (int64_t k = 0; k < w; ++k) dst[k] += src[k];
      }
    }
  }
  if (dpos_table.defined()) {
    float* dp = dpos_table.f32();
#pragma omp parallel for schedule(static) if (n * c >= cpu::kParallelMinWork)
    for (int64_t p = 0; p < t; ++p) {
      float* dst = dp + p * c;
      cpu::F32Reader rdy(dy, 0);
      for (int64_t b = 0; b < bsz; ++b) {
        const float* src = rdy.row(b * t + p, c);
        for (int64_t k = 0; k < c; ++k) dst[k] += src[k];
      }
    }
  }
}

}  // namespace remat
