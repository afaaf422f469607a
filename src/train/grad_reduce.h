// Gradient accumulation and data-parallel reduction of one training step (see
// docs/distributed.md). A step of K micro-batches runs on N ranks in K / N rounds; in
// round j rank r computes micro-batch m = j N + r. The reduced gradient is
//   (g_0 + g_1 + ... + g_{K-1}) * (1 / K)
// summed left to right in micro-batch order, whatever N: one rank folds its own
// micro-batches in that order on its device; N ranks exchange each round's gradients
// shard by shard (rank r owns shard r of the flat gradient: MPI_Alltoall), each owner
// folds the N gradients of the round in rank order, and the scaled shards are gathered
// (MPI_Allgather). Every addition and the final scaling are single float operations, so N
// ranks give bitwise the gradient of one rank accumulating K micro-batches.
// The fast reduction (`--reduce fast`) folds each rank's micro-batches locally and sums
// the ranks with MPI_Allreduce: not bitwise the same for another N.
#pragma once

#include <cstdint>
#include <vector>

#include "remat/dist.h"
#include "remat/exec.h"

namespace remat {

class GradReducer {
 public:
  // ordered: the reduction above; otherwise the fast one.
  GradReducer(ParamStore& params, Backend& be, dist::Comm& comm, bool ordered);

  // The gradient this rank computed for its micro-batch of round `round` (in
  // params.grads). A collective call on several ranks.
  void add_round(int64_t round);
  // Writes the reduced gradient, times `scale`, into params.grads.
  void finish(float scale);

  int64_t flat_size() const { return flat_; }

 private:
  void pack(float* dst) const;     // params.grads -> flat host floats
  void unpack(const float* src);   // flat host floats -> params.grads
  void fold_local(int64_t round);  // acc (+)= grads on the device

  ParamStore& params_;
  Backend& be_;
  dist::Comm& comm_;
  bool ordered_;
  int64_t flat_ = 0;                // trainable elements
  int64_t shard_ = 0;               // per rank, the flat size padded to a multiple of N
  std::vector<Tensor> acc_;         // the device fold (one rank, or the fast reduction)
  std::vector<float> send_, recv_;  // N shards each
  std::vector<float> owned_;        // this rank's shard of the running sum
};

}  // namespace remat
