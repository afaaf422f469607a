// Philox4x32-10: known-answer vectors, the uniform conversion, element-keyed masks.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "remat/philox.h"
#include "remat/rng.h"
#include "support/expect_error.h"

using remat::philox::Bits4;

namespace {

void expect_bits(Bits4 got, Bits4 want) {
  EXPECT_EQ(got.x, want.x);
  EXPECT_EQ(got.y, want.y);
  EXPECT_EQ(got.z, want.z);
  EXPECT_EQ(got.w, want.w);
}

}  // namespace

// Random123's tests/kat_vectors for philox4x32_10.
TEST(Philox, KnownAnswerVectors) {
  expect_bits(remat::philox::philox4x32_10({0, 0, 0, 0}, 0, 0), {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  expect_bits(remat::philox::philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, 0xffffffff, 0xffffffff),
              {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  expect_bits(remat::philox::philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, 0xa4093822, 0x299f31d0),
              {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST(Philox, StreamStartsWithTheZeroVector) {
  // Seed 0, words 0..3 are the all-zero counter and key.
  EXPECT_EQ(remat::philox::word(0, 0), 0x6627e8d5u);
  EXPECT_EQ(remat::philox::word(0, 3), 0x9b00dbd8u);
}

TEST(Philox, UniformMatchesCurandConversion) {
  EXPECT_EQ(remat::philox::uniform(0), 0x1p-33f);
  EXPECT_EQ(remat::philox::uniform(0xffffffffu), 1.0f);
  EXPECT_EQ(remat::philox::uniform(0xffffff80u), 1.0f);  // rounds up to exactly 1
  EXPECT_LT(remat::philox::uniform(0xffffff7fu), 1.0f);
  EXPECT_EQ(remat::philox::uniform(1u << 31), 0.5f);
  // Every value is in (0, 1].
  std::vector<float> u(1 << 16);
  remat::philox_uniform({7, 0}, 0, static_cast<int64_t>(u.size()), u.data());
  double mean = 0;
  for (float v : u) {
    ASSERT_GT(v, 0.0f);
    ASSERT_LE(v, 1.0f);
    mean += v;
  }
  mean /= static_cast<double>(u.size());
  EXPECT_NEAR(mean, 0.5, 5 * std::sqrt(1.0 / 12 / static_cast<double>(u.size())));
}

TEST(Philox, MaskIsTheSameForAnyChunking) {
  const remat::RngState s{1234, 4096};
  const int64_t n = 100003;  // odd size
  std::vector<uint8_t> whole(n);
  remat::philox_dropout_mask(s, 0.3f, 0, n, whole.data());
  // Different "launch shapes": chunk sizes that do and do not divide 4 or n.
  for (int64_t chunk : {1, 3, 4, 17, 256, 1000, 65536}) {
    std::vector<uint8_t> pieces(n);
    for (int64_t b = 0; b < n; b += chunk) {
      const int64_t e = std::min(n, b + chunk);
      remat::philox_dropout_mask(s, 0.3f, b, e, pieces.data() + b);
    }
    ASSERT_EQ(pieces, whole) << "chunk " << chunk;
  }
  // And an element-at-a-time walk in reverse order, as a device thread would see it.
  for (int64_t i = n - 1; i >= 0; i -= 997) {
    ASSERT_EQ(whole[i], remat::philox::keep(s.seed, s.offset, static_cast<uint64_t>(i), 0.7f) ? 1 : 0);
  }
}

TEST(Philox, MaskKeepFractionWithinBounds) {
  const int64_t n = 1 << 20;
  std::vector<uint8_t> m(n);
  for (float p : {0.1f, 0.5f, 0.9f}) {
    remat::philox_dropout_mask({42, 0}, p, 0, n, m.data());
    int64_t kept = 0;
    for (uint8_t v : m) kept += v;
    const double q = 1.0 - p, sd = std::sqrt(n * q * (1 - q));
    EXPECT_NEAR(static_cast<double>(kept), n * q, 6 * sd) << "p=" << p;
  }
}

TEST(Philox, MaskEdgeProbabilities) {
  const int64_t n = 1 << 16;
  std::vector<uint8_t> m(n);
  remat::philox_dropout_mask({1, 0}, 0.0f, 0, n, m.data());
  for (uint8_t v : m) ASSERT_EQ(v, 1);  // p = 0 keeps all, even where uniform is exactly 1
  remat::philox_dropout_mask({1, 0}, 1.0f, 0, n, m.data());
  for (uint8_t v : m) ASSERT_EQ(v, 0);
  EXPECT_REMAT_ERROR(remat::philox_dropout_mask({1, 0}, 1.5f, 0, n, m.data()), "dropout probability");
}

TEST(Philox, SeedsAndOffsetsGiveDifferentStreams) {
  EXPECT_NE(remat::philox::word(1, 0), remat::philox::word(2, 0));
  EXPECT_NE(remat::philox::word(1, 0), remat::philox::word(1, 4));
  EXPECT_NE(remat::philox::word(1ull << 32, 0), remat::philox::word(0, 0));  // high key word matters
}

TEST(RngGenerator, ReservesDisjointBlockAlignedRanges) {
  remat::RngGenerator g(99);
  auto a = g.reserve(10, "dropout1");
  auto b = g.reserve(4, "dropout2");
  auto c = g.reserve(1, "attn");
  EXPECT_EQ(a.seed, 99u);
  EXPECT_EQ(a.offset, 0u);
  EXPECT_EQ(b.offset, 12u);  // 10 words round up to 3 blocks
  EXPECT_EQ(c.offset, 16u);
  EXPECT_EQ(g.state().offset, 20u);
  ASSERT_EQ(g.reservations().size(), 3u);
  EXPECT_EQ(g.reservations()[1].owner, "dropout2");
  EXPECT_EQ(g.reservations()[1].state, b);
  EXPECT_EQ(g.reservations()[0].words, 10u);
  // Replaying from a recorded state gives the same draws.
  g.set_state(b);
  EXPECT_EQ(g.reserve(4, "again"), b);
  EXPECT_REMAT_ERROR(g.set_state({99, 3}), "multiple of 4");
}
