// Pooling against the CPU backend: max pooling (values and indices, ties, NaN, -inf,
// overlapping windows, padding), average pooling (count_include_pad) and global average
// pooling, forward and backward.
//
// Tolerance: max and average pooling compute each element with the CPU's operations in
// the CPU's order (max: the same scan; average: the same float sum and division; the
// backward passes add the same values in the same order, no atomics), so they must match
// bitwise. Global average pooling sums in double in another order: one float ulp (1e-6
// relative); its backward is one float division: bitwise.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend_ops/harness.h"

namespace remat::test {

namespace {

Pool2dParams pool(int kh, int kw, int sh, int sw, int ph, int pw) {
  Pool2dParams p;
  p.kernel_h = kh;
  p.kernel_w = kw;
  p.stride_h = sh;
  p.stride_w = sw;
  p.pad_h = ph;
  p.pad_w = pw;
  return p;
}

// Max pooling forward (values and window offsets) and backward through the offsets.
void check_maxpool(OpCheck& t, const Pair& x, const Pool2dParams& p) {
  const Shape ys = pool2d_output_shape(x.ref.shape(), p);
  auto y = t.output(ys);
  auto idx = t.output(ys, DType::u8);
  t.run([&](Backend& be, Side s) { be.maxpool2d_forward(s(x), p, s(y), s(idx)); });
  t.expect_equal(y, "y");
  t.expect_equal(idx, "indices");

  auto dy = t.uniform(ys);
  auto dx = t.output(x.ref.shape());
  t.run([&](Backend& be, Side s) { be.maxpool2d_backward(s(dy), s(idx), p, s(dx)); });
  t.expect_equal(dx, "dx");
}

// Window offsets for every output of dy (the pool of dx by p), each naming an input element
// of its window: one of `targets` (flat positions in the plane) where the window holds one,
// else any, drawn at random.
Pair window_offsets(OpCheck& t, const Shape& dxs, const Pool2dParams& p, const std::vector<int64_t>& targets) {
  const Shape dys = pool2d_output_shape(dxs, p);
  const int64_t h = dxs[2], w = dxs[3];
  std::vector<uint8_t> v;
  for (int64_t pl = 0; pl < dys[0] * dys[1]; ++pl)
    for (int64_t pp = 0; pp < dys[2]; ++pp)
      for (int64_t qq = 0; qq < dys[3]; ++qq) {
        const int64_t h0 = pp * p.stride_h - p.pad_h, w0 = qq * p.stride_w - p.pad_w;
        std::vector<int64_t> inside, wanted;  // window offsets
        for (int64_t r = 0; r < p.kernel_h; ++r)
          for (int64_t c = 0; c < p.kernel_w; ++c) {
            const int64_t hh = h0 + r, ww = w0 + c;
            if (hh < 0 || hh >= h || ww < 0 || ww >= w) continue;
            inside.push_back(r * p.kernel_w + c);
            for (int64_t at : targets)
              if (at == hh * w + ww) wanted.push_back(r * p.kernel_w + c);
          }
        const auto& from = wanted.empty() ? inside : wanted;
        v.push_back(static_cast<uint8_t>(from[t.rng()() % from.size()]));
      }
  return t.byte_values(v, dys);
}

void check_avgpool(OpCheck& t, const Shape& xs, const Pool2dParams& p) {
  const Shape ys = pool2d_output_shape(xs, p);
  auto x = t.uniform(xs);
  auto y = t.output(ys);
  t.run([&](Backend& be, Side s) { be.avgpool2d_forward(s(x), p, s(y)); });
  t.expect_equal(y, "y");

  auto dy = t.uniform(ys);
  auto dx = t.output(xs);
  t.run([&](Backend& be, Side s) { be.avgpool2d_backward(s(dy), p, s(dx)); });
  t.expect_equal(dx, "dx");
}

// An output without guards, 16-byte aligned (the harness's guarded outputs are not), so
// that the float4 paths run; NaN-filled like a guarded one.
Pair aligned_output(OpCheck& t, const Shape& s) {
  return t.values(std::vector<float>(static_cast<size_t>(s.numel()), std::numeric_limits<float>::quiet_NaN()), s);
}

}  // namespace

// fashion_cnn: 2x2 windows, stride 2, over 28x28 and 14x14.
REMAT_OP_CASE(pool, maxpool_fashion) {
  check_maxpool(t, t.uniform({2, 32, 28, 28}), pool(2, 2, 2, 2, 0, 0));
  check_maxpool(t, t.uniform({2, 64, 14, 14}), pool(2, 2, 2, 2, 0, 0));
}

// Overlapping 3x3 windows with stride 2 and padding 1 over odd sizes: an input can be the
// maximum of up to four windows.
REMAT_OP_CASE(pool, maxpool_overlapping_padded) {
  check_maxpool(t, t.uniform({2, 3, 15, 13}), pool(3, 3, 2, 2, 1, 1));
  check_maxpool(t, t.uniform({1, 2, 9, 40}), pool(3, 2, 1, 1, 1, 1));  // rows longer than a warp
  check_maxpool(t, t.uniform({3, 2, 5, 7}), pool(4, 3, 3, 2, 2, 1));
}

// Ties (the first maximum wins), NaN (the last NaN of the window wins), -inf, an all -inf
// window, and rows of equal values that overlapping windows share.
REMAT_OP_CASE(pool, maxpool_ties_nan_inf) {
  const Shape xs{2, 3, 11, 10};
  std::vector<float> v(static_cast<size_t>(xs.numel()));
  std::uniform_int_distribution<int> level(0, 3);
  for (auto& e : v) e = static_cast<float>(level(t.rng()));
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (size_t i = 7; i < v.size(); i += 37) v[i] = nan;
  for (size_t i = 3; i < v.size(); i += 23) v[i] = -inf;
  for (size_t i = 0; i < 4; ++i) v[110 + i] = v[120 + i] = -inf;  // a 2x4 block of -inf in plane 1
  const auto x = t.values(v, xs);
  check_maxpool(t, x, pool(2, 2, 2, 2, 0, 0));
  check_maxpool(t, x, pool(3, 3, 1, 1, 1, 1));
  check_maxpool(t, x, pool(3, 2, 2, 1, 1, 0));
}

// Arbitrary window offsets in heavily overlapping windows, many naming the same element:
// the backward's path for lanes of a warp that add into the same element.
REMAT_OP_CASE(pool, maxpool_backward_shared_indices) {
  const Shape dxs{2, 5, 13, 11};
  const Pool2dParams p = pool(5, 4, 1, 1, 2, 2);  // 13 x 12 windows of 20 positions
  auto dy = t.uniform(pool2d_output_shape(dxs, p));
  auto idx = window_offsets(t, dxs, p, {});
  auto dx = t.output(dxs);
  t.run([&](Backend& be, Side s) { be.maxpool2d_backward(s(dy), s(idx), p, s(dx)); });
  t.expect_equal(dx, "dx");

  // Windows of 7 x 7 (stride 1, padding 3) over 6 x 7 planes each hold (2, 3) and (3, 3):
  // every output onto one of three positions.
  const Shape small{2, 5, 6, 7};
  const Pool2dParams q = pool(7, 7, 1, 1, 3, 3);
  auto dy_few = t.uniform(pool2d_output_shape(small, q));
  auto idx_few = window_offsets(t, small, q, {2 * 7 + 3, 3 * 7 + 3, 3 * 7 + 4});
  auto dx_few = t.output(small);
  t.run([&](Backend& be, Side s) { be.maxpool2d_backward(s(dy_few), s(idx_few), q, s(dx_few)); });
  t.expect_equal(dx_few, "dx (three targets)");
}

// The largest window a one-byte offset can name: 16 x 16 (offsets up to 255), with padding.
REMAT_OP_CASE(pool, maxpool_window_256) { check_maxpool(t, t.uniform({1, 3, 20, 18}), pool(16, 16, 3, 2, 8, 8)); }

REMAT_OP_CASE(pool, avgpool) {
  check_avgpool(t, {2, 16, 28, 28}, pool(2, 2, 2, 2, 0, 0));
  check_avgpool(t, {2, 3, 9, 11}, pool(3, 3, 1, 1, 1, 1));  // overlapping, padded
  check_avgpool(t, {3, 2, 15, 13}, pool(3, 3, 2, 2, 1, 1));
  check_avgpool(t, {1, 4, 7, 8}, pool(3, 2, 2, 1, 1, 1));  // asymmetric
  check_avgpool(t, {2, 2, 5, 5}, pool(5, 5, 1, 1, 0, 0));  // one window per plane
}

// resnet_tiny's head: 64 channels at 7x7; a plane of 64 (float4 path) and 28x28 (longer
// than a warp many times); a 1x1 plane; an empty plane (NaN, as the CPU).
REMAT_OP_CASE(pool, global_avgpool) {
  for (const Shape& xs :
       {Shape{2, 64, 7, 7}, Shape{3, 16, 8, 8}, Shape{2, 5, 28, 28}, Shape{4, 3, 1, 1}, Shape{2, 3, 0, 4}}) {
    auto x = t.uniform(xs);
    const Shape ys{xs[0], xs[1]};
    auto y = t.output(ys);
    t.run([&](Backend& be, Side s) { be.global_avgpool_forward(s(x), s(y)); });
    t.expect_close(y, 0.0, 1e-6, "y " + xs.str());

    auto dy = t.uniform(ys);
    auto dx = t.output(xs);
    auto dx_aligned = aligned_output(t, xs);
    t.run([&](Backend& be, Side s) {
      be.global_avgpool_backward(s(dy), s(dx));
      be.global_avgpool_backward(s(dy), s(dx_aligned));
    });
    t.expect_equal(dx, "dx " + xs.str());
    t.expect_equal(dx_aligned, "dx (aligned) " + xs.str());
  }
}

// ---- bf16 (training.precision bf16; the two references: backend_ops/harness.h) ----------------
// Bitwise the CPU (the same scan and sums in fp32, bf16 outputs rounded once).
// Max pooling's backward into a bf16 dx sums in fp32 a tile of 1024 elements at a time (a
// 40 x 41 plane takes two tiles); overlapping windows make an input the maximum of several
// outputs, whose fp32 sum is rounded once as on the CPU. Global average pooling sums in
// double in another order than the CPU: its fp32 case's 1e-6 relative plus a bf16 step,
// and bitwise the device's fp32 kernel rounded (packs of four bf16 read the elements the
// float4 path reads).

namespace {

Pool2dParams pool_params(int k, int s, int pad) {
  Pool2dParams p;
  p.kernel_h = p.kernel_w = k;
  p.stride_h = p.stride_w = s;
  p.pad_h = p.pad_w = pad;
  return p;
}

}  // namespace

REMAT_OP_CASE(pool, bf16) {
  ActivationDTypeScope bf16(DType::bf16);
  struct Case {
    Shape x;
    Pool2dParams p;
  };
  for (const Case& c : {Case{{2, 8, 28, 28}, pool_params(2, 2, 0)}, Case{{2, 3, 15, 13}, pool_params(3, 2, 1)},
                        Case{{1, 2, 40, 41}, pool_params(3, 1, 1)}}) {
    const std::string what = " x " + c.x.str() + " k" + std::to_string(c.p.kernel_h) + " s" +
                             std::to_string(c.p.stride_h) + " p" + std::to_string(c.p.pad_h);
    const Shape ys = pool2d_output_shape(c.x, c.p);
    std::vector<float> xv = t.uniform_bf16(c.x).ref.to_vector();
    xv[5] = std::numeric_limits<float>::quiet_NaN();  // a NaN wins its windows
    xv[40] = xv[41];                                  // a tie keeps the first
    auto x = t.values_bf16(xv, c.x), xf = t.as_f32(x);
    auto y = t.output(ys, DType::bf16), idx = t.output(ys, DType::u8), yf = t.output(ys);
    auto idxf = t.output(ys, DType::u8);
    t.run([&](Backend& be, Side s) {
      be.maxpool2d_forward(s(x), c.p, s(y), s(idx));
      be.maxpool2d_forward(s(xf), c.p, s(yf), s(idxf));
    });
    t.expect_equal(y, "maxpool y" + what);
    t.expect_equal(idx, "maxpool indices" + what);
    expect_rounded_dut(y, yf, "maxpool y against fp32" + what);

    auto dy = t.uniform_bf16(ys), dyf = t.as_f32(dy);
    auto dx = t.output(c.x, DType::bf16), dx_f32 = t.output(c.x), dxf = t.output(c.x);
    t.run([&](Backend& be, Side s) {
      be.maxpool2d_backward(s(dy), s(idx), c.p, s(dx));      // fp32 tiles in shared memory
      be.maxpool2d_backward(s(dy), s(idx), c.p, s(dx_f32));  // a bf16 dy into an f32 dx
      be.maxpool2d_backward(s(dyf), s(idx), c.p, s(dxf));
    });
    t.expect_equal(dx, "maxpool dx" + what);
    t.expect_equal(dx_f32, "maxpool dx (f32) from a bf16 dy" + what);
    expect_rounded_dut(dx, dxf, "maxpool dx against fp32" + what);

    auto ya = t.output(ys, DType::bf16), yaf = t.output(ys);
    t.run([&](Backend& be, Side s) {
      be.avgpool2d_forward(s(x), c.p, s(ya));
      be.avgpool2d_forward(s(xf), c.p, s(yaf));
    });
    t.expect_equal(ya, "avgpool y" + what);
    expect_rounded_dut(ya, yaf, "avgpool y against fp32" + what);
    auto dxa = t.output(c.x, DType::bf16), dxaf = t.output(c.x);
    t.run([&](Backend& be, Side s) {
      be.avgpool2d_backward(s(dy), c.p, s(dxa));
      be.avgpool2d_backward(s(dyf), c.p, s(dxaf));
    });
    t.expect_equal(dxa, "avgpool dx" + what);
    expect_rounded_dut(dxa, dxaf, "avgpool dx against fp32" + what);
  }
  // Global average pooling: planes of 49 (one by one) and 64 elements (packs of four when
  // aligned), bf16 or f32 y from a bf16 x.
  for (const Shape& xs : {Shape{3, 5, 7, 7}, Shape{2, 9, 8, 8}}) {
    const std::string what = " x " + xs.str();
    const Shape ys{xs[0], xs[1]};
    auto x = t.uniform_bf16(xs, -2.0f, 3.0f), xf = t.as_f32(x);
    auto y = t.output(ys, DType::bf16), y_f32 = t.output(ys), yf = t.output(ys);
    t.run([&](Backend& be, Side s) {
      be.global_avgpool_forward(s(x), s(y));
      be.global_avgpool_forward(s(x), s(y_f32));
      be.global_avgpool_forward(s(xf), s(yf));
    });
    t.expect_close(y, 0, 1e-6 + kBf16Rel, "global_avgpool y" + what);
    t.expect_close(y_f32, 0, 1e-6, "global_avgpool y (f32)" + what);
    expect_rounded_dut(y, yf, "global_avgpool y against fp32" + what);
    expect_same_dut_f32(y_f32, yf, "global_avgpool y (f32) against fp32" + what);
    auto dy = t.uniform_bf16(ys), dyf = t.as_f32(dy);
    auto dx = t.output(xs, DType::bf16), dx_aligned = aligned_bf16_output(t, xs), dxf = t.output(xs);
    t.run([&](Backend& be, Side s) {
      be.global_avgpool_backward(s(dy), s(dx));
      be.global_avgpool_backward(s(dy), s(dx_aligned));
      be.global_avgpool_backward(s(dyf), s(dxf));
    });
    t.expect_equal(dx, "global_avgpool dx" + what);
    t.expect_equal(dx_aligned, "global_avgpool dx (aligned)" + what);
    expect_rounded_dut(dx, dxf, "global_avgpool dx against fp32" + what);
  }
}

// ---- Gradients: the device's backward against central differences of its own forward --------
// (backend_ops/harness.h, "Gradient cases")

namespace {

// Distinct values (a permutation of a spread grid, shuffled): max pooling's argmax is
// unique and stays so under a perturbation of eps.
Pair distinct(OpCheck& t, const Shape& s) {
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = -1.0f + 2.0f * static_cast<float>(i) / static_cast<float>(v.size());
  std::shuffle(v.begin(), v.end(), t.rng());
  return t.values(v, s);
}

}  // namespace

REMAT_OP_CASE(pool, grad_pooling) {
  const Shape xs{2, 3, 6, 7};
  Pool2dParams p;
  p.kernel_h = p.kernel_w = 3;
  p.stride_h = p.stride_w = 2;
  p.pad_h = p.pad_w = 1;
  const Shape ys = pool2d_output_shape(xs, p);
  auto x = distinct(t, xs), dy = t.uniform(ys);
  // Max pooling: the spacing of distinct values (2 / 252) exceeds 2 eps, so argmaxes hold.
  auto y = t.output(ys), idx = t.output(ys, DType::u8), dx = t.output(xs);
  t.run([&](Backend& be, Side d) {
    be.maxpool2d_forward(d(x), p, d(y), d(idx));
    be.maxpool2d_backward(d(dy), d(idx), p, d(dx));
  });
  auto y2 = t.output(ys), idx2 = t.output(ys, DType::u8);
  OpCheck::GradOptions fine;
  fine.eps = 1e-3;
  t.expect_gradient(
      "maxpool2d", x, dx,
      [&](Backend& be) {
        be.maxpool2d_forward(x.dut, p, y2.dut, idx2.dut);
        return dot(dy.dut, y2.dut);
      },
      fine);
  auto adx = t.output(xs);
  t.run([&](Backend& be, Side d) { be.avgpool2d_backward(d(dy), p, d(adx)); });
  t.expect_gradient("avgpool2d", x, adx, [&](Backend& be) {
    be.avgpool2d_forward(x.dut, p, y2.dut);
    return dot(dy.dut, y2.dut);
  });
  auto gy = t.output({2, 3}), gdy = t.uniform({2, 3}), gdx = t.output(xs);
  t.run([&](Backend& be, Side d) { be.global_avgpool_backward(d(gdy), d(gdx)); });
  t.expect_gradient("global_avgpool", x, gdx, [&](Backend& be) {
    be.global_avgpool_forward(x.dut, gy.dut);
    return dot(gdy.dut, gy.dut);
  });
}

}  // namespace remat::test
