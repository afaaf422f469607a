// remat's Philox stream against cuRAND's host generator (needs only libcurand, no GPU):
// an independent implementation of the same algorithm and the same uniform conversion.
#include <curand.h>
#include <gtest/gtest.h>

#include <vector>

#include "remat/cuda_check.h"
#include "remat/philox.h"
#include "remat/rng.h"

namespace {

struct HostGenerator {
  curandGenerator_t gen = nullptr;
  explicit HostGenerator(unsigned long long seed) {
    REMAT_CURAND_CHECK(curandCreateGeneratorHost(&gen, CURAND_RNG_PSEUDO_PHILOX4_32_10));
    REMAT_CURAND_CHECK(curandSetPseudoRandomGeneratorSeed(gen, seed));
  }
  ~HostGenerator() { curandDestroyGenerator(gen); }
};

}  // namespace

TEST(PhiloxVsCurand, WordsMatchForSeveralSeeds) {
  const size_t n = size_t{1} << 20;  // 1 M words per seed
  for (unsigned long long seed : {0ull, 1ull, 42ull, 0xdeadbeefcafef00dull}) {
    HostGenerator g(seed);
    std::vector<unsigned int> ref(n);
    REMAT_CURAND_CHECK(curandGenerate(g.gen, ref.data(), n));
    size_t mismatches = 0, first = n;
    for (size_t w = 0; w < n; ++w) {
      if (remat::philox::word(seed, w) != ref[w]) {
        ++mismatches;
        first = std::min(first, w);
      }
    }
    EXPECT_EQ(mismatches, 0u) << "seed " << seed << ", first mismatch at word " << first;
  }
}

TEST(PhiloxVsCurand, UniformFloatsMatchBitForBit) {
  const size_t n = size_t{1} << 20;
  for (unsigned long long seed : {3ull, 2024ull}) {
    HostGenerator g(seed);
    std::vector<float> ref(n), ours(n);
    REMAT_CURAND_CHECK(curandGenerateUniform(g.gen, ref.data(), n));
    remat::philox_uniform({seed, 0}, 0, static_cast<int64_t>(n), ours.data());
    size_t mismatches = 0;
    for (size_t i = 0; i < n; ++i) mismatches += (ref[i] != ours[i]);
    EXPECT_EQ(mismatches, 0u) << "seed " << seed;
  }
}

TEST(PhiloxVsCurand, OffsetsMatchCurandOffsets) {
  // curandSetGeneratorOffset skips words; RngState.offset must mean the same thing.
  const size_t n = 4096;
  const unsigned long long seed = 77, offset = 1 << 18;
  HostGenerator g(seed);
  REMAT_CURAND_CHECK(curandSetGeneratorOffset(g.gen, offset));
  std::vector<float> ref(n), ours(n);
  REMAT_CURAND_CHECK(curandGenerateUniform(g.gen, ref.data(), n));
  remat::philox_uniform({seed, offset}, 0, static_cast<int64_t>(n), ours.data());
  EXPECT_EQ(ref, ours);
}
