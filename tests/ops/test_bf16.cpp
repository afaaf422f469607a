// The bf16 conversions (include/remat/bf16.h and the CPU backend's bulk loops,
// src/backends/cpu/bf16.h): float -> bf16 against PyTorch 1.13's Tensor.bfloat16()
// (tests/golden/bf16/convert: ties, subnormals, the overflow edge, infinities, NaNs, random
// bit patterns), bf16 -> float against the value computed from the fields in double, and the
// AVX-512-BF16 path bitwise the portable one on every bf16 pattern and 1M random floats.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backends/cpu/bf16.h"
#include "backends/cpu/simd.h"
#include "remat/bf16.h"
#include "support/golden.h"

using remat::bf16_from_float;
using remat::bf16_to_float;
using remat::bits_float;
using remat::float_bits;

namespace {

bool is_nan_bits(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x007fu) != 0; }

// What remat's rule gives for a NaN: sign and upper payload kept, the quiet bit set.
uint16_t quiet_nan_bits(uint32_t u) { return static_cast<uint16_t>((u >> 16) | 0x0040u); }

TEST(Bf16, KnownValues) {
  EXPECT_EQ(bf16_from_float(1.0f), 0x3f80);
  EXPECT_EQ(bf16_from_float(-2.0f), 0xc000);
  EXPECT_EQ(bf16_from_float(bits_float(0x3f808000u)), 0x3f80);  // tie, kept part even: down
  EXPECT_EQ(bf16_from_float(bits_float(0x3f818000u)), 0x3f82);  // tie, kept part odd: up
  EXPECT_EQ(bf16_from_float(bits_float(0x3f808001u)), 0x3f81);  // just above the tie
  EXPECT_EQ(bf16_from_float(bits_float(0x3f807fffu)), 0x3f80);  // just below
  EXPECT_EQ(bf16_from_float(bits_float(0x00008000u)), 0x0000);  // subnormal tie to 0
  EXPECT_EQ(bf16_from_float(bits_float(0x00018000u)), 0x0002);  // subnormal tie to even 2
  EXPECT_EQ(bf16_from_float(bits_float(0x007fffffu)), 0x0080);  // largest subnormal: smallest normal
  EXPECT_EQ(bf16_from_float(bits_float(0x7f7fffffu)), 0x7f80);  // FLT_MAX: infinity
  EXPECT_EQ(bf16_from_float(bits_float(0x7f7f7fffu)), 0x7f7f);  // the largest bf16 stays
  EXPECT_EQ(bf16_from_float(INFINITY), 0x7f80);
  EXPECT_EQ(bf16_from_float(-INFINITY), 0xff80);
  EXPECT_EQ(bf16_from_float(-0.0f), 0x8000);
  EXPECT_EQ(bf16_from_float(bits_float(0x7f800001u)), 0x7fc0);  // signalling NaN: quiet, not inf
  EXPECT_EQ(bf16_from_float(bits_float(0x7fffffffu)), 0x7fff);  // never rounds over into the sign
  EXPECT_EQ(bf16_from_float(bits_float(0xffa00001u)), 0xffe0);  // sign and payload kept
  EXPECT_EQ(float_bits(bf16_to_float(0x3f81)), 0x3f810000u);
  EXPECT_EQ(remat::round_to_bf16(3.14159265f), 3.140625f);
}

TEST(Bf16, MatchesPyTorch) {
  const auto g = remat::test::load_golden("bf16/convert");
  const std::vector<float> x = g.tensor("x").to_vector(), y = g.tensor("y").to_vector();
  const std::vector<int32_t> bits = g.tensor("bits").to_ints();
  ASSERT_EQ(static_cast<int64_t>(x.size()), remat::test::meta_int(g, "count"));
  int nans = 0, ties = 0, subnormals = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const uint32_t u = float_bits(x[i]);
    const uint16_t got = bf16_from_float(x[i]), want = static_cast<uint16_t>(bits[i]);
    if (std::isnan(x[i])) {
      ++nans;  // PyTorch writes 0xffff for every NaN; remat keeps the NaN's sign and payload
      EXPECT_TRUE(is_nan_bits(want)) << i;
      EXPECT_EQ(got, quiet_nan_bits(u)) << i;
      continue;
    }
    ties += (u & 0xffffu) == 0x8000u;
    subnormals += (u & 0x7f800000u) == 0 && (u & 0x7fffffu) != 0;
    EXPECT_EQ(got, want) << "element " << i << ": float bits 0x" << std::hex << u;
    EXPECT_EQ(float_bits(bf16_to_float(got)), float_bits(y[i])) << i;
  }
  EXPECT_GE(nans, 5);
  EXPECT_GE(ties, 1000);
  EXPECT_GE(subnormals, 1000);
}

// bf16 -> float for all 65536 patterns, against the value built from the fields in double.
TEST(Bf16, ToFloatEveryPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint32_t sign = h >> 15, exp = (h >> 7) & 0xff, man = h & 0x7f;
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    if (exp == 0xff) {
      EXPECT_EQ(std::isnan(f), man != 0) << h;
      EXPECT_EQ(float_bits(f), h << 16) << h;  // NaN payloads kept too
      continue;
    }
    const double mag = exp == 0 ? std::ldexp(static_cast<double>(man), -133)
                                : std::ldexp(1.0 + man / 128.0, static_cast<int>(exp) - 127);
    const double want = sign ? -mag : mag;
    EXPECT_EQ(static_cast<double>(f), want) << h;
    EXPECT_EQ(std::signbit(f), sign != 0) << h;
  }
}

// The bulk loops at every SIMD level this CPU has, bitwise the portable loop.
TEST(Bf16, PathsAgree) {
  using remat::cpu::Simd;
  std::mt19937 rng(14);
  const int64_t n = (1 << 20) + 13;  // a vector tail
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = rng();
    switch (i % 4) {
      case 1: u = (u & 0xffff0000u) | 0x8000u; break;  // ties
      case 2: u &= 0x807fffffu; break;                 // subnormals and zeros
      default: break;                                  // anything, NaNs included
    }
    x[i] = bits_float(u);
  }
  std::vector<uint16_t> base(n), got(n);
  remat::cpu::f32_to_bf16_portable(x.data(), base.data(), n);
  for (int64_t i = 0; i < n; i += 997) ASSERT_EQ(base[i], bf16_from_float(x[i]));
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> all_base(65536), all_got(65536);
  remat::cpu::bf16_to_f32_portable(all.data(), all_base.data(), 65536);
  int levels = 0;
  for (Simd s : {Simd::baseline, Simd::avx2, Simd::avx512}) {
    if (static_cast<int>(s) > static_cast<int>(remat::cpu::detected_simd())) continue;
    remat::cpu::set_simd_limit(s);
    ++levels;
    remat::cpu::f32_to_bf16(x.data(), got.data(), n);
    remat::cpu::bf16_to_f32(all.data(), all_got.data(), 65536);
    const bool hw = remat::cpu::use_avx512_bf16();
    remat::cpu::set_simd_limit(Simd::avx512);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += got[i] != base[i];
    EXPECT_EQ(bad, 0) << remat::cpu::simd_name(s) << (hw ? " (AVX-512-BF16)" : "");
    for (uint32_t h = 0; h < 65536; ++h)
      ASSERT_EQ(float_bits(all_got[h]), float_bits(all_base[h])) << remat::cpu::simd_name(s) << " " << h;
  }
  EXPECT_GE(levels, 1);
  if (!remat::cpu::detected_avx512_bf16()) GTEST_SKIP() << "this CPU has no AVX-512-BF16: portable path only";
}

}  // namespace
