// Gradient accumulation and data-parallel reduction of one training step (see
// docs/distributed.md). A step of K micro-batches runs on N ranks in K / N rounds; in
// round j rank r computes micro-batch m = j N + r. The reduced gradient is
//   (g_0 + g_1 + ... + g_{K-1}) * (1 / K)
// summed left to right in micro-batch order, whatever N: one rank folds its own
// micro-batches in that order on its device; N ranks exchange each round's gradients
// shard by shard (rank r owns shard r of the flat gradient: an all-to-all), each owner
// folds the N gradients of the round in rank order, and the scaled shards are gathered
// (an all-gather). Every addition and the final scaling are single float operations, so N
// ranks give bitwise the gradient of one rank accumulating K micro-batches.
// The fast reduction (`--reduce fast`) folds each rank's micro-batches locally and sums
// the ranks with the engine's all-reduce: not bitwise the same for another N.
// With the optimizer sharded (ZeRO-1), rank r needs only shard r of the reduced gradient
// (all of it when gradients are clipped: the global norm reads every element), updates
// its shard of the weights, and gather_weights() brings every rank's shard to all.
//
// Where the exchange happens:
// - host: MPI on host copies of the gradients (cpu; cuda without NCCL, cuda-emu). On cpu
//   the exchange can overlap the backward sweep: the flat gradient is cut into buckets of
//   whole parameters, and a bucket's collective (an all-to-all of its pieces of every
//   shard; the fast all-reduce in the last round) starts as soon as the executor says its
//   gradients are final (grads_final); add_round waits for all. The owner then folds the
//   very numbers the single all-to-all brings, so the result is bitwise the same.
// - device: NCCL on the device's buffers, enqueued on the backend's stream (cuda:N in an
//   MPI launch, even with one rank); the folds and the scaling are the backend's
//   accumulate and scale ops on those buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "remat/dist.h"
#include "remat/executor.h"
#include "remat/optim.h"
#include "remat/params.h"

namespace remat {

struct ReduceOptions {
  bool ordered = true;  // the ordered reduction above; false: the fast one
  // Host exchange on cpu with several ranks: reduce buckets during the backward sweep.
  bool overlap = false;
  int64_t bucket_bytes = int64_t{1} << 20;  // a bucket closes at the parameter that reaches it
};

class GradReducer {
 public:
  // device_comm: the NCCL communicator of the ranks (on the backend's device); null: the
  // host exchange over `comm` (or, on one rank, the local fold).
  GradReducer(ParamStore& params, Backend& be, dist::Comm& comm, ReduceOptions o,
              std::unique_ptr<dist::DeviceComm> device_comm = nullptr);
  ~GradReducer();

  // Before round `round` runs (last: the step's last round).
  void begin_round(int64_t round, bool last);
  // The executor's hook (ExecOptions::on_grads_final): the gradients of `params` are final
  // for this round. With overlap, starts the buckets they complete and moves the started
  // ones on; otherwise nothing.
  void grads_final(const std::vector<int>& params);
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
  bool overlapped() const { return overlap_; }
  int buckets() const { return static_cast<int>(buckets_.size()); }
  // "mpi", "nccl 2.28.9" (device collectives), "local" (one rank, no collectives).
  std::string engine() const;
  // What the device collectives moved and took since the last reset (settled when the
  // reduction waited for the stream); the host Comm counts its own.
  dist::CommStats device_stats() const;
  void reset_device_stats();

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;  // flat range
    std::vector<int> params;
    // Its all-to-all: to rank s the piece of shard s inside [begin, end); from every rank
    // the piece of this rank's shard, at the place the whole all-to-all puts it.
    std::vector<int64_t> send_count, send_offset, recv_count, recv_offset;
  };
  void make_buckets(int64_t bucket_bytes);
  void start_bucket(size_t b);
  void start_remaining_buckets();

  void pack(const std::vector<Tensor>& ts, float* dst) const;  // tensors -> flat host floats
  void unpack(const float* src, std::vector<Tensor>& ts);      // flat host floats -> tensors
  // This rank's shard only: shard floats <-> the pieces of the tensors inside it.
  void pack_shard(const std::vector<Tensor>& ts, float* dst) const;
  void unpack_shard(const float* src, std::vector<Tensor>& ts);
  // The same on the device's flat buffers (device collectives).
  void pack_device(const std::vector<Tensor>& ts, const Tensor& flat) const;
  void unpack_device(const Tensor& flat, std::vector<Tensor>& ts);
  void pack_shard_device(const std::vector<Tensor>& ts, const Tensor& shard) const;
  void unpack_shard_device(const Tensor& shard, std::vector<Tensor>& ts);
  void fold_local(int64_t round);            // acc (+)= grads on the device
  void fold_param(size_t p, int64_t round);  // the same for one parameter

  ParamStore& params_;
  Backend& be_;
  dist::Comm& comm_;
  std::unique_ptr<dist::DeviceComm> dcomm_;
  bool ordered_;
  FlatLayout layout_;               // N shards
  int64_t shard_ = 0;               // per rank (layout_.shard)
  bool local_ = false;              // one rank, no collectives: the device fold alone
  bool overlap_ = false;            // host buckets during backward
  std::vector<Tensor> acc_;         // the device fold (one rank, or the fast reduction)
  std::vector<float> send_, recv_;  // host exchange: N shards each
  std::vector<float> owned_;        // host exchange: this rank's shard of the running sum
  Tensor dsend_, drecv_, downed_;   // device exchange: the same on the device

  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;  // per parameter; -1 without a gradient
  std::vector<int> waiting_;    // per bucket: its parameters not final yet this round
  std::vector<bool> started_;   // per bucket, this round
  int64_t round_ = 0;
  bool last_round_ = true;
};

}  // namespace remat
