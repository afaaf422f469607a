#include "remat/rng.h"

#include <limits>

#include "remat/error.h"
#include "remat/philox.h"

namespace remat {

RngState RngGenerator::reserve(uint64_t words, const std::string& owner) {
  const uint64_t blocks = words / 4 + (words % 4 != 0);
  REMAT_CHECK(blocks <= (std::numeric_limits<uint64_t>::max() - state_.offset) / 4,
              "Philox stream exhausted reserving ", words, " words for \"", owner, "\"");
  RngState s = state_;
  state_.offset += blocks * 4;
  reservations_.push_back({owner, s, words});
  return s;
}

void RngGenerator::set_state(RngState s) {
  REMAT_CHECK(s.offset % 4 == 0, "RNG offset ", s.offset, " is not a multiple of 4 (a Philox block)");
  state_ = s;
}

void philox_uniform(RngState s, int64_t begin, int64_t end, float* out) {
  REMAT_CHECK(begin >= 0 && end >= begin, "bad element range [", begin, ", ", end, ")");
#pragma omp parallel for schedule(static)
  for (int64_t i = begin; i < end; ++i) {
    out[i - begin] = philox::uniform(philox::word(s.seed, s.offset + static_cast<uint64_t>(i)));
  }
}

void philox_dropout_mask(RngState s, float p, int64_t begin, int64_t end, uint8_t* mask) {
  REMAT_CHECK(begin >= 0 && end >= begin, "bad element range [", begin, ", ", end, ")");
  REMAT_CHECK(p >= 0.0f && p <= 1.0f, "dropout probability must be in [0, 1], got ", p);
  const float keep_prob = 1.0f - p;
#pragma omp parallel for schedule(static)
  for (int64_t i = begin; i < end; ++i) {
    mask[i - begin] = philox::keep(s.seed, s.offset, static_cast<uint64_t>(i), p == 0.0f ? 1.0f : keep_prob) ? 1 : 0;
  }
}

}  // namespace remat
