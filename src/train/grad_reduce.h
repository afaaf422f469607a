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
// With the optimizer sharded (ZeRO-1), rank r needs only shard r of the reduced gradient
// (all of it when gradients are clipped: the global norm reads every element), updates
// its shard of the weights, and gather_weights() brings every rank's shard to all.
#pragma once

#include <cstdint>
#include <vector>

#include "remat/dist.h"
#include "remat/exec.h"
#include "remat/optim.h"

namespace remat {

class GradReducer {
 public:
  // ordered: the reduction above; otherwise the fast one.
  GradReducer(ParamStore& params, Backend& be, dist::Comm& comm, bool ordered);

  // The gradient this rank computed for its micro-batch of round `round` (in
  // params.grads). A collective call on several ranks.
  void add_round(int64_t round);
  // Writes the reduced gradient, times `scale`, into params.grads: all of it, or with
  // whole false (a sharded optimizer without clipping) at least this rank's shard.
  void finish(float scale, bool whole = true);
  // After a sharded optimizer updated this rank's shard of the weights: every rank's
  // shard into params.values of all (a collective call; nothing to do on one rank).
  void gather_weights();

  const FlatLayout& layout() const { return layout_; }

 private:
  void pack(const std::vector<Tensor>& ts, float* dst) const;  // tensors -> flat host floats
  void unpack(const float* src, std::vector<Tensor>& ts);      // flat host floats -> tensors
  // This rank's shard only: shard floats <-> the pieces of the tensors inside it.
  void pack_shard(const std::vector<Tensor>& ts, float* dst) const;
  void unpack_shard(const float* src, std::vector<Tensor>& ts);
  void fold_local(int64_t round);  // acc (+)= grads on the device

  ParamStore& params_;
  Backend& be_;
  dist::Comm& comm_;
  bool ordered_;
  FlatLayout layout_;               // N shards
  int64_t shard_ = 0;               // per rank (layout_.shard)
  std::vector<Tensor> acc_;         // the device fold (one rank, or the fast reduction)
  std::vector<float> send_, recv_;  // N shards each
  std::vector<float> owned_;        // this rank's shard of the running sum
};

}  // namespace remat
