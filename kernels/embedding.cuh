// Token (+ position) embedding kernels: the gather forward, and a deterministic scatter
// backward (no floating-point atomics).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/bf16.cuh"

namespace remat::kernels {

// *first_bad = min(*first_bad, i) over the positions i < n whose id is outside [0, rows)
// (the caller sets it to UINT64_MAX first). The other kernels assume valid ids.
void find_bad_id(const int32_t* ids, int64_t n, int64_t rows, unsigned long long* first_bad, cudaStream_t stream);

// y[i, :] = table[ids[i], :] (+ pos[i % t, :] when pos is not null) for i < n, rows of
// width c.
void embedding_forward(const int32_t* ids, int64_t n, int64_t t, FloatBuf table, int64_t c, FloatBuf pos, FloatBuf y,
                       cudaStream_t stream);

// The table gradient splits each id's positions (in position order) into segments of at
// most kEmbeddingSegment positions: segment k holds the id's occurrences k S, ..., k S + S - 1.
constexpr int64_t kEmbeddingSegment = 32;

// Workspace slots for segment sums: every segment but an id's first needs one, and there
// are at most (n - 1) / S of those (an id with m positions has ceil(m / S) - 1 of them).
inline int64_t embedding_segment_slots(int64_t n) { return n > 0 ? (n - 1) / kEmbeddingSegment : 0; }

// The workspace of embedding_backward_table: the slots' sums (c floats each), then the
// rank of each position among its id's (n int32), then each slot's first position (int32).
inline size_t embedding_backward_table_workspace(int64_t n, int64_t c) {
  const int64_t slots = embedding_segment_slots(n);
  return static_cast<size_t>(slots * c + n + slots) * 4;
}

// dtable[ids[i], :] += dy[i, :] for i < n (workspace: embedding_backward_table_workspace
// bytes). No atomics and no host wait; the order depends on the ids alone (the same bits
// every run), not the CPU backend's order: dtable[id] + (its segment 0's rows in position
// order), then + each further segment's sum (its rows in position order from 0) in
// segment order.
void embedding_backward_table(FloatBuf dy, const int32_t* ids, int64_t n, int64_t c, float* dtable, void* workspace,
                              cudaStream_t stream);

// dpos[p, :] += dy[b, p, :] for p < t, over b = 0, 1, ..., batch - 1 in order.
void embedding_backward_pos(FloatBuf dy, int64_t batch, int64_t t, int64_t c, float* dpos, cudaStream_t stream);

}  // namespace remat::kernels
