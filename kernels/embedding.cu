#include "kernels/embedding.cuh"
#include "kernels/launch.cuh"
#include "kernels/reduce.cuh"
#include "kernels/vec4.cuh"

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace remat::kernels {

namespace {

constexpr int kBlock = 256;
constexpr int64_t kMaxBlocks = 65535;

unsigned grid_for(int64_t units) {
  return static_cast<unsigned>(std::min(ceil_div<int64_t>(units, kBlock), kMaxBlocks));
}

// *first_bad = min(*first_bad, i) for every i < n with ids[i] outside [0, rows).
__global__ void find_bad_id_kernel(const int32_t* ids, int64_t n, int64_t rows, unsigned long long* first_bad) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    if (ids[i] < 0 || ids[i] >= rows) atomicMin(first_bad, static_cast<unsigned long long>(i));
}

// One thread per unit of a row of y: a float4 when kVec4 (c % 4 == 0, 16-byte aligned
// rows), else a float. Grid-stride over all n rows.
template <bool kVec4>
__global__ void embedding_forward_kernel(const int32_t* ids, int64_t n, int64_t t, const float* table, int64_t c,
                                         const float* pos, float* y) {
  using Unit = typename std::conditional<kVec4, float4, float>::type;
  const int64_t width = kVec4 ? c / 4 : c;  // units per row
  const int64_t total = n * width, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < total; u += stride) {
    const int64_t i = u / width, k = u % width;
    Unit v = load_unit(reinterpret_cast<const Unit*>(table + static_cast<int64_t>(ids[i]) * c) + k);
    if (pos) {
      const Unit p = load_unit(reinterpret_cast<const Unit*>(pos + (i % t) * c) + k);
      if constexpr (kVec4) {
        v.x += p.x;
        v.y += p.y;
        v.z += p.z;
        v.w += p.w;
      } else {
        v += p;
      }
    }
    store_unit(reinterpret_cast<Unit*>(y + i * c) + k, v);
  }
}

// The same over typed pointers (bf16.cuh) when a tensor is bf16: the sum in fp32, rounded
// once into a bf16 y (without pos the row is copied: the value itself, -0 kept). All bf16
// with c % 8 == 0 and 16-byte aligned rows: units of eight bf16 (16 bytes).
template <int kWidth, typename PT, typename PP, typename PY>
__global__ void embedding_forward_typed_kernel(const int32_t* ids, int64_t n, int64_t t, PT table, int64_t c, PP pos,
                                               PY y) {
  const int64_t width = c / kWidth;  // units per row (kWidth divides c)
  const int64_t total = n * width, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < total; u += stride) {
    const int64_t i = u / width, k = u % width;
    const auto src = table + static_cast<int64_t>(ids[i]) * c;
    const auto dst = y + i * c;
    float v[kWidth];
    if constexpr (kWidth == 8) {
      load8(src, k, v);
    } else {
      v[0] = ld(src, k);
    }
    if (pos) {
      float p[kWidth];
      if constexpr (kWidth == 8) {
        load8(pos + (i % t) * c, k, p);
      } else {
        p[0] = ld(pos + (i % t) * c, k);
      }
      for (int e = 0; e < kWidth; ++e) v[e] += p[e];
    }
    if constexpr (kWidth == 8) {
      store8(dst, k, v);
    } else {
      st(dst, k, v[0]);
    }
  }
}

// Table gradient, in three launches without atomics or host waits (S = kEmbeddingSegment):
// 1. rank[i] = the number of positions j < i with ids[j] == ids[i] (a warp per position
//    scans the ids before it, kScanTiles tiles of 32 at a time: O(n^2) reads of the
//    cache-resident ids, no sort).
// 2. A warp per (position i with rank[i] % S == 0, chunk of kChunk channels) sums the rows
//    of its segment: the S (or fewer) positions j >= i with the id, in order of j. Segment 0
//    adds them to the id's row of dtable; segment k >= 1 stores its sum in the workspace
//    slot numbered by the segment starts of rank >= S before i (so slots follow position
//    order, and an id's slots follow its segment order).
// 3. A warp per (slot of a segment 1, chunk) adds its id's slot sums to the id's row of
//    dtable in slot order.
// An id at m positions is summed by ceil(m / S) warps in parallel, then ceil(m / S) - 1
// segment sums in order (the warp of its first position used to add all m rows alone).
// Lane l handles channels c0 + l, c0 + l + 32, ... (coalesced).
constexpr int kWarpsPerBlock = 4;
constexpr int kPerLane = 8;
constexpr int64_t kChunk = 32 * kPerLane;
constexpr int kScanTiles = 4;
constexpr int64_t kScanStep = 32 * kScanTiles;
constexpr int32_t kSeg = static_cast<int32_t>(kEmbeddingSegment);

// match[q]: ballot of the positions j0 + 32 q + lane below `end` that hold `id`.
__device__ REMAT_INLINE void match_tiles(const int32_t* ids, int64_t j0, int64_t end, int32_t id, int lane,
                                         unsigned (&match)[kScanTiles]) {
  int32_t v[kScanTiles];
  for (int q = 0; q < kScanTiles; ++q) {
    const int64_t j = j0 + 32 * q + lane;
    v[q] = j < end ? ids[j] : -1;  // valid ids are >= 0
  }
  for (int q = 0; q < kScanTiles; ++q) match[q] = __ballot_sync(kFullMask, v[q] == id);
}

// Launch 1; also marks every slot unused (slot_pos = -1) before launch 2 numbers them.
__global__ void embedding_rank_kernel(const int32_t* ids, int64_t n, int64_t slots, int32_t* rank, int32_t* slot_pos) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (i >= n) return;  // the whole warp
  const int32_t id = ids[i];
  unsigned match[kScanTiles];
  int32_t count = 0;
  for (int64_t j0 = 0; j0 < i; j0 += kScanStep) {
    match_tiles(ids, j0, i, id, lane, match);
    for (int q = 0; q < kScanTiles; ++q) count += __popc(match[q]);
  }
  if (lane == 0) {
    rank[i] = count;
    if (i < slots) slot_pos[i] = -1;
  }
}

// Launch 2.
template <typename PDY>
__global__ void embedding_segment_kernel(PDY dy, const int32_t* ids, const int32_t* rank, int64_t n, int64_t c,
                                         float* dtable, float* sums, int32_t* slot_pos) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (i >= n) return;
  const int32_t r = rank[i];
  if (r % kSeg != 0) return;  // inside a segment
  const int32_t id = ids[i];
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kChunk;
  float* dst = dtable + static_cast<int64_t>(id) * c;
  if (r > 0) {  // a further segment: its slot is the number of such starts before i
    int64_t slot = 0;
    for (int64_t j0 = 0; j0 < i; j0 += 32) {
      const int64_t j = j0 + lane;
      const int32_t rj = j < i ? rank[j] : 0;
      slot += __popc(__ballot_sync(kFullMask, rj >= kSeg && rj % kSeg == 0));
    }
    dst = sums + slot * c;
    if (blockIdx.y == 0 && lane == 0) slot_pos[slot] = static_cast<int32_t>(i);
  }
  float acc[kPerLane];
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t col = c0 + k * 32 + lane;
    acc[k] = r == 0 && col < c ? dst[col] : 0.0f;
  }
  unsigned match[kScanTiles];
  int32_t left = kSeg;  // rows still to add (the same in every lane: ballots)
  for (int64_t j0 = i; j0 < n && left > 0; j0 += kScanStep) {
    match_tiles(ids, j0, n, id, lane, match);
    for (int q = 0; q < kScanTiles; ++q) {
      for (unsigned m = match[q]; m != 0 && left > 0; m &= m - 1, --left) {  // in order of position
        const auto src = dy + (j0 + 32 * q + __ffs(static_cast<int>(m)) - 1) * c;
        for (int k = 0; k < kPerLane; ++k) {
          const int64_t col = c0 + k * 32 + lane;
          if (col < c) acc[k] += ld(src, col);
        }
      }
    }
  }
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t col = c0 + k * 32 + lane;
    if (col < c) dst[col] = acc[k];
  }
}

// Launch 3: the warp of slot s returns unless s holds its id's segment 1; then it adds the
// sums of the slots s' >= s of the same id, in slot order. Unused slots have slot_pos -1.
__global__ void embedding_add_segments_kernel(const int32_t* ids, const int32_t* rank, const int32_t* slot_pos,
                                              const float* sums, int64_t slots, int64_t c, float* dtable) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t s = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (s >= slots) return;
  const int32_t p = slot_pos[s];
  if (p < 0 || rank[p] != kSeg) return;
  const int32_t id = ids[p];
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kChunk;
  float* dst = dtable + static_cast<int64_t>(id) * c;
  float acc[kPerLane];
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t col = c0 + k * 32 + lane;
    acc[k] = col < c ? dst[col] : 0.0f;
  }
  for (int64_t s0 = s; s0 < slots; s0 += 32) {
    const int64_t t = s0 + lane;
    const int32_t q = t < slots ? slot_pos[t] : -1;
    for (unsigned m = __ballot_sync(kFullMask, q >= 0 && ids[q] == id); m != 0; m &= m - 1) {  // in slot order
      const float* src = sums + (s0 + __ffs(static_cast<int>(m)) - 1) * c;
      for (int k = 0; k < kPerLane; ++k) {
        const int64_t col = c0 + k * 32 + lane;
        if (col < c) acc[k] += src[col];
      }
    }
  }
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t col = c0 + k * 32 + lane;
    if (col < c) dst[col] = acc[k];
  }
}

// Position gradient: one thread per unit of dpos[p, :] (float4 when kVec4), adding the
// batch in order. A bf16 dy: one element per thread, widened (the same sums).
template <typename PDY>
__global__ void embedding_backward_pos_typed_kernel(PDY dy, int64_t batch, int64_t t, int64_t c, float* dpos) {
  const int64_t total = t * c, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < total; u += stride) {
    float acc = dpos[u];
    for (int64_t b = 0; b < batch; ++b) acc += ld(dy, b * total + u);
    dpos[u] = acc;
  }
}

template <bool kVec4>
__global__ void embedding_backward_pos_kernel(const float* dy, int64_t batch, int64_t t, int64_t c, float* dpos) {
  using Unit = typename std::conditional<kVec4, float4, float>::type;
  const int64_t width = kVec4 ? c / 4 : c;
  const int64_t total = t * width, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const Unit* src = reinterpret_cast<const Unit*>(dy);
  Unit* dst = reinterpret_cast<Unit*>(dpos);
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < total; u += stride) {
    Unit acc = load_unit(dst + u);
    for (int64_t b = 0; b < batch; ++b) {
      const Unit g = load_unit(src + b * total + u);
      if constexpr (kVec4) {
        acc.x += g.x;
        acc.y += g.y;
        acc.z += g.z;
        acc.w += g.w;
      } else {
        acc += g;
      }
    }
    store_unit(dst + u, acc);
  }
}

}  // namespace

void find_bad_id(const int32_t* ids, int64_t n, int64_t rows, unsigned long long* first_bad, cudaStream_t stream) {
  REMAT_LAUNCH(find_bad_id_kernel, dim3(grid_for(n)), dim3(kBlock), 0, stream, ids, n, rows, first_bad);
}

void embedding_forward(const int32_t* ids, int64_t n, int64_t t, FloatBuf table_buf, int64_t c, FloatBuf pos_buf,
                       FloatBuf y_buf, cudaStream_t stream) {
  if (!table_buf.bf16 && !pos_buf.bf16 && !y_buf.bf16) {  // the fp32 kernel
    const auto* table = static_cast<const float*>(table_buf.p);
    const auto* pos = static_cast<const float*>(pos_buf.p);
    auto* y = static_cast<float*>(y_buf.p);
    const bool vec4 = c % 4 == 0 && aligned16(table) && aligned16(y) && (pos == nullptr || aligned16(pos));
    const int64_t units = n * (vec4 ? c / 4 : c);
    if (vec4)
      REMAT_LAUNCH(embedding_forward_kernel<true>, dim3(grid_for(units)), dim3(kBlock), 0, stream, ids, n, t, table, c,
                   pos, y);
    else
      REMAT_LAUNCH(embedding_forward_kernel<false>, dim3(grid_for(units)), dim3(kBlock), 0, stream, ids, n, t, table, c,
                   pos, y);
    return;
  }
  with_types(
      [&](auto table, auto pos, auto y) {
        using PT = decltype(table);
        using PP = decltype(pos);
        using PY = decltype(y);
        if constexpr (is_bf16_ptr<PT>) {
          if (c % 8 == 0 && aligned16(table_buf.p) && aligned16(y_buf.p) && (!pos_buf.p || aligned16(pos_buf.p))) {
            REMAT_LAUNCH((embedding_forward_typed_kernel<8, PT, PP, PY>), dim3(grid_for(n * (c / 8))), dim3(kBlock), 0,
                         stream, ids, n, t, table, c, pos, y);
            return;
          }
        }
        REMAT_LAUNCH((embedding_forward_typed_kernel<1, PT, PP, PY>), dim3(grid_for(n * c)), dim3(kBlock), 0, stream,
                     ids, n, t, table, c, pos, y);
      },
      table_buf, pos_buf, y_buf);
}

void embedding_backward_table(FloatBuf dy, const int32_t* ids, int64_t n, int64_t c, float* dtable, void* workspace,
                              cudaStream_t stream) {
  if (n == 0 || c == 0) return;
  const int64_t slots = embedding_segment_slots(n);
  auto* sums = static_cast<float*>(workspace);  // [slots, c], then rank [n], slot_pos [slots]
  auto* rank = reinterpret_cast<int32_t*>(sums + slots * c);
  int32_t* slot_pos = rank + n;
  const auto warps_for = [](int64_t units) { return static_cast<unsigned>(ceil_div<int64_t>(units, kWarpsPerBlock)); };
  const auto chunks = static_cast<unsigned>(ceil_div<int64_t>(c, kChunk));
  REMAT_LAUNCH(embedding_rank_kernel, dim3(warps_for(n)), dim3(32 * kWarpsPerBlock), 0, stream, ids, n, slots, rank,
               slot_pos);
  with_types(
      [&](auto pdy) {
        REMAT_LAUNCH(embedding_segment_kernel<decltype(pdy)>, dim3(warps_for(n), chunks), dim3(32 * kWarpsPerBlock), 0,
                     stream, pdy, ids, rank, n, c, dtable, sums, slot_pos);
      },
      dy);
  if (slots > 0)
    REMAT_LAUNCH(embedding_add_segments_kernel, dim3(warps_for(slots), chunks), dim3(32 * kWarpsPerBlock), 0, stream,
                 ids, rank, slot_pos, sums, slots, c, dtable);
}

void embedding_backward_pos(FloatBuf dy_buf, int64_t batch, int64_t t, int64_t c, float* dpos, cudaStream_t stream) {
  if (dy_buf.bf16) {
    const auto* dy = static_cast<const bf16*>(dy_buf.p);
    REMAT_LAUNCH(embedding_backward_pos_typed_kernel<const bf16*>, dim3(grid_for(t * c)), dim3(kBlock), 0, stream, dy,
                 batch, t, c, dpos);
    return;
  }
  const auto* dy = static_cast<const float*>(dy_buf.p);
  const bool vec4 = c % 4 == 0 && aligned16(dy) && aligned16(dpos);
  const int64_t units = t * (vec4 ? c / 4 : c);
  if (vec4)
    REMAT_LAUNCH(embedding_backward_pos_kernel<true>, dim3(grid_for(units)), dim3(kBlock), 0, stream, dy, batch, t, c,
                 dpos);
  else
    REMAT_LAUNCH(embedding_backward_pos_kernel<false>, dim3(grid_for(units)), dim3(kBlock), 0, stream, dy, batch, t, c,
                 dpos);
}

}  // namespace remat::kernels
