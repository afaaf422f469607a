// Philox words in bulk for the CPU backend's random ops (dropout, attention's dropout).
// Each Philox block (four words) is computed once, several blocks at a time with AVX2 or
// AVX-512 (cpu::simd()); integer arithmetic, so every path gives the same words.
#pragma once

#include <algorithm>
#include <cstdint>

#include "remat/philox.h"
#include "remat/rng.h"

namespace remat::cpu {

// words[4 l + c] = component c of philox::block(seed, b0 + l) for l < nblocks.
void philox_blocks(uint64_t seed, uint64_t b0, int64_t nblocks, uint32_t* words);

// factor[k] = scale if philox::uniform(word w + k of seed's stream) < keep_prob, else 0,
// for k < n <= kDropoutChunk.
constexpr int64_t kDropoutChunk = 256;
void dropout_factors(uint64_t seed, uint64_t w, int64_t n, float keep_prob, float scale, float* factor);

// Calls f(j0, factor, m) for consecutive chunks [j0, j0 + m) of [0, n), where factor[k] is
// the dropout factor of element first + j0 + k of the op's Philox range: `scale` if
// philox::keep(seed, offset, first + j0 + k, keep_prob), else 0 (0 < keep_prob < 1).
template <typename F>
inline void for_each_dropout_chunk(RngState rng, uint64_t first, int64_t n, float keep_prob, float scale, F&& f) {
  float factor[kDropoutChunk];
  uint64_t w = rng.offset + first;
  for (int64_t j = 0; j < n; j += kDropoutChunk) {
    const int64_t m = std::min(kDropoutChunk, n - j);
    dropout_factors(rng.seed, w, m, keep_prob, scale, factor);
    f(j, static_cast<const float*>(factor), m);
    w += static_cast<uint64_t>(m);
  }
}

}  // namespace remat::cpu
