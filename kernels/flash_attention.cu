// Fused (flash) attention: FlashAttention-2 (Dao 2023) on the device, the algorithm of the
// CPU backend's src/backends/cpu/flash_attention.cpp (whose header comment gives the
// formulas, masks and dropout indices), never a [T, T] buffer.
//
// Blocks of 128 threads (four warps). Every tile of an operand is staged in shared memory
// (K, V, and per kernel Q, dO), and so is each score tile S (f32); the tile products
// (S = Q K^T, dP = dO V^T, O += P V, dV += (P o Z)^T dO, dK += dS^T Q, dQ += dS K) read
// their operands from shared memory and accumulate into registers laid out as the
// accumulator fragments of the tensor cores' m16n8k16 mma (mma_layout below), in both
// precisions:
//   - fp32: SIMT fused multiply-adds, one chain per element in k order;
//   - bf16 (FlashProblem::bf16): bf16 tiles in shared memory, P and dS rounded to bf16
//     for their products, fp32 accumulation: on sm_80+ the warp-level
//     mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (inline PTX); elsewhere (the
//     emulator, older GPUs) the same instruction emulated in plain CUDA C++ through a
//     per-warp shared-memory exchange of the very same fragments, so the emulator checks
//     the fragment indexing. Operand fragments are gathered from shared memory with
//     32-bit loads where a pair is contiguous and two 16-bit loads where it is not
//     (ldmatrix, which would do it in one instruction, is not emulated).
// The row work of the online softmax (maxima, sums, dropout, dS) goes one warp per row of
// the score tile, lane l taking columns l and l + 32.
//
// Kernels: forward, one block per (query tile, head, batch element); backward: delta =
// rowsum(dout o out), one warp per row; the key pass, one block per (key tile, key/value
// head, batch element), sums dK and dV over the group's query heads and the query tiles
// in order; the query pass, one block per (query tile, head, batch element), sums dQ over
// the key tiles in order. Every block writes only its own rows, every sum has a fixed
// order (no atomics, no lane-order dependence): results are bitwise reproducible.
//
// Left for later, all performance: ldmatrix and cp.async double buffering of the tiles, P
// kept in registers between the forward's two products, wider global loads.
#include "kernels/flash_attention.cuh"

#include <math.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/attention_dropout.cuh"
#include "kernels/bf16.cuh"
#include "kernels/launch.cuh"
#include "kernels/reduce.cuh"
#include "remat/error.h"

namespace remat::kernels {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;

// ---- Tiles ------------------------------------------------------------------------------
// D is the head dimension the tiles hold (d padded with zero columns up to it). Each block
// keeps at most 64 accumulators per thread (a [64, 128], [32, 256] or two [16, 256]
// tiles); shared memory stays under an A100's 163 KiB in fp32 (fp32 query pass at
// D = 256: 142 KiB), about half that in bf16.
template <int D>
struct ForwardTiles {
  static constexpr int bq = D <= 128 ? 64 : 32, bk = D <= 128 ? 64 : 32;
};
template <int D>
struct QueryPassTiles {
  static constexpr int bq = D <= 128 ? 64 : 32, bk = D <= 64 ? 64 : 32;
};
template <int D>
struct KeyPassTiles {
  static constexpr int bq = D <= 128 ? 64 : 32, bk = D <= 64 ? 64 : D <= 128 ? 32 : 16;
};

// Shared-memory element of the operand tiles: f32, or the bits of a bf16.
template <bool kBf16>
struct Smem;
template <>
struct Smem<false> {
  using T = float;
  static constexpr int pad = 4;  // row strides of 4k + 4 words: the 8 rows a warp reads hit 8 banks
};
template <>
struct Smem<true> {
  using T = uint16_t;
  static constexpr int pad = 8;
};

__device__ REMAT_INLINE float bf16_bits_to_float(uint16_t u) { return __uint_as_float(static_cast<uint32_t>(u) << 16); }
__device__ REMAT_INLINE uint16_t float_to_bf16_bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

// Shared-memory byte offsets, each a multiple of 16.
constexpr size_t align16(size_t n) { return (n + 15) / 16 * 16; }

// ---- Accumulator fragments ----------------------------------------------------------------
// A [M, N] f32 tile in registers, distributed as the C/D fragments of mma.m16n8k16: the
// tile is cut into 16 x 8 pieces; the four warps form a WM x WN grid (WM = min(4, M / 16)),
// warp (wm, wn) holding MT x NT pieces, rows (wm MT + i) 16 .. and columns (wn NT + j) 8 ..;
// in a piece lane l (g = l / 4, t = l % 4) holds c[0], c[1] at row g, columns 2t, 2t + 1,
// and c[2], c[3] at row g + 8, the same columns.
template <int M, int N>
struct Frag {
  static constexpr int WM = M / 16 >= kWarps ? kWarps : M / 16, WN = kWarps / WM;
  static constexpr int MT = M / 16 / WM, NT = N / 8 / WN;
  static_assert(M % 16 == 0 && WM * WN == kWarps && MT * WM * 16 == M && NT * WN * 8 == N,
                "flash attention: a tile the four warps cannot share");
  float c[MT][NT][4];

  __device__ REMAT_INLINE void zero() {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) c[i][j][e] = 0.0f;
  }
  __device__ static REMAT_INLINE int row(int i, int e) {
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    return (warp % WM * MT + i) * 16 + lane / 4 + (e >= 2 ? 8 : 0);
  }
  __device__ static REMAT_INLINE int col(int j, int e) {
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    return (warp / WM * NT + j) * 8 + lane % 4 * 2 + (e & 1);
  }
  // f(row, col, value&) for every element this thread holds.
  template <typename F>
  __device__ REMAT_INLINE void for_each(F&& f) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) f(row(i, e), col(j, e), c[i][j][e]);
  }
  // dst[row * ld + col] = the tile (f32 shared memory).
  __device__ REMAT_INLINE void store(float* dst, int ld) {
    for_each([&](int r, int cc, float& v) { dst[r * ld + cc] = v; });
  }
};

// ---- Tile products: acc[M, N] += A[M, K] B[K, N], operands in shared memory ---------------
// A(m, k) = a[m lda + k] (row-major), or a[k lda + m] with kATrans (A is a stored tile's
// transpose); B(k, n) = b[n ldb + k] (B is a stored [N, K] tile's transpose, e.g. K^T), or
// b[k ldb + n] with kBRows (a stored [K, N] tile). K a multiple of 16.

// fp32: each element one fused multiply-add chain, k = 0, 1, ... in order.
template <int K, bool kATrans, bool kBRows, int M, int N>
__device__ REMAT_INLINE void tile_product(Frag<M, N>& acc, const float* a, int lda, const float* b, int ldb) {
  using F = Frag<M, N>;
  for (int k = 0; k < K; ++k) {
    float av[F::MT][2];
#pragma unroll
    for (int i = 0; i < F::MT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = F::row(i, 2 * h);
        av[i][h] = kATrans ? a[k * lda + m] : a[m * lda + k];
      }
#pragma unroll
    for (int j = 0; j < F::NT; ++j) {
      const int n = F::col(j, 0);
      const float b0 = kBRows ? b[k * ldb + n] : b[n * ldb + k];
      const float b1 = kBRows ? b[k * ldb + n + 1] : b[(n + 1) * ldb + k];
#pragma unroll
      for (int i = 0; i < F::MT; ++i) {
        acc.c[i][j][0] = fmaf(av[i][0], b0, acc.c[i][j][0]);
        acc.c[i][j][1] = fmaf(av[i][0], b1, acc.c[i][j][1]);
        acc.c[i][j][2] = fmaf(av[i][1], b0, acc.c[i][j][2]);
        acc.c[i][j][3] = fmaf(av[i][1], b1, acc.c[i][j][3]);
      }
    }
  }
}

// Two bf16 as one 32-bit register, the first in the low half (the fragments' order).
__device__ REMAT_INLINE uint32_t pack2(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}
// Two contiguous bf16 (p 4-byte aligned) as one register.
__device__ REMAT_INLINE uint32_t load_pair(const uint16_t* p) {
#if defined(REMAT_EMULATE)
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));  // the host compiler's aliasing rules
  return v;
#else
  return *reinterpret_cast<const uint32_t*>(p);
#endif
}

// One warp: c (a C fragment) += a (A fragment, 16 x 16, row-major) * b (B fragment, 16 x 8,
// column-major), bf16 products summed in fp32. Fragments (PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type"), g = lane / 4, t = lane % 4:
//   a[0]: A(g, 2t .. 2t+1)   a[1]: A(g+8, 2t ..)   a[2]: A(g, 2t+8 ..)   a[3]: A(g+8, 2t+8 ..)
//   b[0]: B(2t .. 2t+1, g)   b[1]: B(2t+8 .., g)
//   c[0], c[1]: C(g, 2t .. 2t+1)   c[2], c[3]: C(g+8, 2t .. 2t+1)
__device__ REMAT_INLINE void mma_bf16_16x8x16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  // The warp's fragments go through shared memory; each lane then computes its four C
  // elements from the A row and B column they belong to, found by the layout above (a
  // wrong fragment index anywhere gives a wrong product). Summed in k order: a tensor
  // core's additions round differently.
  __shared__ uint32_t frag_a[kWarps][32][4];
  __shared__ uint32_t frag_b[kWarps][32][2];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  for (int r = 0; r < 4; ++r) frag_a[warp][lane][r] = a[r];
  for (int r = 0; r < 2; ++r) frag_b[warp][lane][r] = b[r];
  __syncwarp();
  auto half = [](uint32_t reg, int k) { return __uint_as_float(k & 1 ? reg & 0xffff0000u : reg << 16); };
  for (int e = 0; e < 4; ++e) {
    const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
    float s = c[e];
    for (int k = 0; k < 16; ++k) {
      const float x = half(frag_a[warp][4 * (row % 8) + k % 8 / 2][(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k);
      const float y = half(frag_b[warp][4 * col + k % 8 / 2][k >= 8 ? 1 : 0], k);
      s = fmaf(x, y, s);
    }
    c[e] = s;
  }
  __syncwarp();  // the next call overwrites the fragments
#endif
}

// bf16: the warp's fragments of A and B gathered from shared memory, one mma per 16 x 8
// piece and 16 of k.
template <int K, bool kATrans, bool kBRows, int M, int N>
__device__ REMAT_INLINE void tile_product(Frag<M, N>& acc, const uint16_t* a, int lda, const uint16_t* b, int ldb) {
  using F = Frag<M, N>;
  const int lane = static_cast<int>(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  auto a_pair = [&](int m, int k) {  // A(m, k), A(m, k + 1)
    return kATrans ? pack2(a[k * lda + m], a[(k + 1) * lda + m]) : load_pair(a + m * lda + k);
  };
  auto b_pair = [&](int k, int n) {  // B(k, n), B(k + 1, n)
    return kBRows ? pack2(b[k * ldb + n], b[(k + 1) * ldb + n]) : load_pair(b + n * ldb + k);
  };
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t af[F::MT][4];
#pragma unroll
    for (int i = 0; i < F::MT; ++i) {
      const int m = F::row(i, 0);  // g of this piece
      af[i][0] = a_pair(m, k0 + 2 * t);
      af[i][1] = a_pair(m + 8, k0 + 2 * t);
      af[i][2] = a_pair(m, k0 + 2 * t + 8);
      af[i][3] = a_pair(m + 8, k0 + 2 * t + 8);
    }
#pragma unroll
    for (int j = 0; j < F::NT; ++j) {
      const int n = F::col(j, 0) - 2 * t + g;  // column g of this piece
      const uint32_t bf[2] = {b_pair(k0 + 2 * t, n), b_pair(k0 + 2 * t + 8, n)};
#pragma unroll
      for (int i = 0; i < F::MT; ++i) mma_bf16_16x8x16(acc.c[i][j], af[i], bf);
    }
  }
}

// ---- Global memory -----------------------------------------------------------------------

// Rows [t0, t0 + n) of head `head` of x ([B, t_len, x.w], the head's d columns at x.col +
// head d) of batch element b into dst[ROWS, D] (row stride ld): rows past n and columns
// past d are zero (the products then add exact zeros; shared memory is never read unset).
template <int D, int ROWS, typename T>
__device__ REMAT_INLINE void load_tile(T* dst, int ld, const FlashOperand& x, int64_t t_len, int64_t b, int64_t t0,
                                       int n, int64_t head, int d) {
  const T* src = static_cast<const T*>(x.data) + (b * t_len + t0) * x.w + x.col + head * d;
  for (int idx = static_cast<int>(threadIdx.x); idx < ROWS * D; idx += kThreads) {
    const int r = idx / D, c = idx % D;
    dst[r * ld + c] = r < n && c < d ? src[r * x.w + c] : T(0);
  }
}

__device__ REMAT_INLINE float to_elem(float v, float*) { return v; }
__device__ REMAT_INLINE uint16_t to_elem(float v, uint16_t*) { return float_to_bf16_bits(v); }

// acc * mul(row), in the output's element type, into rows [t0, t0 + n) of head `head` of y
// (columns < d only): staged in `stage` ([M, ld], a tile of shared memory the block has
// finished with), then written a row at a time, consecutive threads on consecutive columns
// (the fragments' own stores would cover each 32-byte sector with two instructions).
template <int M, int N, typename T, typename Mul>
__device__ REMAT_INLINE void store_tile(Frag<M, N>& acc, T* stage, int ld, const FlashOutput& y, int64_t t_len,
                                        int64_t b, int64_t t0, int n, int64_t head, int d, Mul&& mul) {
  __syncthreads();  // the staging tile's last readers are done
  acc.for_each([&](int r, int c, float& v) { stage[r * ld + c] = to_elem(v * mul(r), stage); });
  __syncthreads();
  T* dst = static_cast<T*>(y.data) + (b * t_len + t0) * y.w + y.col + head * d;
  for (int idx = static_cast<int>(threadIdx.x); idx < M * N; idx += kThreads) {
    const int r = idx / N, c = idx % N;
    if (r < n && c < d) dst[r * y.w + c] = stage[r * ld + c];
  }
}

__device__ REMAT_INLINE int64_t kv_len(const FlashProblem& p, int64_t b) { return p.kv_lens ? p.kv_lens[b] : p.tk; }

// Keys of the tile [j0, j0 + nk) visible to query i.
__device__ REMAT_INLINE int visible(const FlashProblem& p, int64_t i, int64_t j0, int nk) {
  if (!p.causal) return nk;
  const int64_t v = i + 1 - j0;
  return v <= 0 ? 0 : v < nk ? static_cast<int>(v) : nk;
}

// The Philox word of probability element (b, h, i, j0): ((b H + h) tq + i) tk + j0.
__device__ REMAT_INLINE uint64_t dropout_word(const FlashProblem& p, int64_t b, int64_t h, int64_t i, int64_t j0) {
  return p.drop.offset + static_cast<uint64_t>(((b * p.h + h) * p.tq + i) * p.tk + j0);
}

// ---- Forward -------------------------------------------------------------------------------

template <int D, bool kBf16>
struct ForwardLayout {
  using T = typename Smem<kBf16>::T;
  static constexpr int bq = ForwardTiles<D>::bq, bk = ForwardTiles<D>::bk;
  static constexpr int ldx = D + Smem<kBf16>::pad, lds = bk + 4, ldp = bk + 8;
  static constexpr size_t q = 0, k = align16(q + sizeof(T) * bq * ldx), v = align16(k + sizeof(T) * bk * ldx),
                          s = align16(v + sizeof(T) * bk * ldx), pb = align16(s + sizeof(float) * bq * lds),
                          alpha = align16(pb + (kBf16 ? sizeof(uint16_t) * bq * ldp : 0)),
                          m = align16(alpha + sizeof(float) * bq), l = align16(m + sizeof(float) * bq),
                          bytes = align16(l + sizeof(float) * bq);
};

// The online-softmax step of one score tile (raw scores in s, [bq, lds]): per row, the new
// maximum m, P = exp(scale s - m) on the visible keys (0 elsewhere), l = l alpha + rowsum P,
// alpha[r] = exp(m_old - m) for the accumulator, then P o Z into the P operand (s itself in
// fp32, pb in bf16). Warp w owns rows w, w + 4, ... (and their m, l, alpha).
template <int BQ, int BK, bool kBf16>
__device__ REMAT_INLINE void forward_rows(const FlashProblem& p, float* s, int lds, uint16_t* pb, int ldp, float* alpha,
                                          float* m, float* l, int64_t b, int64_t h, int64_t i0, int nq, int64_t j0,
                                          int nk) {
  constexpr int kPer = (BK + 31) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  for (int r = warp; r < BQ; r += kWarps) {
    const int vis = r < nq ? visible(p, i0 + r, j0, nk) : 0;
    float* row = s + r * lds;
    if (vis == 0) {  // the whole warp: nothing visible, the row's state stays
      for (int j = lane; j < BK; j += 32) {
        if (kBf16)
          pb[r * ldp + j] = 0;
        else
          row[j] = 0.0f;
      }
      if (lane == 0) alpha[r] = 1.0f;
      continue;
    }
    float x[kPer];
    float mx = -INFINITY;
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int j = lane + 32 * u;
      x[u] = j < vis ? row[j] * p.scale : -INFINITY;
      mx = fmaxf(mx, x[u]);
    }
    mx = warp_max(mx);
    const float m_old = m[r], l_old = l[r];
    const float m_new = fmaxf(m_old, mx);
    const float a = expf(m_old - m_new);  // 0 at the first visible tile (m = -inf)
    float sum = 0.0f;
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int j = lane + 32 * u;
      if (j >= BK) continue;
      const float pj = j < vis ? expf(x[u] - m_new) : 0.0f;
      sum += pj;
      if (kBf16 && !p.drop.on)
        pb[r * ldp + j] = float_to_bf16_bits(pj);
      else if (kBf16 && j >= vis)
        pb[r * ldp + j] = 0;
      else
        row[j] = pj;
    }
    sum = warp_sum(sum);
    __syncwarp();  // every lane has read m[r] and l[r]
    if (lane == 0) m[r] = m_new, l[r] = l_old * a + sum, alpha[r] = a;
    if (p.drop.on) {
      __syncwarp();  // the factors come to other lanes than the ones that wrote P
      for_each_dropout_factor_coalesced(p.drop, dropout_word(p, b, h, i0 + r, j0), vis, lane,
                                        [&](int64_t j, float factor) {
                                          const float pz = row[j] * factor;
                                          if (kBf16)
                                            pb[r * ldp + j] = float_to_bf16_bits(pz);
                                          else
                                            row[j] = pz;
                                        });
    }
  }
}

template <int D, bool kBf16>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(FlashProblem p, FlashOperand q, FlashOperand k, FlashOperand v, FlashOutput out, float* lse) {
  using L = ForwardLayout<D, kBf16>;
  using T = typename L::T;
  constexpr int BQ = L::bq, BK = L::bk;
  REMAT_DYNAMIC_SHARED(unsigned char, smem);
  T* q_s = reinterpret_cast<T*>(smem + L::q);
  T* k_s = reinterpret_cast<T*>(smem + L::k);
  T* v_s = reinterpret_cast<T*>(smem + L::v);
  float* s_s = reinterpret_cast<float*>(smem + L::s);
  uint16_t* p_b = reinterpret_cast<uint16_t*>(smem + L::pb);
  float* alpha = reinterpret_cast<float*>(smem + L::alpha);
  float* m = reinterpret_cast<float*>(smem + L::m);  // the running maximum and sum of each row
  float* l = reinterpret_cast<float*>(smem + L::l);

  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * BQ, h = blockIdx.y, b = blockIdx.z;
  const int nq = static_cast<int>(p.tq - i0 < BQ ? p.tq - i0 : BQ);
  const int64_t kvh = h / (p.h / p.hkv), kvl = kv_len(p, b);
  const int64_t kend = p.causal && i0 + nq < kvl ? i0 + nq : kvl;
  const int d = static_cast<int>(p.d);

  load_tile<D, BQ>(q_s, L::ldx, q, p.tq, b, i0, nq, h, d);
  for (int r = static_cast<int>(threadIdx.x); r < BQ; r += kThreads) m[r] = -INFINITY, l[r] = 0.0f;
  Frag<BQ, D> o;
  o.zero();
  for (int64_t j0 = 0; j0 < kend; j0 += BK) {
    const int nk = static_cast<int>(kend - j0 < BK ? kend - j0 : BK);
    load_tile<D, BK>(k_s, L::ldx, k, p.tk, b, j0, nk, kvh, d);
    load_tile<D, BK>(v_s, L::ldx, v, p.tk, b, j0, nk, kvh, d);
    __syncthreads();
    Frag<BQ, BK> s;
    s.zero();
    tile_product<D, false, false>(s, q_s, L::ldx, k_s, L::ldx);  // Q K^T
    s.store(s_s, L::lds);
    __syncthreads();
    forward_rows<BQ, BK, kBf16>(p, s_s, L::lds, p_b, L::ldp, alpha, m, l, b, h, i0, nq, j0, nk);
    __syncthreads();
    o.for_each([&](int r, int, float& x) { x *= alpha[r]; });
    if constexpr (kBf16)
      tile_product<BK, false, true>(o, p_b, L::ldp, v_s, L::ldx);  // (P o Z) V
    else
      tile_product<BK, false, true>(o, s_s, L::lds, v_s, L::ldx);
    __syncthreads();  // k_s, v_s, s_s, alpha are rewritten next
  }
  // 1 / l for the output rows, the log-sum-exp for lse.
  for (int r = static_cast<int>(threadIdx.x); r < BQ; r += kThreads) {
    alpha[r] = r < nq ? 1.0f / l[r] : 0.0f;
    if (r < nq) lse[(b * p.h + h) * p.tq + i0 + r] = m[r] + logf(l[r]);
  }
  __syncthreads();
  store_tile(o, q_s, L::ldx, out, p.tq, b, i0, nq, h, d, [&](int r) { return alpha[r]; });
}

// ---- Backward: delta = rowsum(dout o out) ---------------------------------------------------

template <typename T>
__global__ void __launch_bounds__(kThreads)
    flash_delta_kernel(FlashProblem p, FlashOperand out, FlashOperand dout, float* delta) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t rows = p.b * p.h * p.tq, warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < rows; r += warps) {
    const int64_t b = r / (p.h * p.tq), h = r / p.tq % p.h, i = r % p.tq;
    const T* o = static_cast<const T*>(out.data) + (b * p.tq + i) * out.w + out.col + h * p.d;
    const T* g = static_cast<const T*>(dout.data) + (b * p.tq + i) * dout.w + dout.col + h * p.d;
    float sum = 0.0f;
    for (int64_t c = lane; c < p.d; c += 32) {
      if constexpr (sizeof(T) == 2)
        sum = fmaf(bf16_bits_to_float(o[c]), bf16_bits_to_float(g[c]), sum);
      else
        sum = fmaf(o[c], g[c], sum);
    }
    sum = warp_sum(sum);
    if (lane == 0) delta[r] = sum;
  }
}

// ---- Backward: the score gradients of one tile pair --------------------------------------
// On entry s holds S (raw scores) and dp holds dO V^T, [BQ, ld]; on return s holds P o Z
// and dp holds dS = P o (dP o Z - delta), P = exp(scale S - lse) on the visible keys, 0
// elsewhere; in bf16 also pz_b (when given) and ds_b, their rounded copies [BQ, ldb].
template <int BQ, int BK, bool kBf16>
__device__ REMAT_INLINE void backward_rows(const FlashProblem& p, float* s, float* dp, int ld, uint16_t* pz_b,
                                           uint16_t* ds_b, int ldb, const float* lse, const float* delta, int64_t b,
                                           int64_t h, int64_t i0, int nq, int64_t j0, int nk) {
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  for (int r = warp; r < BQ; r += kWarps) {
    const int vis = r < nq ? visible(p, i0 + r, j0, nk) : 0;
    float* srow = s + r * ld;
    float* drow = dp + r * ld;
    const float lse_r = lse[r], delta_r = delta[r];
    auto keep = [&](int j, float pz, float ds) {
      srow[j] = pz;
      drow[j] = ds;
      if (kBf16) {
        if (pz_b) pz_b[r * ldb + j] = float_to_bf16_bits(pz);
        ds_b[r * ldb + j] = float_to_bf16_bits(ds);
      }
    };
    for (int j = lane; j < BK; j += 32) {
      const float pj = j < vis ? expf(srow[j] * p.scale - lse_r) : 0.0f;
      if (!p.drop.on)
        keep(j, pj, pj * (drow[j] - delta_r));
      else if (j < vis)
        srow[j] = pj;
      else
        keep(j, 0.0f, 0.0f);
    }
    if (p.drop.on) {
      __syncwarp();  // the factors come to other lanes than the ones that wrote P
      for_each_dropout_factor_coalesced(p.drop, dropout_word(p, b, h, i0 + r, j0), vis, lane,
                                        [&](int64_t j, float factor) {
                                          const float pj = srow[j];
                                          keep(static_cast<int>(j), pj * factor, pj * (drow[j] * factor - delta_r));
                                        });
    }
  }
}

// lse and delta of rows [i0, i0 + nq) of head h into shared memory (0 past nq).
template <int BQ>
__device__ REMAT_INLINE void load_row_stats(float* lse_s, float* delta_s, const FlashProblem& p, const float* lse,
                                            const float* delta, int64_t b, int64_t h, int64_t i0, int nq) {
  for (int r = static_cast<int>(threadIdx.x); r < BQ; r += kThreads) {
    const int64_t at = (b * p.h + h) * p.tq + i0 + r;
    lse_s[r] = r < nq ? lse[at] : 0.0f;
    delta_s[r] = r < nq ? delta[at] : 0.0f;
  }
}

// Shared memory of both backward passes: Q, dO [bq, D]; K, V [bk, D]; S, dP [bq, bk] f32;
// in bf16 the rounded P o Z and dS; lse, delta [bq].
template <int BQ, int BK, int D, bool kBf16>
struct BackwardLayout {
  using T = typename Smem<kBf16>::T;
  static constexpr int bq = BQ, bk = BK;
  static constexpr int ldx = D + Smem<kBf16>::pad, lds = BK + 4, ldb = BK + 8;
  static constexpr size_t q = 0, dout = align16(q + sizeof(T) * BQ * ldx), k = align16(dout + sizeof(T) * BQ * ldx),
                          v = align16(k + sizeof(T) * BK * ldx), s = align16(v + sizeof(T) * BK * ldx),
                          dp = align16(s + sizeof(float) * BQ * lds), pz_b = align16(dp + sizeof(float) * BQ * lds),
                          ds_b = align16(pz_b + (kBf16 ? sizeof(uint16_t) * BQ * ldb : 0)),
                          lse = align16(ds_b + (kBf16 ? sizeof(uint16_t) * BQ * ldb : 0)),
                          delta = align16(lse + sizeof(float) * BQ), bytes = align16(delta + sizeof(float) * BQ);
};
template <int D, bool kBf16>
using KeyPassLayout = BackwardLayout<KeyPassTiles<D>::bq, KeyPassTiles<D>::bk, D, kBf16>;
template <int D, bool kBf16>
using QueryPassLayout = BackwardLayout<QueryPassTiles<D>::bq, QueryPassTiles<D>::bk, D, kBf16>;

#define REMAT_FLASH_BACKWARD_SMEM(L)                            \
  REMAT_DYNAMIC_SHARED(unsigned char, smem);                    \
  T* q_s = reinterpret_cast<T*>(smem + L::q);                   \
  T* do_s = reinterpret_cast<T*>(smem + L::dout);               \
  T* k_s = reinterpret_cast<T*>(smem + L::k);                   \
  T* v_s = reinterpret_cast<T*>(smem + L::v);                   \
  float* s_s = reinterpret_cast<float*>(smem + L::s);           \
  float* dp_s = reinterpret_cast<float*>(smem + L::dp);         \
  uint16_t* pz_b = reinterpret_cast<uint16_t*>(smem + L::pz_b); \
  uint16_t* ds_b = reinterpret_cast<uint16_t*>(smem + L::ds_b); \
  float* lse_s = reinterpret_cast<float*>(smem + L::lse);       \
  float* delta_s = reinterpret_cast<float*>(smem + L::delta);   \
  (void)q_s, (void)do_s, (void)k_s, (void)v_s, (void)pz_b, (void)ds_b

// S = Q K^T into s_s and dP = dO V^T into dp_s, then the score gradients.
template <typename L, int D, bool kBf16, typename T>
__device__ REMAT_INLINE void score_grads(const FlashProblem& p, const T* q_s, const T* do_s, const T* k_s, const T* v_s,
                                         float* s_s, float* dp_s, uint16_t* pz_b, uint16_t* ds_b, const float* lse_s,
                                         const float* delta_s, int64_t b, int64_t h, int64_t i0, int nq, int64_t j0,
                                         int nk) {
  {
    Frag<L::bq, L::bk> s;
    s.zero();
    tile_product<D, false, false>(s, q_s, L::ldx, k_s, L::ldx);  // Q K^T
    s.store(s_s, L::lds);
  }
  {
    Frag<L::bq, L::bk> s;
    s.zero();
    tile_product<D, false, false>(s, do_s, L::ldx, v_s, L::ldx);  // dO V^T
    s.store(dp_s, L::lds);
  }
  __syncthreads();
  backward_rows<L::bq, L::bk, kBf16>(p, s_s, dp_s, L::lds, pz_b, ds_b, L::ldb, lse_s, delta_s, b, h, i0, nq, j0, nk);
  __syncthreads();
}

// dK, dV of key tile [j0, j0 + bk) of key/value head g of batch element b: the group's
// query heads in order, each over its query tiles in order.
template <int D, bool kBf16>
__global__ void __launch_bounds__(kThreads)
    flash_backward_kv_kernel(FlashProblem p, FlashOperand q, FlashOperand k, FlashOperand v, FlashOperand dout,
                             const float* lse, const float* delta, FlashOutput dk, FlashOutput dv) {
  using L = KeyPassLayout<D, kBf16>;
  using T = typename L::T;
  constexpr int BQ = L::bq, BK = L::bk;
  REMAT_FLASH_BACKWARD_SMEM(L);
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * BK, g = blockIdx.y, b = blockIdx.z;
  const int nk_all = static_cast<int>(p.tk - j0 < BK ? p.tk - j0 : BK);
  const int64_t kvl_left = kv_len(p, b) - j0;
  const int nk = kvl_left <= 0 ? 0 : kvl_left < nk_all ? static_cast<int>(kvl_left) : nk_all;  // keys past kv_len: 0
  const int64_t group = p.h / p.hkv;
  const int d = static_cast<int>(p.d);

  Frag<BK, D> dk_acc, dv_acc;
  dk_acc.zero();
  dv_acc.zero();
  if (nk > 0) {
    load_tile<D, BK>(k_s, L::ldx, k, p.tk, b, j0, nk, g, d);
    load_tile<D, BK>(v_s, L::ldx, v, p.tk, b, j0, nk, g, d);
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t i0 = p.causal ? j0 / BQ * BQ : 0; i0 < p.tq; i0 += BQ) {
        const int nq = static_cast<int>(p.tq - i0 < BQ ? p.tq - i0 : BQ);
        load_tile<D, BQ>(q_s, L::ldx, q, p.tq, b, i0, nq, h, d);
        load_tile<D, BQ>(do_s, L::ldx, dout, p.tq, b, i0, nq, h, d);
        load_row_stats<BQ>(lse_s, delta_s, p, lse, delta, b, h, i0, nq);
        __syncthreads();
        score_grads<L, D, kBf16>(p, q_s, do_s, k_s, v_s, s_s, dp_s, pz_b, ds_b, lse_s, delta_s, b, h, i0, nq, j0, nk);
        if constexpr (kBf16) {
          tile_product<BQ, true, true>(dv_acc, pz_b, L::ldb, do_s, L::ldx);  // (P o Z)^T dO
          tile_product<BQ, true, true>(dk_acc, ds_b, L::ldb, q_s, L::ldx);   // dS^T Q
        } else {
          tile_product<BQ, true, true>(dv_acc, s_s, L::lds, do_s, L::ldx);
          tile_product<BQ, true, true>(dk_acc, dp_s, L::lds, q_s, L::ldx);
        }
        __syncthreads();  // q_s, do_s, s_s, dp_s are rewritten next
      }
    }
  }
  store_tile(dk_acc, k_s, L::ldx, dk, p.tk, b, j0, nk_all, g, d, [&](int) { return p.scale; });
  store_tile(dv_acc, v_s, L::ldx, dv, p.tk, b, j0, nk_all, g, d, [](int) { return 1.0f; });
}

// dQ of query tile [i0, i0 + bq) of head h of batch element b, over the key tiles in order.
template <int D, bool kBf16>
__global__ void __launch_bounds__(kThreads)
    flash_backward_q_kernel(FlashProblem p, FlashOperand q, FlashOperand k, FlashOperand v, FlashOperand dout,
                            const float* lse, const float* delta, FlashOutput dq) {
  using L = QueryPassLayout<D, kBf16>;
  using T = typename L::T;
  constexpr int BQ = L::bq, BK = L::bk;
  REMAT_FLASH_BACKWARD_SMEM(L);
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * BQ, h = blockIdx.y, b = blockIdx.z;
  const int nq = static_cast<int>(p.tq - i0 < BQ ? p.tq - i0 : BQ);
  const int64_t kvh = h / (p.h / p.hkv), kvl = kv_len(p, b);
  const int64_t kend = p.causal && i0 + nq < kvl ? i0 + nq : kvl;
  const int d = static_cast<int>(p.d);

  load_tile<D, BQ>(q_s, L::ldx, q, p.tq, b, i0, nq, h, d);
  load_tile<D, BQ>(do_s, L::ldx, dout, p.tq, b, i0, nq, h, d);
  load_row_stats<BQ>(lse_s, delta_s, p, lse, delta, b, h, i0, nq);
  Frag<BQ, D> dq_acc;
  dq_acc.zero();
  for (int64_t j0 = 0; j0 < kend; j0 += BK) {
    const int nk = static_cast<int>(kend - j0 < BK ? kend - j0 : BK);
    load_tile<D, BK>(k_s, L::ldx, k, p.tk, b, j0, nk, kvh, d);
    load_tile<D, BK>(v_s, L::ldx, v, p.tk, b, j0, nk, kvh, d);
    __syncthreads();
    score_grads<L, D, kBf16>(p, q_s, do_s, k_s, v_s, s_s, dp_s, nullptr, ds_b, lse_s, delta_s, b, h, i0, nq, j0, nk);
    if constexpr (kBf16)
      tile_product<BK, false, true>(dq_acc, ds_b, L::ldb, k_s, L::ldx);  // dS K
    else
      tile_product<BK, false, true>(dq_acc, dp_s, L::lds, k_s, L::ldx);
    __syncthreads();  // k_s, v_s, s_s, dp_s are rewritten next
  }
  store_tile(dq_acc, q_s, L::ldx, dq, p.tq, b, i0, nq, h, d, [&](int) { return p.scale; });
}

#undef REMAT_FLASH_BACKWARD_SMEM

// ---- Launchers -----------------------------------------------------------------------------

// Shared memory past the default 48 KiB needs the kernel's opt-in (up to 227 KiB on sm_90,
// 163 KiB on sm_80); a device with less refuses it here, by name.
template <typename... Args>
void allow_shared(void (*kernel)(Args...), size_t bytes, const char* name) {
  if (bytes <= 48 * 1024) return;
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    REMAT_THROW("flash attention: ", name, " needs ", bytes, " bytes of shared memory, which this device refuses (",
                cudaGetErrorName(err), ": ", cudaGetErrorString(err), ")");
  }
}

dim3 grid_of(int64_t tiles, int64_t heads, int64_t batch) {
  REMAT_CHECK(heads <= 65535 && batch <= 65535, "flash attention: ", heads, " heads x ", batch,
              " batch elements exceed the grid's 65535 per dimension");
  return dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(heads), static_cast<unsigned>(batch));
}

template <int D, bool kBf16>
void forward_for(const FlashProblem& p, const FlashOperand& q, const FlashOperand& k, const FlashOperand& v,
                 const FlashOutput& out, float* lse, cudaStream_t stream) {
  using L = ForwardLayout<D, kBf16>;
  allow_shared(flash_forward_kernel<D, kBf16>, L::bytes, "the forward kernel");
  REMAT_LAUNCH((flash_forward_kernel<D, kBf16>), grid_of(ceil_div<int64_t>(p.tq, L::bq), p.h, p.b), dim3(kThreads),
               L::bytes, stream, p, q, k, v, out, lse);
}

template <int D, bool kBf16>
void backward_for(const FlashProblem& p, const FlashOperand& q, const FlashOperand& k, const FlashOperand& v,
                  const FlashOperand& dout, const float* lse, const float* delta, const FlashOutput& dq,
                  const FlashOutput& dk, const FlashOutput& dv, cudaStream_t stream) {
  using KL = KeyPassLayout<D, kBf16>;
  using QL = QueryPassLayout<D, kBf16>;
  allow_shared(flash_backward_kv_kernel<D, kBf16>, KL::bytes, "the backward's key pass");
  allow_shared(flash_backward_q_kernel<D, kBf16>, QL::bytes, "the backward's query pass");
  REMAT_LAUNCH((flash_backward_kv_kernel<D, kBf16>), grid_of(ceil_div<int64_t>(p.tk, KL::bk), p.hkv, p.b),
               dim3(kThreads), KL::bytes, stream, p, q, k, v, dout, lse, delta, dk, dv);
  REMAT_LAUNCH((flash_backward_q_kernel<D, kBf16>), grid_of(ceil_div<int64_t>(p.tq, QL::bq), p.h, p.b), dim3(kThreads),
               QL::bytes, stream, p, q, k, v, dout, lse, delta, dq);
}

// The head dimension the tiles hold: d rounded up to 32, 64, 96, 128 or 256.
template <typename F>
void with_head_dim(int64_t d, const char* what, F&& f) {
  REMAT_CHECK(d >= 1 && d <= 256, what, ": head dimension ", d, " is outside 1 .. 256");
  if (d <= 32)
    f(std::integral_constant<int, 32>{});
  else if (d <= 64)
    f(std::integral_constant<int, 64>{});
  else if (d <= 96)
    f(std::integral_constant<int, 96>{});
  else if (d <= 128)
    f(std::integral_constant<int, 128>{});
  else
    f(std::integral_constant<int, 256>{});
}

void check_problem(const FlashProblem& p, const char* what) {
  REMAT_CHECK(p.b >= 0 && p.tq >= 0 && p.tk >= 0, what, ": negative sizes (b ", p.b, ", tq ", p.tq, ", tk ", p.tk, ")");
  REMAT_CHECK(p.h >= 1 && p.hkv >= 1 && p.h % p.hkv == 0, what, ": ", p.h, " query heads are not a multiple of ", p.hkv,
              " key/value heads");
  REMAT_CHECK(!p.causal || p.tq == p.tk, what, ": causal needs tq == tk (got ", p.tq, " and ", p.tk, ")");
}

constexpr size_t kWorkspaceAlign = 256;

}  // namespace

void flash_attention_forward(const FlashProblem& p, const FlashOperand& q, const FlashOperand& k, const FlashOperand& v,
                             const FlashOutput& out, float* lse, cudaStream_t stream) {
  check_problem(p, "flash_attention_forward");
  if (p.b == 0 || p.tq == 0) return;
  with_head_dim(p.d, "flash_attention_forward", [&](auto dim) {
    if (p.bf16)
      forward_for<decltype(dim)::value, true>(p, q, k, v, out, lse, stream);
    else
      forward_for<decltype(dim)::value, false>(p, q, k, v, out, lse, stream);
  });
}

REMAT_KERNELS_ABI_BEGIN
size_t flash_attention_backward_workspace(const FlashProblem& p) {
  const size_t delta = static_cast<size_t>(p.b * p.h * p.tq) * sizeof(float);
  return (delta + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}
REMAT_KERNELS_ABI_END

void flash_attention_backward(const FlashProblem& p, const FlashOperand& q, const FlashOperand& k,
                              const FlashOperand& v, const FlashOperand& out, const FlashOperand& dout,
                              const float* lse, void* workspace, const FlashOutput& dq, const FlashOutput& dk,
                              const FlashOutput& dv, cudaStream_t stream) {
  check_problem(p, "flash_attention_backward");
  if (p.b == 0) return;
  float* delta = static_cast<float*>(workspace);
  const int64_t rows = p.b * p.h * p.tq;
  const auto blocks = dim3(static_cast<unsigned>(std::min<int64_t>(ceil_div<int64_t>(rows, kWarps), 65535)));
  if (p.bf16)
    REMAT_LAUNCH(flash_delta_kernel<uint16_t>, blocks, dim3(kThreads), 0, stream, p, out, dout, delta);
  else
    REMAT_LAUNCH(flash_delta_kernel<float>, blocks, dim3(kThreads), 0, stream, p, out, dout, delta);
  with_head_dim(p.d, "flash_attention_backward", [&](auto dim) {
    if (p.bf16)
      backward_for<decltype(dim)::value, true>(p, q, k, v, dout, lse, delta, dq, dk, dv, stream);
    else
      backward_for<decltype(dim)::value, false>(p, q, k, v, dout, lse, delta, dq, dk, dv, stream);
  });
}

}  // namespace remat::kernels
