// The CPU conv2d's geometry (conv_internal.h): the chunks of images a convolution runs in,
// the feed each of its GEMMs takes, and the workspace layouts that follow from both; and the
// test hooks that force a feed or a chunk size.
#include <algorithm>
#include <cmath>

#include "backends/cpu/conv_internal.h"
#include "remat/error.h"

namespace remat::cpu_conv {

namespace {

Path g_path = Path::automatic;
int64_t g_chunk_images = 0;  // 0: chosen from the shapes

// Chunk size: at least kTargetColumns output positions and kMinChunkFlops of forward work
// (enough tiles for every thread, few hand-overs between loops, no fork/join for a
// sliver of work), while the chunk's large buffers (the column matrix, or the padded
// copies) stay within kMaxChunkBytes; always at least one image. The images are then
// spread evenly over the chunks.
constexpr int64_t kTargetColumns = 4096;
constexpr int64_t kMinChunkFlops = int64_t{32} << 20;
constexpr int64_t kMaxChunkBytes = int64_t{4} << 20;  // workspace is memory too: keep it small

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

// The feed the test hook forces (cpu_conv::set_path), where it applies.
Feed forced_feed() {
  switch (g_path) {
    case Path::implicit: return Feed::implicit;
    case Path::direct: return Feed::direct;
    default: return Feed::im2col;
  }
}

}  // namespace

ConvGeom::ConvGeom(const Shape& x, const Shape& wt, const Conv2dParams& prm) {
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
void ConvGeom::choose_feeds() {
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
      if (g_path != Path::automatic) {
        if (forced_feed() == o.feed) return o.feed;
      } else if (o.cost <= cost) {
        best = o.feed, cost = o.cost;
      }
    }
    return best;
  };
  y_feed = pick({{Feed::im2col, true, kIm2colCost * rows(kg)},
                 {Feed::implicit, implicit_y_ok,
                  implicit_y_ok ? static_cast<double>(round_up(limg, NR)) / static_cast<double>(plane) * rows(kg) : 0},
                 {Feed::direct, true, lanes(kg)}});
  dx_feed = pick({{Feed::im2col, true, kIm2colCost * rows(grows)},
                  {Feed::implicit, dx_pad_ok,
                   dx_pad_ok ? static_cast<double>(round_up(ldx, NR)) / static_cast<double>(h * w) * rows(cg) : 0},
                  {Feed::direct, dx_pad_ok, lanes(cg)}});
}

ConvGeom::FwdLayout ConvGeom::fwd_layout() const {
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

ConvGeom::BwdLayout ConvGeom::bwd_layout() const {
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

}  // namespace remat::cpu_conv
