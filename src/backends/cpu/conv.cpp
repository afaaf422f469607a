// conv2d on the CPU: GEMMs of our own over a chunk of images at a time.
//
// Per group g, with L the chunk's output positions:
//   forward   y_g [Kg, L]        = w_g [Kg, Cg*R*S] @ col_g [Cg*R*S, L]   (+ bias)
//   backward  dw_g [Kg, Cg*R*S] += dy_g [Kg, L] @ col_g^T
//             dx_g               = col2im(w_g^T @ dy_g)
// Three ways to feed the GEMMs:
// - im2col (any stride): im2col writes the column matrix straight into the panel layout
//   the micro-kernel reads, and col2im folds w^T @ dy back into dx;
// - implicit (stride 1): with the input zero-padded to Hp x Wp, row (c, r, s) of the column
//   matrix at output (p, q) is x_pad[c][p + r*dh][q + s*dw], i.e. x_pad at the flat offset
//   off(c, r, s) + p*Wp + q. Computing outputs on the padded width (columns q >= Q are
//   computed and dropped) makes every B row a contiguous run of x_pad, so the micro-kernel
//   reads x_pad directly through a table of row offsets and no column matrix exists. dx is
//   the same kind of convolution of the padded dy with the flipped, transposed filters, so
//   no col2im either; dw reads x_pad rows as the A operand;
// - direct (any stride; dx for stride 1): the transposed GEMMs, y_g^T [L, Kg] =
//   col_g^T @ w_g^T, in tiles of MR output positions by NR channels. The A operand is
//   x_pad read where each position's window starts (any row, any stride) plus off(c, r, s);
//   the B operand is w_g^T packed once, channels in the vectors. Nothing is computed on
//   the padding and nothing is copied but the padded input. dx likewise over the padded dy
//   (positions of x by input channels); dw is dy^T (packed, channels in the vectors)
//   against x_pad at (position + off(c, r, s)), depth over the chunk's positions.
// Each GEMM takes the cheapest way that applies, counting the rows and lanes computed and
// dropped (MR-row panels, NR-wide channel vectors, the padded width) and im2col's passes
// over memory (ConvGeom::choose_feeds): for 32 or 64 channels that is the direct path.
// The GEMM epilogues write y (NCHW, plus bias), dx, or add into dw directly.
//
// Determinism: every loop, the GEMM included, is an OpenMP loop over disjoint outputs, and
// each output element is summed by one thread in a fixed order (one FMA chain over the
// GEMM depth), so results are bitwise identical for any thread count. The micro-kernel has
// AVX-512 and AVX2 versions chosen at run time and a portable one; all compute the same FMA
// chains, so they agree bit for bit. The three paths give bitwise equal y and dw for the
// same chunks (the same products in the same order; the dropped columns add exact zeros to
// dw), and dx within rounding (col2im sums over (r, s) separately; the implicit and direct
// dx are bitwise equal).
//
// Why not cblas_sgemm: OpenBLAS's pthread build runs its own thread pool beside OpenMP's,
// and the two oversubscribe the cores at every hand-over between im2col and GEMM (an
// im2col + sgemm version of this file measured 2-5x slower on 2 busy cores than with
// OMP_WAIT_POLICY=passive or one thread); its results also change with its thread count;
// and its kernels for this CPU generation were AVX2 ones at about half our AVX-512 rate.
//
// Workspace: the packed operands and padded copies of one chunk. The chunk size and the
// path, and so the workspace, depend only on the shapes (the meta backend reuses the
// queries).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <omp.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define REMAT_CONV_X86 1
#endif

#include "backends/cpu/bf16.h"
#include "backends/cpu/conv_internal.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/mixed.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/simd.h"
#include "remat/error.h"

namespace remat {

namespace {

// ---- Micro-kernels: tile[MR][NR] (=, or += with accumulate) sum_k a(k, i) * b(k)[j] --------
// One FMA chain per element, k in order. Rows past M and columns past N are computed on
// whatever the operands hold there and dropped by the caller.
constexpr int64_t MR = 8;
constexpr int64_t NR = 32;

struct PackedA {  // MR-row panel, k-major: a[k * MR + i]
  const float* p;
  float operator()(int64_t k, int64_t i) const { return p[k * MR + i]; }
};
struct RowsA {  // MR rows anywhere in memory: rows[i][k]
  const float* rows[MR];
  float operator()(int64_t k, int64_t i) const { return rows[i][k]; }
};
struct TableA {  // MR rows anywhere in memory, read at offsets shared by all rows: rows[i][off[k]]
  const float* rows[MR];
  const int64_t* off;
  float operator()(int64_t k, int64_t i) const { return rows[i][off[k]]; }
};
struct PackedB {  // NR-column panel, k-major: b[k * NR + j]
  const float* p;
  const float* operator()(int64_t k) const { return p + k * NR; }
};
struct OffsetB {  // row k of B starts at base + off[k]
  const float* base;
  const int64_t* off;
  const float* operator()(int64_t k) const { return base + off[k]; }
};

template <class A, class B>
void tile_portable(int64_t kdim, const A& a, const B& b, float* tile, bool accumulate) {
  float acc[MR][NR];
  for (int64_t i = 0; i < MR; ++i)
    for (int64_t j = 0; j < NR; ++j) acc[i][j] = accumulate ? tile[i * NR + j] : 0.0f;
  for (int64_t k = 0; k < kdim; ++k) {
    const float* bk = b(k);
    for (int64_t i = 0; i < MR; ++i) {
      const float av = a(k, i);
      for (int64_t j = 0; j < NR; ++j) acc[i][j] = std::fma(av, bk[j], acc[i][j]);
    }
  }
  std::memcpy(tile, acc, sizeof(acc));
}

#ifdef REMAT_CONV_X86
template <class A, class B>
__attribute__((target("avx512f"))) void tile_avx512(int64_t kdim, const A& a, const B& b, float* tile,
                                                    bool accumulate) {
  __m512 acc[MR][2];
  for (int64_t i = 0; i < MR; ++i) {
    acc[i][0] = accumulate ? _mm512_loadu_ps(tile + i * NR) : _mm512_setzero_ps();
    acc[i][1] = accumulate ? _mm512_loadu_ps(tile + i * NR + 16) : _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < kdim; ++k) {
    const float* bk = b(k);
    const __m512 b0 = _mm512_loadu_ps(bk), b1 = _mm512_loadu_ps(bk + 16);
    for (int64_t i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(a(k, i));
      acc[i][0] = _mm512_fmadd_ps(av, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(av, b1, acc[i][1]);
    }
  }
  for (int64_t i = 0; i < MR; ++i) {
    _mm512_storeu_ps(tile + i * NR, acc[i][0]);
    _mm512_storeu_ps(tile + i * NR + 16, acc[i][1]);
  }
}

// 16 ymm registers: the tile in four 4 x 16 quarters (8 accumulators each).
template <class A, class B>
__attribute__((target("avx2,fma"))) void tile_avx2(int64_t kdim, const A& a, const B& b, float* tile, bool accumulate) {
  for (int64_t i0 = 0; i0 < MR; i0 += 4)
    for (int64_t j0 = 0; j0 < NR; j0 += 16) {
      __m256 acc[4][2];
      for (int64_t i = 0; i < 4; ++i) {
        float* t = tile + (i0 + i) * NR + j0;
        acc[i][0] = accumulate ? _mm256_loadu_ps(t) : _mm256_setzero_ps();
        acc[i][1] = accumulate ? _mm256_loadu_ps(t + 8) : _mm256_setzero_ps();
      }
      for (int64_t k = 0; k < kdim; ++k) {
        const float* bk = b(k) + j0;
        const __m256 b0 = _mm256_loadu_ps(bk), b1 = _mm256_loadu_ps(bk + 8);
        for (int64_t i = 0; i < 4; ++i) {
          const __m256 av = _mm256_set1_ps(a(k, i0 + i));
          acc[i][0] = _mm256_fmadd_ps(av, b0, acc[i][0]);
          acc[i][1] = _mm256_fmadd_ps(av, b1, acc[i][1]);
        }
      }
      for (int64_t i = 0; i < 4; ++i) {
        float* t = tile + (i0 + i) * NR + j0;
        _mm256_storeu_ps(t, acc[i][0]);
        _mm256_storeu_ps(t + 8, acc[i][1]);
      }
    }
}
#endif

struct MicroKernels {
  const char* name;
  void (*packed)(int64_t, const PackedA&, const PackedB&, float*, bool);
  void (*offset_b)(int64_t, const PackedA&, const OffsetB&, float*, bool);
  void (*rows_a)(int64_t, const RowsA&, const PackedB&, float*, bool);
  void (*table_a)(int64_t, const TableA&, const PackedB&, float*, bool);
};

const MicroKernels kPortable{"portable", &tile_portable<PackedA, PackedB>, &tile_portable<PackedA, OffsetB>,
                             &tile_portable<RowsA, PackedB>, &tile_portable<TableA, PackedB>};
#ifdef REMAT_CONV_X86
const MicroKernels kAvx512{"avx512", &tile_avx512<PackedA, PackedB>, &tile_avx512<PackedA, OffsetB>,
                           &tile_avx512<RowsA, PackedB>, &tile_avx512<TableA, PackedB>};
const MicroKernels kAvx2{"avx2", &tile_avx2<PackedA, PackedB>, &tile_avx2<PackedA, OffsetB>, &tile_avx2<RowsA, PackedB>,
                         &tile_avx2<TableA, PackedB>};
#endif

std::vector<const MicroKernels*> supported_kernels() {
  std::vector<const MicroKernels*> out;
#ifdef REMAT_CONV_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) out.push_back(&kAvx512);
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) out.push_back(&kAvx2);
#endif
  out.push_back(&kPortable);
  return out;
}

// ---- 8 x 8 transposes (the direct path's stores and its dy^T) ------------------------------

// dst[j * ds + i] = src[i * ss + j] (+ add[j] when add is given), for i, j < 8: copies, and
// the same float additions, whichever version runs.
void transpose8_portable(const float* src, int64_t ss, float* dst, int64_t ds, const float* add) {
  for (int64_t j = 0; j < 8; ++j)
    for (int64_t i = 0; i < 8; ++i) dst[j * ds + i] = add ? src[i * ss + j] + add[j] : src[i * ss + j];
}

#ifdef REMAT_CONV_X86
__attribute__((target("avx"))) void transpose8_avx(const float* src, int64_t ss, float* dst, int64_t ds,
                                                   const float* add) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * ss);
  for (int i = 0; i < 8; i += 2) {  // pairs of rows interleaved
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {  // then quads: each 128-bit lane holds 4 x 4 transposed
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {  // and the lanes of rows 0-3 with those of rows 4-7
    t[j] = _mm256_permute2f128_ps(r[j], r[j + 4], 0x20);
    t[j + 4] = _mm256_permute2f128_ps(r[j], r[j + 4], 0x31);
  }
  for (int j = 0; j < 8; ++j) {
    const __m256 v = add ? _mm256_add_ps(t[j], _mm256_set1_ps(add[j])) : t[j];
    _mm256_storeu_ps(dst + j * ds, v);
  }
}

#endif

inline void transpose8(const float* src, int64_t ss, float* dst, int64_t ds, const float* add = nullptr) {
#ifdef REMAT_CONV_X86
  if (cpu::simd() != cpu::Simd::baseline) return transpose8_avx(src, ss, dst, ds, add);
#endif
  transpose8_portable(src, ss, dst, ds, add);
}

const MicroKernels* g_kernels = supported_kernels().front();
cpu_conv::Path g_path = cpu_conv::Path::automatic;
int64_t g_chunk_images = 0;  // 0: chosen from the shapes

inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
inline int64_t ceil_div(int64_t v, int64_t m) { return (v + m - 1) / m; }

// Runs body(t) for t in [0, tiles): GEMM tiles, disjoint outputs, one thread each.
// Consecutive tiles share their B operand, which stays in cache while A panels pass over it.
template <class Body>
void for_tiles(int64_t tiles, int64_t flops_per_tile, const Body& body) {
#pragma omp parallel for schedule(static) if (tiles * flops_per_tile >= 64 * cpu::kParallelMinWork)
  for (int64_t t = 0; t < tiles; ++t) body(t);
}

// ---- Geometry, paths and workspace layout ----------------------------------------------

// Chunk size: at least kTargetColumns output positions and kMinChunkFlops of forward work
// (enough tiles for every thread, few hand-overs between loops, no fork/join for a
// sliver of work), while the chunk's large buffers (the column matrix, or the padded
// copies) stay within kMaxChunkBytes; always at least one image. The images are then
// spread evenly over the chunks.
constexpr int64_t kTargetColumns = 4096;
constexpr int64_t kMinChunkFlops = int64_t{32} << 20;
constexpr int64_t kMaxChunkBytes = int64_t{4} << 20;  // workspace is memory too: keep it small

// The direct dw sums a chunk's output positions in blocks of this many, so that the block
// of dy^T a tile reads (kDwBlock x NR floats) stays in the L1 cache across tiles.
constexpr int64_t kDwBlock = 192;

// Im2col and col2im write and read a column matrix R*S times the size of the input: their
// cost, counted in GEMM work, for the choice of path.
constexpr double kIm2colCost = 1.2;

// Workspace regions, in floats, laid out one after the other.
struct Regions {
  int64_t total = 0;
  int64_t add(int64_t floats) {
    const int64_t at = total;
    total += round_up(floats, 16);  // 64-byte aligned regions
    return at;
  }
};

// How a GEMM of the convolution gets its operands (see the header comment).
enum class Feed : uint8_t { im2col, implicit, direct };

// The feed the test hook forces (cpu_conv::set_path), where it applies.
Feed forced_feed() {
  switch (g_path) {
    case cpu_conv::Path::implicit: return Feed::implicit;
    case cpu_conv::Path::direct: return Feed::direct;
    default: return Feed::im2col;
  }
}

struct ConvGeom {
  int64_t n, c, h, w;  // input
  int64_t k, r, s;     // filters
  int64_t p, q;        // output plane
  int64_t sh, sw, ph, pw, dh, dw;
  int64_t groups, cg, kg;  // channels and filters per group
  int64_t grows;           // Cg * R * S: GEMM depth of the forward pass
  int64_t krows;           // Kg * R * S: GEMM depth of the dx of stride 1
  int64_t plane;           // P * Q
  int64_t nb;              // images per chunk
  int64_t len, len_pad;    // im2col: columns of a full chunk, and rounded up to NR
  // Stride-1 implicit paths and the direct path: x padded to hp x wp (the implicit path
  // computes outputs on the padded width, limg columns per image); dy padded to hq x wq
  // for dx (ldx columns per image on the padded width).
  int64_t hp, wp, limg;
  int64_t hq, wq, ldx, dy_top, dy_left;
  Feed y_feed;   // forward and dw
  Feed dx_feed;  // dx

  ConvGeom(const Shape& x, const Shape& wt, const Conv2dParams& prm) {
    n = x[0], c = x[1], h = x[2], w = x[3];
    k = wt[0], r = wt[2], s = wt[3];
    sh = prm.stride_h, sw = prm.stride_w, ph = prm.pad_h, pw = prm.pad_w;
    dh = prm.dilation_h, dw = prm.dilation_w;
    groups = prm.groups;
    cg = c / groups, kg = k / groups;
    p = (h + 2 * ph - dh * (r - 1) - 1) / sh + 1;
    q = (w + 2 * pw - dw * (s - 1) - 1) / sw + 1;
    grows = cg * r * s;
    krows = kg * r * s;
    plane = p * q;
    hp = h + 2 * ph, wp = w + 2 * pw;
    limg = p > 0 && q > 0 ? (p - 1) * wp + q : 0;
    dy_top = (r - 1) * dh - ph, dy_left = (s - 1) * dw - pw;
    hq = h + (r - 1) * dh, wq = w + (s - 1) * dw;
    ldx = h > 0 && w > 0 ? (h - 1) * wq + w : 0;
    choose_feeds();

    nb = 1;
    if (plane > 0 && n > 0) {
      const int64_t flops = std::max<int64_t>(1, 2 * k * grows * plane);
      nb = std::max(ceil_div(kTargetColumns, plane), ceil_div(kMinChunkFlops, flops));
      int64_t floats = 0;  // per image
      if (y_feed == Feed::im2col) floats += c * r * s * plane;
      if (y_feed == Feed::implicit) floats += c * hp * wp + groups * round_up(kg, NR) * limg;
      if (y_feed == Feed::direct) floats += c * hp * wp + groups * round_up(kg, NR) * plane + 2 * plane;
      floats += dx_feed == Feed::im2col ? k * plane : k * hq * wq;
      nb = std::min(nb, std::max<int64_t>(1, kMaxChunkBytes / (4 * std::max<int64_t>(1, floats))));
      nb = ceil_div(n, ceil_div(n, nb));  // as many chunks, evenly filled
      if (g_chunk_images > 0) nb = g_chunk_images;
      nb = std::min(nb, n);
    }
    len = nb * plane;
    len_pad = round_up(len, NR);
  }

  // The cheapest way to feed each GEMM, in GEMM work per useful multiply-add: rows and
  // lanes computed and dropped (MR-row A panels, NR-wide vectors, the padded width of the
  // implicit path), and im2col's extra passes. A path forced by the test hook is taken
  // where it applies; im2col applies everywhere.
  void choose_feeds() {
    auto rows = [](int64_t m) { return m > 0 ? static_cast<double>(round_up(m, MR)) / static_cast<double>(m) : 1.0; };
    auto lanes = [](int64_t m) { return m > 0 ? static_cast<double>(round_up(m, NR)) / static_cast<double>(m) : 1.0; };
    const bool stride1 = sh == 1 && sw == 1;
    const bool implicit_y_ok = stride1 && plane > 0;
    const bool dx_pad_ok = stride1 && dy_top >= 0 && dy_left >= 0 && h * w > 0;
    struct Option {
      Feed feed;
      bool applies;
      double cost;
    };
    // Options in the order im2col (always applies), implicit, direct; ties go to the later one.
    auto pick = [](std::initializer_list<Option> options) {
      Feed best = Feed::im2col;
      double cost = HUGE_VAL;
      for (const Option& o : options) {
        if (!o.applies) continue;
        if (g_path != cpu_conv::Path::automatic) {
          if (forced_feed() == o.feed) return o.feed;
        } else if (o.cost <= cost) {
          best = o.feed, cost = o.cost;
        }
      }
      return best;
    };
    y_feed =
        pick({{Feed::im2col, true, kIm2colCost * rows(kg)},
              {Feed::implicit, implicit_y_ok,
               implicit_y_ok ? static_cast<double>(round_up(limg, NR)) / static_cast<double>(plane) * rows(kg) : 0},
              {Feed::direct, true, lanes(kg)}});
    dx_feed = pick({{Feed::im2col, true, kIm2colCost * rows(grows)},
                    {Feed::implicit, dx_pad_ok,
                     dx_pad_ok ? static_cast<double>(round_up(ldx, NR)) / static_cast<double>(h * w) * rows(cg) : 0},
                    {Feed::direct, dx_pad_ok, lanes(cg)}});
  }

  // Nothing to compute (empty output, or no input channels: y is the bias, dx and dw get 0).
  bool trivial() const { return n == 0 || k == 0 || plane == 0 || grows == 0; }

  int64_t xpad_floats() const { return nb * c * hp * wp + NR; }  // NR: over-read slack
  int64_t dypad_floats() const { return nb * k * hq * wq + NR; }
  static int64_t table_floats(int64_t entries) { return 2 * entries; }  // int64 entries

  // Direct path: NR-channel blocks of the output channels (forward, dw) and of the input
  // channels (dx), and MR-row blocks of the dw rows (c, r, s).
  int64_t kblocks() const { return ceil_div(kg, NR); }
  int64_t cblocks() const { return ceil_div(cg, NR); }
  int64_t dw_tiles() const { return groups * ceil_div(grows, MR) * kblocks(); }

  struct FwdLayout {
    int64_t a, b, off, xpad, total;
  };
  FwdLayout fwd_layout() const {
    Regions rg;
    FwdLayout l{};
    if (y_feed == Feed::direct) {
      l.b = rg.add(groups * kblocks() * grows * NR);  // w^T in B panels
      l.off = rg.add(table_floats(grows));
      l.xpad = rg.add(xpad_floats());
    } else if (y_feed == Feed::implicit) {
      l.a = rg.add(groups * round_up(kg, MR) * grows);  // packed w
      l.off = rg.add(table_floats(grows));
      l.xpad = rg.add(xpad_floats());
    } else {
      l.a = rg.add(groups * round_up(kg, MR) * grows);
      l.b = rg.add(groups * grows * len_pad);  // packed column matrix
    }
    l.total = rg.total;
    return l;
  }

  struct BwdLayout {
    // dw: im2col dy A panels + col^T B panels; implicit offsets + x_pad + dy^T B panels;
    // direct offsets + x_pad + position offsets + dy^T B panels + tile sums.
    int64_t dya, colt, off, xpad, dyt, pos, acc;
    // dx: im2col w^T A panels + dy B panels + plain col; implicit flipped w^T A panels,
    // offsets, padded dy; direct flipped w B panels, offsets, padded dy.
    int64_t wt, dyb, col, wflip, offdx, dypad;
    int64_t total;
  };
  BwdLayout bwd_layout() const {
    Regions rg;
    BwdLayout l{};
    const int64_t colt = groups * round_up(grows, NR) * len, col = groups * grows * len;
    if (y_feed == Feed::im2col && dx_feed == Feed::im2col) {  // col^T (dw) and then col (dx) share one buffer
      l.dya = rg.add(groups * round_up(kg, MR) * len);
      l.wt = rg.add(groups * round_up(grows, MR) * kg);
      l.dyb = rg.add(groups * kg * len_pad);
      l.colt = l.col = rg.add(std::max(colt, col));
      l.total = rg.total;
      return l;
    }
    if (y_feed == Feed::direct) {
      l.off = rg.add(table_floats(grows));
      l.xpad = rg.add(xpad_floats());
      l.pos = rg.add(table_floats(len));
      l.dyt = rg.add(groups * kblocks() * len * NR);
      l.acc = rg.add(dw_tiles() * MR * NR);
    } else if (y_feed == Feed::implicit) {
      l.off = rg.add(table_floats(grows));
      l.xpad = rg.add(xpad_floats());
      l.dyt = rg.add(groups * round_up(kg, NR) * nb * limg);
    } else {
      l.dya = rg.add(groups * round_up(kg, MR) * len);
      l.colt = rg.add(colt);
    }
    if (dx_feed == Feed::direct) {
      l.wflip = rg.add(groups * cblocks() * krows * NR);
      l.offdx = rg.add(table_floats(krows));
      l.dypad = rg.add(dypad_floats());
    } else if (dx_feed == Feed::implicit) {
      l.wflip = rg.add(groups * round_up(cg, MR) * krows);
      l.offdx = rg.add(table_floats(krows));
      l.dypad = rg.add(dypad_floats());
    } else {
      l.wt = rg.add(groups * round_up(grows, MR) * kg);
      l.dyb = rg.add(groups * kg * len_pad);
      l.col = rg.add(col);
    }
    l.total = rg.total;
    return l;
  }

  size_t fwd_bytes() const { return trivial() ? 0 : static_cast<size_t>(fwd_layout().total) * sizeof(float); }
  size_t bwd_bytes() const { return trivial() ? 0 : static_cast<size_t>(bwd_layout().total) * sizeof(float); }
};

// First output index o >= 0 with o * stride >= t.
inline int64_t first_at_least(int64_t t, int64_t stride) { return t <= 0 ? 0 : (t + stride - 1) / stride; }

// Output range [lo, hi) whose input coordinate o * stride + off lies in [0, size).
inline void valid_range(int64_t off, int64_t stride, int64_t size, int64_t out, int64_t* lo, int64_t* hi) {
  *lo = std::min(out, first_at_least(-off, stride));
  *hi = std::min(out, std::max(*lo, first_at_least(size - off, stride)));
}

// ---- Explicit path: im2col / col2im and packing ------------------------------------------

// im2col into B panels: B_g[kk][l] = x[n0 + i, g*Cg + c, p*sh - ph + r*dh, q*sw - pw + s*dw]
// for kk = (c, r, s) and l = (i, p, q), 0 in the padding and past the chunk's columns.
// One panel (NR columns, every row) per iteration: the writes are sequential.
void im2col_panels(const ConvGeom& g, const float* x, int64_t n0, int64_t nb, float* b) {
  const int64_t len = nb * g.plane, np = ceil_div(len, NR), units = g.groups * np;
  std::vector<int64_t> qrange_v(static_cast<size_t>(2 * g.s));  // valid q range of each s
  for (int64_t ss = 0; ss < g.s; ++ss)
    valid_range(ss * g.dw - g.pw, g.sw, g.w, g.q, &qrange_v[static_cast<size_t>(2 * ss)],
                &qrange_v[static_cast<size_t>(2 * ss + 1)]);
  const int64_t* qrange = qrange_v.data();
#pragma omp parallel for schedule(static) if (units * NR * g.grows >= cpu::kParallelMinWork)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t gi = u / np, jp = u % np;
    float* panel = b + (gi * np + jp) * NR * g.grows;
    // The panel's columns as runs within one output row: (image, p, first q, count, slot).
    struct Run {
      int64_t i, p, q0, count, slot;
    };
    Run runs[NR];
    int64_t nruns = 0;
    for (int64_t l = jp * NR, end = std::min(len, jp * NR + NR); l < end;) {
      const int64_t i = l / g.plane, pos = l % g.plane, pp = pos / g.q, qq = pos % g.q;
      const int64_t count = std::min(end - l, g.q - qq);
      runs[nruns++] = Run{i, pp, qq, count, l - jp * NR};
      l += count;
    }
    const int64_t filled = std::min(len - jp * NR, NR);
    float* d = panel;  // row kk = (c, r, s), in order
    for (int64_t cc = 0; cc < g.cg; ++cc) {
      const int64_t ch = gi * g.cg + cc;
      for (int64_t rr = 0; rr < g.r; ++rr) {
        const int64_t hoff = rr * g.dh - g.ph;
        for (int64_t ss = 0; ss < g.s; ++ss, d += NR) {
          const int64_t woff = ss * g.dw - g.pw;
          const int64_t q_lo = qrange[2 * ss], q_hi = qrange[2 * ss + 1];
          for (int64_t t = 0; t < nruns; ++t) {
            const Run& run = runs[t];
            float* dr = d + run.slot;
            const int64_t hh = run.p * g.sh + hoff;
            if (hh < 0 || hh >= g.h) {
              for (int64_t j = 0; j < run.count; ++j) dr[j] = 0.0f;
              continue;
            }
            const float* srow = x + (((n0 + run.i) * g.c + ch) * g.h + hh) * g.w + woff;
            const int64_t lo = std::clamp(q_lo - run.q0, int64_t{0}, run.count);
            const int64_t hi = std::clamp(q_hi - run.q0, lo, run.count);
            for (int64_t j = 0; j < lo; ++j) dr[j] = 0.0f;
            if (g.sw == 1) {
              const float* sr = srow + run.q0;
              for (int64_t j = lo; j < hi; ++j) dr[j] = sr[j];
            } else {
              for (int64_t j = lo; j < hi; ++j) dr[j] = srow[(run.q0 + j) * g.sw];
            }
            for (int64_t j = hi; j < run.count; ++j) dr[j] = 0.0f;
          }
          for (int64_t j = filled; j < NR; ++j) d[j] = 0.0f;  // past the chunk's last column
        }
      }
    }
  }
}

// im2col transposed into B panels over the column-matrix rows: B_g[l][kk] (depth L, width
// Cg*R*S), for the dw GEMM; rows past Cg*R*S are zero. One (group, panel, image) per
// iteration, position by position, so that each position's NR values are written together.
void im2col_t_panels(const ConvGeom& g, const float* x, int64_t n0, int64_t nb, float* b) {
  const int64_t len = nb * g.plane, np = ceil_div(g.grows, NR), units = g.groups * np * nb;
  const int64_t group_stride = np * NR * len;
#pragma omp parallel for schedule(static) if (units * NR * g.plane >= cpu::kParallelMinWork)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t gi = u / (np * nb), jp = (u / nb) % np, i = u % nb;
    float* panel = b + gi * group_stride + jp * NR * len + i * g.plane * NR;  // row l = i * plane
    const float* src = x + (n0 + i) * g.c * g.h * g.w;
    const int64_t jn = std::min(NR, g.grows - jp * NR);  // real rows in this panel
    // Per row: the input offset of output position (0, 0), and its valid output ranges.
    int64_t off[NR], p_lo[NR], p_hi[NR], q_lo[NR], q_hi[NR];
    int64_t in_p_lo = 0, in_p_hi = g.p, in_q_lo = 0, in_q_hi = g.q;  // where every row is valid
    for (int64_t j = 0; j < jn; ++j) {
      const int64_t kk = jp * NR + j;
      const int64_t ch = gi * g.cg + kk / (g.r * g.s), rr = (kk / g.s) % g.r, ss = kk % g.s;
      const int64_t hoff = rr * g.dh - g.ph, woff = ss * g.dw - g.pw;
      off[j] = ch * g.h * g.w + hoff * g.w + woff;
      valid_range(hoff, g.sh, g.h, g.p, &p_lo[j], &p_hi[j]);
      valid_range(woff, g.sw, g.w, g.q, &q_lo[j], &q_hi[j]);
      in_p_lo = std::max(in_p_lo, p_lo[j]), in_p_hi = std::min(in_p_hi, p_hi[j]);
      in_q_lo = std::max(in_q_lo, q_lo[j]), in_q_hi = std::min(in_q_hi, q_hi[j]);
    }
    for (int64_t pp = 0; pp < g.p; ++pp) {
      const bool row_inside = pp >= in_p_lo && pp < in_p_hi;
      for (int64_t qq = 0; qq < g.q; ++qq) {
        float* d = panel + (pp * g.q + qq) * NR;
        const int64_t pos = pp * g.sh * g.w + qq * g.sw;
        if (row_inside && qq >= in_q_lo && qq < in_q_hi) {
          for (int64_t j = 0; j < jn; ++j) d[j] = src[off[j] + pos];
        } else {
          for (int64_t j = 0; j < jn; ++j)
            d[j] = pp >= p_lo[j] && pp < p_hi[j] && qq >= q_lo[j] && qq < q_hi[j] ? src[off[j] + pos] : 0.0f;
        }
        for (int64_t j = jn; j < NR; ++j) d[j] = 0.0f;
      }
    }
  }
}

// dx[n0 + i, c] = sum over (r, s, p, q) of the plain column matrix col [C*R*S, L] at the
// positions im2col read from; one (image, channel) plane per iteration, in a fixed order.
void col2im(const ConvGeom& g, const float* col, int64_t n0, int64_t nb, float* dx) {
  const int64_t len = nb * g.plane, units = nb * g.c;
#pragma omp parallel for schedule(static) if (units * g.r * g.s * g.plane >= cpu::kParallelMinWork)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t i = u / g.c, ch = u % g.c;
    float* dst = dx + ((n0 + i) * g.c + ch) * g.h * g.w;
    std::fill(dst, dst + g.h * g.w, 0.0f);
    for (int64_t rr = 0; rr < g.r; ++rr) {
      const int64_t hoff = rr * g.dh - g.ph;
      int64_t p_lo, p_hi;
      valid_range(hoff, g.sh, g.h, g.p, &p_lo, &p_hi);
      for (int64_t ss = 0; ss < g.s; ++ss) {
        const int64_t woff = ss * g.dw - g.pw;
        int64_t q_lo, q_hi;
        valid_range(woff, g.sw, g.w, g.q, &q_lo, &q_hi);
        const float* src = col + ((ch * g.r + rr) * g.s + ss) * len + i * g.plane;
        for (int64_t pp = p_lo; pp < p_hi; ++pp) {
          float* drow = dst + (pp * g.sh + hoff) * g.w + woff;
          const float* srow = src + pp * g.q;
          if (g.sw == 1) {
            for (int64_t qq = q_lo; qq < q_hi; ++qq) drow[qq] += srow[qq];
          } else {
            for (int64_t qq = q_lo; qq < q_hi; ++qq) drow[qq * g.sw] += srow[qq];
          }
        }
      }
    }
  }
}

// Packs an m x kdim matrix given by src(i, k) into MR-row A panels (a[(ip * kdim + k) * MR
// + i]), zero past m.
template <class Src>
void pack_a(int64_t m, int64_t kdim, float* a, const Src& src) {
  const int64_t mp = ceil_div(m, MR);
#pragma omp parallel for schedule(static) if (mp * MR * kdim >= cpu::kParallelMinWork)
  for (int64_t ip = 0; ip < mp; ++ip) {
    float* d = a + ip * MR * kdim;
    const int64_t rows = std::min(MR, m - ip * MR);
    for (int64_t k = 0; k < kdim; ++k)
      for (int64_t i = 0; i < MR; ++i) d[k * MR + i] = i < rows ? src(ip * MR + i, k) : 0.0f;
  }
}

// dy of a chunk (group g, channel rows) as A panels: A_g[m][l] = dy[n0 + l/PQ, g*Kg + m, l%PQ],
// depth L. One (group, panel, image) per iteration.
void pack_dy_a(const ConvGeom& g, const float* dy, int64_t n0, int64_t nb, float* a) {
  const int64_t len = nb * g.plane, mp = ceil_div(g.kg, MR), units = g.groups * mp * nb;
  const int64_t kplane = g.k * g.plane;
#pragma omp parallel for schedule(static) if (units * MR * g.plane >= cpu::kParallelMinWork)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t gi = u / (mp * nb), ip = (u / nb) % mp, i = u % nb;
    float* d = a + (gi * mp + ip) * MR * len + i * g.plane * MR;
    const int64_t rows = std::min(MR, g.kg - ip * MR);
    const float* src = dy + (n0 + i) * kplane + (gi * g.kg + ip * MR) * g.plane;
    for (int64_t l = 0; l < g.plane; ++l)
      for (int64_t t = 0; t < MR; ++t) d[l * MR + t] = t < rows ? src[t * g.plane + l] : 0.0f;
  }
}

// Writes runs of values into one row of B panels (depth `kdim`, row `kk`): column l goes to
// panel l / NR, slot l % NR.
struct PanelRowWriter {
  int64_t panel_stride, j;
  float* at;

  PanelRowWriter(float* b, int64_t kdim, int64_t kk, int64_t l0)
      : panel_stride(kdim * NR), j(l0 % NR), at(b + kk * NR + (l0 / NR) * kdim * NR) {}

  void advance(int64_t m) {
    j += m;
    if (j == NR) {
      j = 0;
      at += panel_stride;
    }
  }
  void zeros(int64_t count) {
    while (count > 0) {
      const int64_t m = std::min(count, NR - j);
      std::fill(at + j, at + j + m, 0.0f);
      count -= m;
      advance(m);
    }
  }
  void copy(const float* src, int64_t count) {
    while (count > 0) {
      const int64_t m = std::min(count, NR - j);
      std::memcpy(at + j, src, static_cast<size_t>(m) * sizeof(float));
      src += m;
      count -= m;
      advance(m);
    }
  }
};

// dy of a chunk as B panels: B_g[k][l] = dy[n0 + l/PQ, g*Kg + k, l%PQ], depth Kg.
void pack_dy_b(const ConvGeom& g, const float* dy, int64_t n0, int64_t nb, float* b) {
  const int64_t len = nb * g.plane, len_pad = round_up(len, NR), units = g.k * nb;
  const int64_t kplane = g.k * g.plane;
#pragma omp parallel for schedule(static) if (units * g.plane >= cpu::kParallelMinWork)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t kk = u / nb, i = u % nb, gi = kk / g.kg;
    PanelRowWriter out(b + gi * g.kg * len_pad, g.kg, kk % g.kg, i * g.plane);
    out.copy(dy + (n0 + i) * kplane + kk * g.plane, g.plane);
    if (i == nb - 1 && len_pad > len) out.zeros(len_pad - len);
  }
}

// ---- Implicit path: padded copies --------------------------------------------------------

// d (a rows x cols plane) = s (an h x w plane) placed at (top, left), zero elsewhere.
void pad_plane(const float* s, int64_t h, int64_t w, int64_t rows, int64_t cols, int64_t top, int64_t left, float* d) {
  std::fill(d, d + top * cols, 0.0f);
  for (int64_t y = 0; y < h; ++y) {
    float* drow = d + (top + y) * cols;
    std::fill(drow, drow + left, 0.0f);
    std::memcpy(drow + left, s + y * w, static_cast<size_t>(w) * sizeof(float));
    std::fill(drow + left + w, drow + cols, 0.0f);
  }
  std::fill(d + (top + h) * cols, d + rows * cols, 0.0f);
}

// dst[i][ch] (rows x cols planes, plus NR zeros of slack at the end) = src[n0 + i][ch]
// (h x w planes) placed at (top, left), zero elsewhere.
void pad_planes(const float* src, int64_t n0, int64_t nb, int64_t channels, int64_t h, int64_t w, int64_t rows,
                int64_t cols, int64_t top, int64_t left, float* dst) {
  const int64_t units = nb * channels, dplane = rows * cols;
#pragma omp parallel for schedule(static) if (units * dplane >= cpu::kParallelMinWork)
  for (int64_t u = 0; u < units; ++u)
    pad_plane(src + (n0 * channels + u) * h * w, h, w, rows, cols, top, left, dst + u * dplane);
  std::fill(dst + units * dplane, dst + units * dplane + NR, 0.0f);
}

// dy of a chunk, transposed, as B panels for the implicit dw: for image i, column l = p*Wp + q
// of the padded width, B[l][k] = dy[n0 + i, g*Kg + k, p, q] (0 for q >= Q and k >= Kg).
// Layout: [group][k panel][image][l][NR].
void pack_dy_t(const ConvGeom& g, const float* dy, int64_t n0, int64_t nb, float* b) {
  const int64_t nk = ceil_div(g.kg, NR), units = g.groups * nk * nb, kplane = g.k * g.plane;
#pragma omp parallel for schedule(static) if (units * NR * g.limg >= cpu::kParallelMinWork)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t gi = u / (nk * nb), jk = (u / nb) % nk, i = u % nb;
    float* d = b + u * g.limg * NR;
    const int64_t jn = std::min(NR, g.kg - jk * NR);
    const float* src = dy + (n0 + i) * kplane + (gi * g.kg + jk * NR) * g.plane;
    for (int64_t pp = 0; pp < g.p; ++pp) {
      const int64_t cols = pp == g.p - 1 ? g.q : g.wp;
      for (int64_t qq = 0; qq < cols; ++qq, d += NR) {
        if (qq >= g.q) {
          std::fill(d, d + NR, 0.0f);
          continue;
        }
        const float* s = src + pp * g.q + qq;
        for (int64_t j = 0; j < jn; ++j) d[j] = s[j * g.plane];
        for (int64_t j = jn; j < NR; ++j) d[j] = 0.0f;
      }
    }
  }
}

// Maps the columns of a tile on a padded width back to output positions: for the nr
// columns starting at flat column l0 (row = l / pitch, col = l % pitch), calls
// f(j, row, col, count) for each run of `count` columns with col < width, j the first
// column's index in the tile.
template <class F>
inline void for_column_runs(int64_t l0, int64_t nr, int64_t pitch, int64_t width, const F& f) {
  int64_t row = l0 / pitch, col = l0 % pitch;
  for (int64_t j = 0; j < nr;) {
    const int64_t step = std::min(nr - j, pitch - col);
    if (col < width) f(j, row, col, std::min(step, width - col));
    j += step;
    col += step;
    if (col == pitch) col = 0, ++row;
  }
}

// ---- Direct path: tiles of MR output positions by NR channels -----------------------------

// Packs a depth x channels matrix given by src(d, ch) into B panels of NR channels:
// b[(jb * depth + d) * NR + j] = src(d, jb * NR + j), zero past `channels`.
template <class Src>
void pack_b(int64_t depth, int64_t channels, float* b, const Src& src) {
  const int64_t blocks = ceil_div(channels, NR);
  for (int64_t jb = 0; jb < blocks; ++jb) {
    const int64_t jn = std::min(NR, channels - jb * NR);
    for (int64_t d = 0; d < depth; ++d) {
      float* o = b + (jb * depth + d) * NR;
      for (int64_t j = 0; j < jn; ++j) o[j] = src(d, jb * NR + j);
      for (int64_t j = jn; j < NR; ++j) o[j] = 0.0f;
    }
  }
}

// The output positions of an image: where each one's window starts in the padded input,
// and where its value goes in an output plane.
struct Positions {
  int64_t plane, width;    // output positions per image and per row
  int64_t in_row, in_col;  // padded-input floats per output row and column

  // in_off and out_off of the MR positions from l0 on (past the plane: the last one again).
  void tile(int64_t l0, int64_t* in_off, int64_t* out_off) const {
    int64_t pos = l0, row = l0 / width, col = l0 % width;
    for (int64_t i = 0; i < MR; ++i) {
      in_off[i] = row * in_row + col * in_col;
      out_off[i] = pos;
      if (pos + 1 >= plane) continue;
      ++pos;
      if (++col == width) col = 0, ++row;
    }
  }
};

// One image: out[group * channels + ch][pos] = sum over d of in[position + off[d]] *
// b[d][ch] (+ bias[ch] in the forward pass, + 0 without one, as the other paths do), for
// every group: `in` holds the image's padded input (in_group floats between groups), b the
// B panels [group][channel block][depth][NR]. Tiles of MR positions by NR channels, channel
// blocks innermost (they share the A rows); one thread.
void direct_image(const MicroKernels& mk, const Positions& ps, int64_t groups, int64_t channels, const float* in,
                  int64_t in_group, const int64_t* off, int64_t depth, const float* b, bool forward, const float* bias,
                  float* out) {
  const int64_t blocks = ceil_div(channels, NR), ptiles = ceil_div(ps.plane, MR);
  for (int64_t t = 0; t < groups * ptiles * blocks; ++t) {
    const int64_t gi = t / (ptiles * blocks), pt = (t / blocks) % ptiles, jb = t % blocks;
    int64_t in_off[MR], out_off[MR];
    ps.tile(pt * MR, in_off, out_off);
    TableA a;
    for (int64_t i = 0; i < MR; ++i) a.rows[i] = in + gi * in_group + in_off[i];
    a.off = off;
    alignas(64) float tile[MR * NR];
    mk.table_a(depth, a, PackedB{b + (gi * blocks + jb) * depth * NR}, tile, false);
    const int64_t mr = std::min(MR, ps.plane - pt * MR), nr = std::min(NR, channels - jb * NR);
    const int64_t ch0 = gi * channels + jb * NR;
    float add[NR];
    for (int64_t j = 0; j < nr; ++j) add[j] = bias ? bias[ch0 + j] : 0.0f;
    int64_t j0 = 0;
    if (mr == MR) {  // the positions are one run of each channel's plane
      static_assert(MR == 8, "the stores transpose 8 x 8 blocks");
      for (; j0 + 8 <= nr; j0 += 8)
        transpose8(tile + j0, NR, out + (ch0 + j0) * ps.plane + out_off[0], ps.plane, forward ? add + j0 : nullptr);
    }
    for (int64_t j = j0; j < nr; ++j) {
      float* o = out + (ch0 + j) * ps.plane;
      if (forward) {
        for (int64_t i = 0; i < mr; ++i) o[out_off[i]] = tile[i * NR + j] + add[j];
      } else {
        for (int64_t i = 0; i < mr; ++i) o[out_off[i]] = tile[i * NR + j];
      }
    }
  }
}

// dy of image i of a chunk (len positions) transposed into the direct dw's B panels of NR
// channels: b[((gi * blocks + jb) * len + i * PQ + pos) * NR + j] =
// dy[n0 + i, gi * Kg + jb * NR + j, pos], zero past Kg. One thread.
void pack_dy_direct(const ConvGeom& g, const float* dy_image, int64_t i, int64_t len, float* b) {
  const int64_t blocks = g.kblocks();
  for (int64_t gi = 0; gi < g.groups; ++gi)
    for (int64_t jb = 0; jb < blocks; ++jb) {
      float* d = b + ((gi * blocks + jb) * len + i * g.plane) * NR;
      const int64_t jn = std::min(NR, g.kg - jb * NR);
      const float* src = dy_image + (gi * g.kg + jb * NR) * g.plane;
      const int64_t j8 = jn / 8 * 8, l8 = g.plane / 8 * 8;
      for (int64_t l = 0; l < l8; l += 8)
        for (int64_t j = 0; j < j8; j += 8) transpose8(src + j * g.plane + l, g.plane, d + l * NR + j, NR);
      for (int64_t l = 0; l < g.plane; ++l, d += NR) {
        for (int64_t j = l < l8 ? j8 : 0; j < jn; ++j) d[j] = src[j * g.plane + l];
        for (int64_t j = jn; j < NR; ++j) d[j] = 0.0f;
      }
    }
}

// Direct dw: dw_g[ch][kk] += sum over the chunk's positions l of x_pad[pos_off[l] + off[kk]]
// * dy[l][ch], as tiles of MR rows kk by NR channels, each one FMA chain over the chunk in
// position order (the im2col path's order). Called by every thread of a parallel region
// (or outside one): each thread takes a fixed range of tiles and walks the positions in
// blocks of kDwBlock, all its tiles per block, so that the block of dy^T stays in cache;
// the chains continue across blocks through `acc`.
void direct_dw(const MicroKernels& mk, const ConvGeom& g, int64_t len, const float* xpad, const int64_t* off,
               const int64_t* pos_off, const float* dyt, float* acc, float* dw) {
  const int64_t mp = ceil_div(g.grows, MR), blocks = g.kblocks(), tiles = g.dw_tiles();
  const int64_t group_in = g.cg * g.hp * g.wp;
  {
    const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t t0 = tiles * tid / nth, t1 = tiles * (tid + 1) / nth;
    for (int64_t l0 = 0; l0 < len; l0 += kDwBlock) {
      const int64_t depth = std::min(kDwBlock, len - l0);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t gi = t / (blocks * mp), jb = (t / mp) % blocks, ip = t % mp;
        TableA a;
        for (int64_t i = 0; i < MR; ++i) a.rows[i] = xpad + gi * group_in + off[std::min(ip * MR + i, g.grows - 1)];
        a.off = pos_off + l0;
        mk.table_a(depth, a, PackedB{dyt + ((gi * blocks + jb) * len + l0) * NR}, acc + t * MR * NR, l0 > 0);
      }
    }
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t gi = t / (blocks * mp), jb = (t / mp) % blocks, ip = t % mp;
      const int64_t mr = std::min(MR, g.grows - ip * MR), nr = std::min(NR, g.kg - jb * NR);
      const float* tile = acc + t * MR * NR;
      for (int64_t j = 0; j < nr; ++j) {
        float* d = dw + (gi * g.kg + jb * NR + j) * g.grows + ip * MR;
        for (int64_t i = 0; i < mr; ++i) d[i] += tile[i * NR + j];
      }
    }
  }
}

// off[kk] for kk = (c, r, s) of a group: where row kk of the column matrix starts in the
// group's padded input, relative to an output position's window.
void fill_x_offsets(const ConvGeom& g, int64_t* off) {
  for (int64_t cc = 0, kk = 0; cc < g.cg; ++cc)
    for (int64_t rr = 0; rr < g.r; ++rr)
      for (int64_t ss = 0; ss < g.s; ++ss) off[kk++] = (cc * g.hp + rr * g.dh) * g.wp + ss * g.dw;
}

// The same for the dx of stride 1 over the padded dy: d = (k, r, s) of a group.
void fill_dy_offsets(const ConvGeom& g, int64_t* off) {
  for (int64_t kk = 0, d = 0; kk < g.kg; ++kk)
    for (int64_t rr = 0; rr < g.r; ++rr)
      for (int64_t ss = 0; ss < g.s; ++ss) off[d++] = (kk * g.hq + rr * g.dh) * g.wq + ss * g.dw;
}

}  // namespace

namespace cpu_conv {

std::vector<std::string> available_micro_kernels() {
  std::vector<std::string> out;
  for (const MicroKernels* k : supported_kernels()) out.emplace_back(k->name);
  return out;
}

std::string micro_kernel() { return g_kernels->name; }

void use_micro_kernel(const std::string& name) {
  for (const MicroKernels* k : supported_kernels())
    if (name == k->name) {
      g_kernels = k;
      return;
    }
  REMAT_THROW("conv2d: micro-kernel \"", name, "\" is unknown or not supported by this CPU");
}

Path path() { return g_path; }
void set_path(Path p) { g_path = p; }
const char* path_name(Path p) {
  switch (p) {
    case Path::im2col: return "im2col";
    case Path::implicit: return "implicit";
    case Path::direct: return "direct";
    default: return "automatic";
  }
}

int64_t chunk_images() { return g_chunk_images; }
void set_chunk_images(int64_t images) {
  REMAT_CHECK(images >= 0, "conv2d: chunk_images must be >= 0, got ", images);
  g_chunk_images = images;
}

}  // namespace cpu_conv

namespace {

// The fp32 convolution of the images of g (x, y and the workspace layout of g).
void conv_forward(const ConvGeom& g, const float* xp, const float* wp, const float* bp, float* yp, float* ws) {
  const int64_t kplane = g.k * g.plane;
  if (g.trivial()) {  // y is the bias
    const int64_t units = g.n * g.k;
#pragma omp parallel for schedule(static) if (units * g.plane >= cpu::kParallelMinWork)
    for (int64_t u = 0; u < units; ++u) std::fill(yp + u * g.plane, yp + (u + 1) * g.plane, bp ? bp[u % g.k] : 0.0f);
    return;
  }
  const MicroKernels& mk = *g_kernels;
  const auto lay = g.fwd_layout();
  if (g.y_feed != Feed::im2col) fill_x_offsets(g, reinterpret_cast<int64_t*>(ws + lay.off));

  if (g.y_feed == Feed::direct) {
    const int64_t b_stride = g.kblocks() * g.grows * NR;
    for (int64_t gi = 0; gi < g.groups; ++gi)
      pack_b(g.grows, g.kg, ws + lay.b + gi * b_stride,
             [&](int64_t kk, int64_t ch) { return wp[(gi * g.kg + ch) * g.grows + kk]; });
    // One parallel region: each thread pads its images of a chunk and computes their tiles
    // (the barrier ending each chunk's loop guards the padded copies).
    float* xpad = ws + lay.xpad;
    const auto* off = reinterpret_cast<const int64_t*>(ws + lay.off);
    const Positions ps{g.plane, g.q, g.sh * g.wp, g.sw};
    const int64_t image_in = g.c * g.hp * g.wp;
#pragma omp parallel if (2 * g.n * g.k * g.grows * g.plane >= 64 * cpu::kParallelMinWork)
    for (int64_t n0 = 0; n0 < g.n; n0 += g.nb) {
      const int64_t nb = std::min(g.nb, g.n - n0);
#pragma omp for schedule(static)
      for (int64_t i = 0; i < nb; ++i) {
        float* xs = xpad + i * image_in;
        for (int64_t ch = 0; ch < g.c; ++ch)
          pad_plane(xp + ((n0 + i) * g.c + ch) * g.h * g.w, g.h, g.w, g.hp, g.wp, g.ph, g.pw, xs + ch * g.hp * g.wp);
        direct_image(mk, ps, g.groups, g.kg, xs, g.cg * g.hp * g.wp, off, g.grows, ws + lay.b, /*forward=*/true, bp,
                     yp + (n0 + i) * kplane);
      }
    }
    return;
  }

  float* pa = ws + lay.a;
  const int64_t a_stride = round_up(g.kg, MR) * g.grows, mp = ceil_div(g.kg, MR);
  for (int64_t gi = 0; gi < g.groups; ++gi)
    pack_a(g.kg, g.grows, pa + gi * a_stride,
           [&](int64_t i, int64_t kk) { return wp[(gi * g.kg + i) * g.grows + kk]; });

  if (g.y_feed == Feed::implicit) {
    const auto* off = reinterpret_cast<const int64_t*>(ws + lay.off);
    float* xpad = ws + lay.xpad;
    const int64_t ntl = ceil_div(g.limg, NR);
    for (int64_t n0 = 0; n0 < g.n; n0 += g.nb) {
      const int64_t nb = std::min(g.nb, g.n - n0);
      pad_planes(xp, n0, nb, g.c, g.h, g.w, g.hp, g.wp, g.ph, g.pw, xpad);
      for_tiles(g.groups * nb * ntl * mp, 2 * MR * NR * g.grows, [&](int64_t t) {
        const int64_t gi = t / (nb * ntl * mp), i = (t / (ntl * mp)) % nb, jt = (t / mp) % ntl, ip = t % mp;
        alignas(64) float tile[MR * NR];
        mk.offset_b(g.grows, PackedA{pa + gi * a_stride + ip * MR * g.grows},
                    OffsetB{xpad + (i * g.c + gi * g.cg) * g.hp * g.wp + jt * NR, off}, tile, false);
        const int64_t mr = std::min(MR, g.kg - ip * MR), nr = std::min(NR, g.limg - jt * NR);
        float* out = yp + (n0 + i) * kplane + (gi * g.kg + ip * MR) * g.plane;
        for (int64_t ii = 0; ii < mr; ++ii) {
          const float bias = bp ? bp[gi * g.kg + ip * MR + ii] : 0.0f;
          const float* tr = tile + ii * NR;
          float* orow = out + ii * g.plane;
          for_column_runs(jt * NR, nr, g.wp, g.q, [&](int64_t j, int64_t pp, int64_t qq, int64_t count) {
            float* d = orow + pp * g.q + qq;
            for (int64_t t = 0; t < count; ++t) d[t] = tr[j + t] + bias;
          });
        }
      });
    }
    return;
  }

  float* pb = ws + lay.b;
  for (int64_t n0 = 0; n0 < g.n; n0 += g.nb) {
    const int64_t nb = std::min(g.nb, g.n - n0), len = nb * g.plane, len_pad = round_up(len, NR);
    im2col_panels(g, xp, n0, nb, pb);
    const int64_t np = len_pad / NR;
    float* out = yp + n0 * kplane;
    for_tiles(g.groups * np * mp, 2 * MR * NR * g.grows, [&](int64_t t) {
      const int64_t gi = t / (np * mp), jp = (t / mp) % np, ip = t % mp;
      alignas(64) float tile[MR * NR];
      mk.packed(g.grows, PackedA{pa + gi * a_stride + ip * MR * g.grows},
                PackedB{pb + gi * g.grows * len_pad + jp * NR * g.grows}, tile, false);
      const int64_t mr = std::min(MR, g.kg - ip * MR), nr = std::min(NR, len - jp * NR);
      const int64_t j0 = jp * NR;
      for (int64_t ii = 0; ii < mr; ++ii) {
        const int64_t m = gi * g.kg + ip * MR + ii;
        const float bias = bp ? bp[m] : 0.0f;
        const float* tr = tile + ii * NR;
        for_column_runs(j0, nr, g.plane, g.plane, [&](int64_t j, int64_t img, int64_t pos, int64_t count) {
          float* d = out + img * kplane + m * g.plane + pos;
          for (int64_t t = 0; t < count; ++t) d[t] = tr[j + t] + bias;
        });
      }
    });
  }
}

// db[k] += the sum of dy over images and positions: per channel one double sum over the
// images in order (cpu::sum_f64 of each plane), whatever the chunks.
void conv_bias_grad(const ConvGeom& g, const Tensor& dy, float* dbp) {
  const int64_t kplane = g.k * g.plane;
  if (g.n == 0) return;
#pragma omp parallel for schedule(static) if (g.n * kplane >= cpu::kParallelMinWork)
  for (int64_t kk = 0; kk < g.k; ++kk) {
    cpu::F32Reader rdy(dy, 0);
    double sum = 0.0;
    for (int64_t i = 0; i < g.n; ++i) sum += cpu::sum_f64(rdy.get(i * kplane + kk * g.plane, g.plane), g.plane);
    dbp[kk] += static_cast<float>(sum);
  }
}

// The fp32 dx (when dxp) and dw += (when dwp) of the images of g (dy, x, dx and the workspace
// layout of g). The bias gradient is conv_bias_grad's.
void conv_backward(const ConvGeom& g, const float* dyp, const float* xp, const float* wp, float* dxp, float* dwp,
                   float* ws) {
  const int64_t kplane = g.k * g.plane;
  const bool need_dx = dxp != nullptr, need_dw = dwp != nullptr;
  if (!need_dx && !need_dw) return;
  if (g.trivial()) {  // dx is 0 (no output position or filter sees it); dw gets nothing
    if (need_dx) std::fill(dxp, dxp + g.n * g.c * g.h * g.w, 0.0f);
    return;
  }
  const MicroKernels& mk = *g_kernels;
  const auto lay = g.bwd_layout();

  // dx operands that do not depend on the chunk.
  const int64_t wt_stride = round_up(g.grows, MR) * g.kg;  // im2col: w_g^T [Cg*R*S, Kg]
  const int64_t wf_stride = round_up(g.cg, MR) * g.krows;  // implicit: flipped [Cg, Kg*R*S]
  const int64_t wfb_stride = g.cblocks() * g.krows * NR;   // direct: flipped [Kg*R*S, Cg]
  auto flipped = [&](int64_t gi, int64_t d, int64_t cc) {  // w_g flipped and transposed
    const int64_t kk = d / (g.r * g.s), rr = g.r - 1 - (d / g.s) % g.r, ss = g.s - 1 - d % g.s;
    return wp[(((gi * g.kg + kk) * g.cg + cc) * g.r + rr) * g.s + ss];
  };
  const auto* offdx = reinterpret_cast<const int64_t*>(ws + lay.offdx);
  if (need_dx && g.dx_feed != Feed::im2col) fill_dy_offsets(g, reinterpret_cast<int64_t*>(ws + lay.offdx));
  if (need_dx && g.dx_feed == Feed::direct) {
    for (int64_t gi = 0; gi < g.groups; ++gi)
      pack_b(g.krows, g.cg, ws + lay.wflip + gi * wfb_stride,
             [&](int64_t d, int64_t cc) { return flipped(gi, d, cc); });
  } else if (need_dx && g.dx_feed == Feed::implicit) {
    for (int64_t gi = 0; gi < g.groups; ++gi)
      pack_a(g.cg, g.krows, ws + lay.wflip + gi * wf_stride, [&](int64_t cc, int64_t d) { return flipped(gi, d, cc); });
  } else if (need_dx) {
    for (int64_t gi = 0; gi < g.groups; ++gi)
      pack_a(g.grows, g.kg, ws + lay.wt + gi * wt_stride,
             [&](int64_t kk, int64_t m) { return wp[(gi * g.kg + m) * g.grows + kk]; });
  }
  const auto* off = reinterpret_cast<const int64_t*>(ws + lay.off);
  if (need_dw && g.y_feed != Feed::im2col) fill_x_offsets(g, reinterpret_cast<int64_t*>(ws + lay.off));

  // The direct path's work on a chunk, called by every thread of a parallel region: each
  // thread pads and packs its images (x_pad and dy^T for dw; the padded dy and then that
  // image's dx tiles), and after the barrier that ends that loop, its range of dw tiles over
  // the whole chunk; the last barrier guards the chunk's buffers against the next chunk.
  const bool dw_direct = need_dw && g.y_feed == Feed::direct, dx_direct = need_dx && g.dx_feed == Feed::direct;
  auto direct_chunk = [&](int64_t n0, int64_t nb) {
    const int64_t len = nb * g.plane;
    float* xpad = ws + lay.xpad;
    float* dypad = ws + lay.dypad;
    auto* pos = reinterpret_cast<int64_t*>(ws + lay.pos);
    const Positions xpos{g.plane, g.q, g.sh * g.wp, g.sw};
    const Positions dxpos{g.h * g.w, g.w, g.wq, 1};
#pragma omp for schedule(static)
    for (int64_t i = 0; i < nb; ++i) {
      if (dw_direct) {
        float* xs = xpad + i * g.c * g.hp * g.wp;
        for (int64_t ch = 0; ch < g.c; ++ch)
          pad_plane(xp + ((n0 + i) * g.c + ch) * g.h * g.w, g.h, g.w, g.hp, g.wp, g.ph, g.pw, xs + ch * g.hp * g.wp);
        pack_dy_direct(g, dyp + (n0 + i) * kplane, i, len, ws + lay.dyt);
        for (int64_t l = 0; l < g.plane; l += MR) {
          int64_t in_off[MR], out_off[MR];
          xpos.tile(l, in_off, out_off);
          for (int64_t t = 0; t < std::min(MR, g.plane - l); ++t)
            pos[i * g.plane + l + t] = i * g.c * g.hp * g.wp + in_off[t];
        }
      }
      if (dx_direct) {
        float* ds = dypad + i * g.k * g.hq * g.wq;
        for (int64_t ch = 0; ch < g.k; ++ch)
          pad_plane(dyp + ((n0 + i) * g.k + ch) * g.plane, g.p, g.q, g.hq, g.wq, g.dy_top, g.dy_left,
                    ds + ch * g.hq * g.wq);
        direct_image(mk, dxpos, g.groups, g.cg, ds, g.kg * g.hq * g.wq, offdx, g.krows, ws + lay.wflip,
                     /*forward=*/false, nullptr, dxp + (n0 + i) * g.c * g.h * g.w);
      }
    }
    if (dw_direct) {
      direct_dw(mk, g, len, xpad, off, pos, ws + lay.dyt, ws + lay.acc, dwp);
#pragma omp barrier
    }
  };
  const bool parallel = 2 * g.n * g.k * g.grows * g.plane >= 64 * cpu::kParallelMinWork;
  if ((dw_direct || !need_dw) && (dx_direct || !need_dx)) {  // all direct: one parallel region
#pragma omp parallel if (parallel)
    for (int64_t n0 = 0; n0 < g.n; n0 += g.nb) direct_chunk(n0, std::min(g.nb, g.n - n0));
    return;
  }

  for (int64_t n0 = 0; n0 < g.n; n0 += g.nb) {
    const int64_t nb = std::min(g.nb, g.n - n0), len = nb * g.plane, len_pad = round_up(len, NR);
    if (dw_direct || dx_direct) {
#pragma omp parallel if (parallel)
      direct_chunk(n0, nb);
    }

    if (dw_direct) {
      // done above
    } else if (need_dw && g.y_feed == Feed::implicit) {
      // dw_g^T [Cg*R*S, Kg] = sum over images of x_pad rows [Cg*R*S, limg] @ dy^T [limg, Kg].
      float* xpad = ws + lay.xpad;
      float* dyt = ws + lay.dyt;
      pad_planes(xp, n0, nb, g.c, g.h, g.w, g.hp, g.wp, g.ph, g.pw, xpad);
      pack_dy_t(g, dyp, n0, nb, dyt);
      const int64_t mpc = ceil_div(g.grows, MR), nk = ceil_div(g.kg, NR);
      for_tiles(g.groups * mpc * nk, 2 * MR * NR * nb * g.limg, [&](int64_t t) {
        const int64_t gi = t / (mpc * nk), ip = (t / nk) % mpc, jk = t % nk;
        alignas(64) float tile[MR * NR];
        for (int64_t i = 0; i < nb; ++i) {
          RowsA rows;
          const float* base = xpad + (i * g.c + gi * g.cg) * g.hp * g.wp;
          for (int64_t ii = 0; ii < MR; ++ii) rows.rows[ii] = base + off[std::min(ip * MR + ii, g.grows - 1)];
          mk.rows_a(g.limg, rows, PackedB{dyt + ((gi * nk + jk) * nb + i) * g.limg * NR}, tile, i > 0);
        }
        const int64_t mr = std::min(MR, g.grows - ip * MR), nr = std::min(NR, g.kg - jk * NR);
        for (int64_t j = 0; j < nr; ++j) {
          float* d = dwp + (gi * g.kg + jk * NR + j) * g.grows + ip * MR;
          for (int64_t ii = 0; ii < mr; ++ii) d[ii] += tile[ii * NR + j];
        }
      });
    } else if (need_dw) {
      float* dya = ws + lay.dya;
      float* colt = ws + lay.colt;
      pack_dy_a(g, dyp, n0, nb, dya);
      im2col_t_panels(g, xp, n0, nb, colt);
      const int64_t mp = ceil_div(g.kg, MR), np = ceil_div(g.grows, NR);
      for_tiles(g.groups * np * mp, 2 * MR * NR * len, [&](int64_t t) {
        const int64_t gi = t / (np * mp), jp = (t / mp) % np, ip = t % mp;
        alignas(64) float tile[MR * NR];
        mk.packed(len, PackedA{dya + (gi * mp + ip) * MR * len}, PackedB{colt + (gi * np + jp) * NR * len}, tile,
                  false);
        const int64_t mr = std::min(MR, g.kg - ip * MR), nr = std::min(NR, g.grows - jp * NR);
        for (int64_t ii = 0; ii < mr; ++ii) {
          float* d = dwp + (gi * g.kg + ip * MR + ii) * g.grows + jp * NR;
          for (int64_t j = 0; j < nr; ++j) d[j] += tile[ii * NR + j];
        }
      });
    }

    if (dx_direct) {
      // done above
    } else if (need_dx && g.dx_feed == Feed::implicit) {
      // dx_g [Cg, H x Wq] = flipped w_g^T [Cg, Kg*R*S] @ rows of the padded dy.
      float* dypad = ws + lay.dypad;
      pad_planes(dyp, n0, nb, g.k, g.p, g.q, g.hq, g.wq, g.dy_top, g.dy_left, dypad);
      const int64_t ntl = ceil_div(g.ldx, NR), mp = ceil_div(g.cg, MR);
      for_tiles(g.groups * nb * ntl * mp, 2 * MR * NR * g.krows, [&](int64_t t) {
        const int64_t gi = t / (nb * ntl * mp), i = (t / (ntl * mp)) % nb, jt = (t / mp) % ntl, ip = t % mp;
        alignas(64) float tile[MR * NR];
        mk.offset_b(g.krows, PackedA{ws + lay.wflip + gi * wf_stride + ip * MR * g.krows},
                    OffsetB{dypad + (i * g.k + gi * g.kg) * g.hq * g.wq + jt * NR, offdx}, tile, false);
        const int64_t mr = std::min(MR, g.cg - ip * MR), nr = std::min(NR, g.ldx - jt * NR);
        float* out = dxp + ((n0 + i) * g.c + gi * g.cg + ip * MR) * g.h * g.w;
        for (int64_t ii = 0; ii < mr; ++ii) {
          const float* tr = tile + ii * NR;
          float* orow = out + ii * g.h * g.w;
          for_column_runs(jt * NR, nr, g.wq, g.w, [&](int64_t j, int64_t hh, int64_t ww, int64_t count) {
            std::memcpy(orow + hh * g.w + ww, tr + j, static_cast<size_t>(count) * sizeof(float));
          });
        }
      });
    } else if (need_dx) {
      float* dyb = ws + lay.dyb;
      float* col = ws + lay.col;
      pack_dy_b(g, dyp, n0, nb, dyb);
      const int64_t mp = ceil_div(g.grows, MR), np = len_pad / NR;
      for_tiles(g.groups * np * mp, 2 * MR * NR * g.kg, [&](int64_t t) {
        const int64_t gi = t / (np * mp), jp = (t / mp) % np, ip = t % mp;
        alignas(64) float tile[MR * NR];
        mk.packed(g.kg, PackedA{ws + lay.wt + gi * wt_stride + ip * MR * g.kg},
                  PackedB{dyb + gi * g.kg * len_pad + jp * NR * g.kg}, tile, false);
        const int64_t mr = std::min(MR, g.grows - ip * MR), nr = std::min(NR, len - jp * NR);
        for (int64_t ii = 0; ii < mr; ++ii)
          std::memcpy(col + (gi * g.grows + ip * MR + ii) * len + jp * NR, tile + ii * NR,
                      static_cast<size_t>(nr) * sizeof(float));
      });
      col2im(g, col, n0, nb, dxp);
    }
  }
}

// ---- bf16 storage (training.precision bf16) --------------------------------------------
// A bf16 x, y, dy or dx is staged a chunk of images at a time (the op's own chunks, ConvGeom::nb)
// in fp32 after the chunk's fp32 workspace, and each chunk runs the fp32 code above as a
// convolution of its own images. A chunk's geometry is that of the whole op's chunk (the same
// feeds, one chunk), so y and dx are bitwise the fp32 op's on the same (rounded) values
// before their own rounding, and dw and db too (dw adds chunk by chunk in order, db is
// summed over the whole batch as in fp32). The filters and the bias (bf16 working copies)
// are widened whole into staging (parameter-sized, mixed.h). The staging is workspace, so the
// memory model counts it: the queries add it under activation_dtype() bf16.

int64_t stage_offset(int64_t layout_floats) { return round_up(layout_floats, 16); }

// Floats of the staged chunk buffers after the fp32 layout: x and y (forward); dy, x and dx (backward).
int64_t fwd_stage_floats(const ConvGeom& g) { return g.nb * (g.c * g.h * g.w + g.k * g.plane); }
int64_t bwd_stage_floats(const ConvGeom& g) { return g.nb * (g.k * g.plane + 2 * g.c * g.h * g.w); }

// The chunk of `imgs` images from image n0 of t, `per` elements an image, in fp32: a pointer
// into t when f32, else converted into `buf`.
const float* chunk_in(const Tensor& t, int64_t n0, int64_t imgs, int64_t per, float* buf) {
  if (!cpu::is_bf16(t)) return t.f32() + n0 * per;
  const uint16_t* h = t.bf16() + n0 * per;
  cpu::parallel_for(imgs, 1,
                    [&](int64_t i0, int64_t i1) { cpu::bf16_to_f32(h + i0 * per, buf + i0 * per, (i1 - i0) * per); });
  return buf;
}
float* chunk_out(const Tensor& t, int64_t n0, int64_t per, float* buf) {
  return cpu::is_bf16(t) ? buf : t.f32() + n0 * per;
}
void chunk_put(const Tensor& t, int64_t n0, int64_t imgs, int64_t per, const float* buf) {
  if (!cpu::is_bf16(t)) return;
  uint16_t* h = t.bf16() + n0 * per;
  cpu::parallel_for(imgs, 1,
                    [&](int64_t i0, int64_t i1) { cpu::f32_to_bf16(buf + i0 * per, h + i0 * per, (i1 - i0) * per); });
}

// The geometry of the chunk of `imgs` images starting anywhere: one chunk of the op's.
ConvGeom chunk_geom(const ConvGeom& g, int64_t imgs, const Shape& w, const Conv2dParams& prm) {
  ConvGeom c(Shape{imgs, g.c, g.h, g.w}, w, prm);
  REMAT_CHECK(c.nb == imgs && c.y_feed == g.y_feed && c.dx_feed == g.dx_feed, "conv2d: chunk of ", imgs,
              " images planned as ", c.nb, " (internal)");
  return c;
}

}  // namespace

size_t cpu::conv2d_forward_workspace(const Shape& x, const Shape& w, const Conv2dParams& p) {
  const ConvGeom g(x, w, p);
  if (g.trivial()) return 0;
  if (activation_dtype() != DType::bf16) return g.fwd_bytes();
  return static_cast<size_t>(stage_offset(g.fwd_layout().total) + fwd_stage_floats(g)) * sizeof(float);
}

size_t cpu::conv2d_backward_workspace(const Shape& x, const Shape& w, const Conv2dParams& p) {
  const ConvGeom g(x, w, p);
  if (g.trivial()) return 0;
  if (activation_dtype() != DType::bf16) return g.bwd_bytes();
  return static_cast<size_t>(stage_offset(g.bwd_layout().total) + bwd_stage_floats(g)) * sizeof(float);
}

size_t CpuBackend::conv2d_forward_workspace_impl(const Shape& x, const Shape& w, const Conv2dParams& p) {
  return cpu::conv2d_forward_workspace(x, w, p);
}

size_t CpuBackend::conv2d_backward_workspace_impl(const Shape& x, const Shape& w, const Conv2dParams& p) {
  return cpu::conv2d_backward_workspace(x, w, p);
}

void CpuBackend::conv2d_forward_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& prm,
                                     const Tensor& y, const Tensor& workspace) {
  const ConvGeom g(x.shape(), w.shape(), prm);
  float* ws = workspace.defined() ? workspace.f32() : nullptr;
  if (cpu::all_f32({&x, &w, &b, &y}))
    return conv_forward(g, x.f32(), w.f32(), b.defined() ? b.f32() : nullptr, y.f32(), ws);
  const float* wp = cpu::f32_all(w, 1);
  const float* bp = b.defined() ? cpu::f32_all(b, 2) : nullptr;
  const int64_t per_x = g.c * g.h * g.w, per_y = g.k * g.plane;
  if (g.trivial()) {  // y is the bias
    for (int64_t i = 0; i < g.n; ++i)
      for (int64_t kk = 0; kk < g.k; ++kk) {
        cpu::F32Writer wy(y, 3);
        float* d = wy.get(i * per_y + kk * g.plane, g.plane);
        std::fill(d, d + g.plane, bp ? bp[kk] : 0.0f);
        wy.put();
      }
    return;
  }
  float* xs = ws + stage_offset(g.fwd_layout().total);
  float* ys = xs + g.nb * per_x;
  for (int64_t n0 = 0; n0 < g.n; n0 += g.nb) {
    const int64_t nb = std::min(g.nb, g.n - n0);
    const ConvGeom gc = chunk_geom(g, nb, w.shape(), prm);
    float* yc = chunk_out(y, n0, per_y, ys);
    conv_forward(gc, chunk_in(x, n0, nb, per_x, xs), wp, bp, yc, ws);
    chunk_put(y, n0, nb, per_y, yc);
  }
}

void CpuBackend::conv2d_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, const Conv2dParams& prm,
                                      const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& workspace) {
  const ConvGeom g(x.shape(), w.shape(), prm);
  if (db.defined()) conv_bias_grad(g, dy, db.f32());
  float* ws = workspace.defined() ? workspace.f32() : nullptr;
  float* dwp = dw.defined() ? dw.f32() : nullptr;
  if (cpu::all_f32({&dy, &x, &w, &dx}))
    return conv_backward(g, dy.f32(), x.f32(), w.f32(), dx.defined() ? dx.f32() : nullptr, dwp, ws);
  if (!dx.defined() && !dw.defined()) return;
  const int64_t per_x = g.c * g.h * g.w, per_y = g.k * g.plane;
  if (g.trivial()) {
    if (dx.defined())
      for (int64_t i = 0; i < g.n; ++i) {
        cpu::F32Writer wx(dx, 3);
        float* d = wx.get(i * per_x, per_x);
        std::fill(d, d + per_x, 0.0f);
        wx.put();
      }
    return;
  }
  const float* wp = cpu::f32_all(w, 1);
  float* dys = ws + stage_offset(g.bwd_layout().total);
  float* xs = dys + g.nb * per_y;
  float* dxs = xs + g.nb * per_x;
  for (int64_t n0 = 0; n0 < g.n; n0 += g.nb) {
    const int64_t nb = std::min(g.nb, g.n - n0);
    const ConvGeom gc = chunk_geom(g, nb, w.shape(), prm);
    const float* xc = dw.defined() ? chunk_in(x, n0, nb, per_x, xs) : nullptr;  // x is read for dw only
    float* dxc = dx.defined() ? chunk_out(dx, n0, per_x, dxs) : nullptr;
    conv_backward(gc, chunk_in(dy, n0, nb, per_y, dys), xc, wp, dxc, dwp, ws);
    if (dxc) chunk_put(dx, n0, nb, per_x, dxc);
  }
}

}  // namespace remat
