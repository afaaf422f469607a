// The CPU conv2d's internals, shared by its files (conv.cpp has the overview of the method):
//   conv.cpp                   the ops: workspace queries, bf16 staging, the bias gradient
//   conv_geom.cpp              geometry, chunks of images, the choice of feed, workspace layouts
//   conv_feeds.cpp             how the GEMMs get their operands: im2col / col2im and packing
//                              (explicit), padded copies (implicit), the direct path's tiles
//   conv_forward.cpp           y = conv(x, w) + b
//   conv_backward_weights.cpp  dw += the filters' gradient
//   conv_backward_data.cpp     dx
//   conv_microkernels.cpp      the MR x NR GEMM micro-kernels (AVX-512, AVX2, portable) and
//                              the 8 x 8 transposes: all the SIMD code
// It also declares the test hooks: which micro-kernel runs, which way the GEMMs get their
// operands, and how many images a chunk holds (process-wide and not thread-safe: for tests
// only).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/parallel.h"
#include "remat/backend.h"

namespace remat::cpu_conv {

// ---- Test hooks ------------------------------------------------------------------------

// The micro-kernels this CPU can run ("avx512", "avx2", "portable"), best first.
std::vector<std::string> available_micro_kernels();
// The micro-kernel in use (the best available unless changed).
std::string micro_kernel();
// Throws remat::Error for a name that is unknown or that this CPU cannot run.
void use_micro_kernel(const std::string& name);

// How the GEMMs get their operands: `automatic` (the default) chooses per GEMM from the
// shapes; the others force one way wherever it applies and im2col / col2im elsewhere:
// `im2col` everywhere, `implicit` (stride-1 GEMMs over the padded width), `direct`
// (tiles of output positions by channels; dx only for stride 1). The workspace queries
// follow the setting.
enum class Path { automatic, im2col, implicit, direct };
Path path();
void set_path(Path p);
const char* path_name(Path p);

// Images per chunk: 0 (the default) chooses from the shapes; n > 0 fixes chunks of n
// images (the last one partial), to test chunking on small shapes. The workspace queries
// follow the setting.
int64_t chunk_images();
void set_chunk_images(int64_t images);

// ---- Micro-kernels and transposes (conv_microkernels.cpp) -------------------------------
// tile[MR][NR] (=, or += with accumulate) sum_k a(k, i) * b(k)[j]: one FMA chain per
// element, k in order. Rows past M and columns past N are computed on whatever the
// operands hold there and dropped by the caller.
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

// One set of micro-kernels, one per pair of operand kinds; every set computes the same FMA
// chains, so they agree bit for bit.
struct MicroKernels {
  const char* name;
  void (*packed)(int64_t, const PackedA&, const PackedB&, float*, bool);
  void (*offset_b)(int64_t, const PackedA&, const OffsetB&, float*, bool);
  void (*rows_a)(int64_t, const RowsA&, const PackedB&, float*, bool);
  void (*table_a)(int64_t, const TableA&, const PackedB&, float*, bool);
};

// The set in use (use_micro_kernel).
const MicroKernels& micro_kernels();

// dst[j * ds + i] = src[i * ss + j] (+ add[j] when add is given), for i, j < 8: the direct
// path's stores and its dy^T. Copies, and the same float additions, whichever version runs.
void transpose8(const float* src, int64_t ss, float* dst, int64_t ds, const float* add = nullptr);

inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
inline int64_t ceil_div(int64_t v, int64_t m) { return (v + m - 1) / m; }

// Runs body(t) for t in [0, tiles): GEMM tiles, disjoint outputs, one thread each.
// Consecutive tiles share their B operand, which stays in cache while A panels pass over it.
template <class Body>
void for_tiles(int64_t tiles, int64_t flops_per_tile, const Body& body) {
#pragma omp parallel for schedule(static) if (tiles * flops_per_tile >= 64 * cpu::kParallelMinWork)
  for (int64_t t = 0; t < tiles; ++t) body(t);
}

// ---- Geometry, paths and workspace layout (conv_geom.cpp) ------------------------------

// How a GEMM of the convolution gets its operands (conv.cpp's overview).
enum class Feed : uint8_t { im2col, implicit, direct };

// The geometry of one convolution (or of one chunk of its images), the feed each of its
// GEMMs takes and its workspace layouts. The chunk size, the feeds and so the workspace
// depend only on the shapes (and the test hooks).
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

  ConvGeom(const Shape& x, const Shape& wt, const Conv2dParams& prm);

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

  // Workspace regions, in floats from the workspace's start.
  struct FwdLayout {
    int64_t a, b, off, xpad, total;
  };
  FwdLayout fwd_layout() const;

  struct BwdLayout {
    // dw: im2col dy A panels + col^T B panels; implicit offsets + x_pad + dy^T B panels;
    // direct offsets + x_pad + position offsets + dy^T B panels + tile sums.
    int64_t dya, colt, off, xpad, dyt, pos, acc;
    // dx: im2col w^T A panels + dy B panels + plain col; implicit flipped w^T A panels,
    // offsets, padded dy; direct flipped w B panels, offsets, padded dy.
    int64_t wt, dyb, col, wflip, offdx, dypad;
    int64_t total;
  };
  BwdLayout bwd_layout() const;

  size_t fwd_bytes() const { return trivial() ? 0 : static_cast<size_t>(fwd_layout().total) * sizeof(float); }
  size_t bwd_bytes() const { return trivial() ? 0 : static_cast<size_t>(bwd_layout().total) * sizeof(float); }

 private:
  void choose_feeds();
};

// ---- Feeding the GEMMs (conv_feeds.cpp) ------------------------------------------------

// Explicit path, over the chunk of nb images from image n0 (each function's comment in
// conv_feeds.cpp gives its layout):
// im2col into B panels [Cg*R*S, L] (forward), and transposed, [L, Cg*R*S] (dw);
void im2col_panels(const ConvGeom& g, const float* x, int64_t n0, int64_t nb, float* b);
void im2col_t_panels(const ConvGeom& g, const float* x, int64_t n0, int64_t nb, float* b);
// dx = the column matrix [C*R*S, L] folded back onto the positions im2col read;
void col2im(const ConvGeom& g, const float* col, int64_t n0, int64_t nb, float* dx);
// dy as A panels (dw) or as B panels (dx).
void pack_dy_a(const ConvGeom& g, const float* dy, int64_t n0, int64_t nb, float* a);
void pack_dy_b(const ConvGeom& g, const float* dy, int64_t n0, int64_t nb, float* b);

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

// Implicit path (stride 1) and the direct path's padded copies: a plane, or the planes of
// a chunk, zero-padded; dy transposed into B panels on the padded width (implicit dw).
void pad_plane(const float* s, int64_t h, int64_t w, int64_t rows, int64_t cols, int64_t top, int64_t left, float* d);
void pad_planes(const float* src, int64_t n0, int64_t nb, int64_t channels, int64_t h, int64_t w, int64_t rows,
                int64_t cols, int64_t top, int64_t left, float* dst);
void pack_dy_t(const ConvGeom& g, const float* dy, int64_t n0, int64_t nb, float* b);

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

// Direct path: tiles of MR output positions by NR channels.
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

// One image's outputs (forward y, or dx over the padded dy), every group; one thread.
void direct_image(const MicroKernels& mk, const Positions& ps, int64_t groups, int64_t channels, const float* in,
                  int64_t in_group, const int64_t* off, int64_t depth, const float* b, bool forward, const float* bias,
                  float* out);
// dy^T of image i of a chunk in the direct dw's B panels; one thread.
void pack_dy_direct(const ConvGeom& g, const float* dy_image, int64_t i, int64_t len, float* b);
// The offset tables of the implicit and direct paths: where row (c, r, s) of the column
// matrix starts in a group's padded x, and row (k, r, s) in its padded dy.
void fill_x_offsets(const ConvGeom& g, int64_t* off);
void fill_dy_offsets(const ConvGeom& g, int64_t* off);

// ---- The fp32 convolution over the images of g (conv_forward.cpp, conv_backward_*.cpp) --
// ws: the workspace of g's layouts (fwd_layout, bwd_layout).

// y = conv(x, w) + b (b may be null).
void conv_forward(const ConvGeom& g, const float* xp, const float* wp, const float* bp, float* yp, float* ws);
// dw += the filters' gradient.
void conv_backward_weights(const ConvGeom& g, const float* dyp, const float* xp, float* dwp, float* ws);
// dx = the input's gradient.
void conv_backward_data(const ConvGeom& g, const float* dyp, const float* wp, float* dxp, float* ws);

}  // namespace remat::cpu_conv
