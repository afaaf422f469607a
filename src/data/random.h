// Small deterministic random helpers for the data code (private to src/data). Everything
// here is defined by this file or by the C++ standard (std::mt19937_64), never by a
// standard library's distribution classes, so results match across toolchains.
#pragma once

#include <cmath>
#include <cstdint>

namespace remat::detail {

// splitmix64's output function: a bijective 64-bit mixer (Steele, Lea, Flood 2014).
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A uniform integer in [0, bound), bound > 0, from any 64-bit generator, by rejection of
// the top partial range (unbiased).
template <typename Gen>
uint64_t uniform_below(Gen& gen, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  for (;;) {
    const uint64_t r = gen();
    if (r >= threshold) return r % bound;
  }
}

// A splitmix64 stream: state advances by the golden-ratio increment.
class SplitMix {
 public:
  explicit SplitMix(uint64_t seed) : state_(seed) {}
  uint64_t operator()() {
    const uint64_t out = splitmix64(state_);
    state_ += 0x9e3779b97f4a7c15ULL;
    return out;
  }
  // Uniform in [0, 1) with 53 bits.
  double uniform() { return static_cast<double>((*this)() >> 11) * 0x1.0p-53; }
  // Standard normal by Box-Muller (one of the pair).
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

}  // namespace remat::detail
