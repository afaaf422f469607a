// Token (+ position) embedding kernels: the gather forward, and a deterministic scatter
// backward (no floating-point atomics).
#pragma once

#include <cuda_runtime.h>

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

// dtable[ids[i], :] += dy[i, :] for i < n. Each row of dtable is owned by the first
// position that uses its id, which adds the rows of dy with that id in position order:
// the same operations, in the same order, as the CPU backend.
void embedding_backward_table(FloatBuf dy, const int32_t* ids, int64_t n, int64_t c, float* dtable,
                              cudaStream_t stream);

// dpos[p, :] += dy[b, p, :] for p < t, over b = 0, 1, ..., batch - 1 in order.
void embedding_backward_pos(FloatBuf dy, int64_t batch, int64_t t, int64_t c, float* dpos, cudaStream_t stream);

}  // namespace remat::kernels
