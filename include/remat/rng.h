// Random number state. Each random op reserves a disjoint range of the Philox stream of
// the run's seed from an RngGenerator and records the RngState it got, so a recompute can
// replay exactly the same draws (see include/remat/philox.h for the stream layout).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace remat {

struct RngState {
  uint64_t seed = 0;
  uint64_t offset = 0;  // in 32-bit words; a multiple of 4 (a Philox block)
  bool operator==(const RngState& o) const { return seed == o.seed && offset == o.offset; }
  bool operator!=(const RngState& o) const { return !(*this == o); }
};

class RngGenerator {
 public:
  explicit RngGenerator(uint64_t seed = 0) : state_{seed, 0} {}

  // Hands out `words` words of the stream (rounded up to a whole Philox block) and
  // records who took them.
  RngState reserve(uint64_t words, const std::string& owner = "");

  RngState state() const { return state_; }
  void set_state(RngState s);

  struct Reservation {
    std::string owner;
    RngState state;
    uint64_t words = 0;
  };
  const std::vector<Reservation>& reservations() const { return reservations_; }
  void clear_reservations() { reservations_.clear(); }

 private:
  RngState state_;
  std::vector<Reservation> reservations_;
};

// Host helpers over the stream (OpenMP-parallel; results do not depend on thread count).
// out[j] = uniform(word(seed, offset + begin + j)) for j in [0, end - begin).
void philox_uniform(RngState s, int64_t begin, int64_t end, float* out);
// mask[j] = 1 if element begin + j is kept by dropout with drop probability p, else 0.
void philox_dropout_mask(RngState s, float p, int64_t begin, int64_t end, uint8_t* mask);

}  // namespace remat
