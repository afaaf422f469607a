#include "train/grad_reduce.h"

#include <algorithm>
#include <cstring>

#include "remat/error.h"
#include "remat/memory.h"

namespace remat {

GradReducer::GradReducer(ParamStore& params, Backend& be, dist::Comm& comm, ReduceOptions o,
                         std::unique_ptr<dist::DeviceComm> device_comm)
    : params_(params),
      be_(be),
      comm_(comm),
      dcomm_(std::move(device_comm)),
      ordered_(o.ordered),
      layout_(params, comm.size()),
      shard_(layout_.shard) {
  const int n = comm_.size();
  local_ = n == 1 && !dcomm_;
  if (dcomm_)
    REMAT_CHECK(dcomm_->size() == n && dcomm_->rank() == comm_.rank() && be_.native_stream(),
                "data parallel: device collectives need the ranks of the job (", dcomm_->size(), " vs ", n,
                ") and a backend with a stream (", be_.name(), ")");
  if (local_ || !ordered_) {
    // The running sum of this rank's micro-batches, beside the gradients.
    TagScope scope(MemoryCategory::gradient, "accumulation", Phase::setup);
    for (const Tensor& g : params_.grads) acc_.push_back(g.defined() ? Tensor::empty(g.shape(), g.device()) : Tensor());
  }
  if (dcomm_) {
    // The device's exchange buffers (docs/distributed.md: memory); zeros in the padding
    // between parameters stay zeros.
    TagScope scope(MemoryCategory::gradient, "reduction", Phase::setup);
    dsend_ = Tensor::zeros(Shape{layout_.size}, be_.device());
    drecv_ = Tensor::zeros(Shape{layout_.size}, be_.device());
    downed_ = Tensor::zeros(Shape{shard_}, be_.device());
  } else if (n > 1) {
    send_.assign(static_cast<size_t>(layout_.size), 0.0f);
    recv_.assign(static_cast<size_t>(layout_.size), 0.0f);
    owned_.assign(static_cast<size_t>(shard_), 0.0f);
    // Overlap needs the gradients readable while backward runs: host memory (cpu).
    overlap_ = o.overlap && be_.device().is_cpu();
    if (overlap_) make_buckets(o.bucket_bytes);
  }
}

GradReducer::~GradReducer() = default;

std::string GradReducer::engine() const {
  if (dcomm_) return dcomm_->engine();
  return local_ ? "local" : comm_.engine();
}

dist::CommStats GradReducer::device_stats() const { return dcomm_ ? dcomm_->stats() : dist::CommStats{}; }

void GradReducer::reset_device_stats() {
  if (dcomm_) dcomm_->reset_stats();
}

// ---- buckets -----------------------------------------------------------------------------------

// Whole parameters in parameter order, a bucket closing at the parameter that brings it to
// bucket_bytes; the buckets tile the flat vector (the padding travels with them).
void GradReducer::make_buckets(int64_t bucket_bytes) {
  REMAT_CHECK(bucket_bytes > 0, "data parallel: bucket size ", bucket_bytes, " bytes");
  bucket_of_.assign(params_.grads.size(), -1);
  int64_t bytes = 0;
  for (size_t p = 0; p < params_.grads.size(); ++p) {
    if (layout_.offset[p] < 0) continue;
    if (buckets_.empty() || bytes >= bucket_bytes) {
      if (!buckets_.empty()) buckets_.back().end = layout_.offset[p];
      buckets_.emplace_back();
      buckets_.back().begin = buckets_.size() == 1 ? 0 : layout_.offset[p];
      bytes = 0;
    }
    buckets_.back().params.push_back(static_cast<int>(p));
    bucket_of_[p] = static_cast<int>(buckets_.size() - 1);
    bytes += layout_.numel[p] * 4;
  }
  if (buckets_.empty()) return;
  buckets_.back().end = layout_.size;
  const int n = comm_.size(), me = comm_.rank();
  for (Bucket& b : buckets_) {
    auto piece = [&](int s) {  // [lo, hi) of shard s inside the bucket
      const int64_t lo = std::max(b.begin, shard_ * s), hi = std::min(b.end, shard_ * (s + 1));
      return std::make_pair(lo, std::max(lo, hi));
    };
    const auto [mlo, mhi] = piece(me);
    for (int s = 0; s < n; ++s) {
      const auto [lo, hi] = piece(s);
      b.send_count.push_back(hi - lo);
      b.send_offset.push_back(hi > lo ? lo : 0);
      b.recv_count.push_back(mhi - mlo);
      b.recv_offset.push_back(mhi > mlo ? shard_ * s + (mlo - shard_ * me) : 0);
    }
  }
  waiting_.assign(buckets_.size(), 0);
  started_.assign(buckets_.size(), false);
}

void GradReducer::begin_round(int64_t round, bool last) {
  round_ = round;
  last_round_ = last;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    waiting_[b] = static_cast<int>(buckets_[b].params.size());
    started_[b] = false;
  }
}

void GradReducer::grads_final(const std::vector<int>& params) {
  if (!overlap_ || (!ordered_ && !last_round_)) return;  // fast: only the last round travels
  for (int p : params) {
    const int b = bucket_of_[static_cast<size_t>(p)];
    if (b >= 0 && --waiting_[static_cast<size_t>(b)] == 0) start_bucket(static_cast<size_t>(b));
  }
  comm_.poll();
}

void GradReducer::start_bucket(size_t b) {
  const Bucket& bk = buckets_[b];
  started_[b] = true;
  if (ordered_) {
    for (int p : bk.params)
      std::memcpy(send_.data() + layout_.offset[static_cast<size_t>(p)], params_.grads[static_cast<size_t>(p)].f32(),
                  static_cast<size_t>(layout_.numel[static_cast<size_t>(p)]) * sizeof(float));
    comm_.start_alltoallv(send_.data(), bk.send_count, bk.send_offset, recv_.data(), bk.recv_count, bk.recv_offset);
  } else {
    for (int p : bk.params) {
      fold_param(static_cast<size_t>(p), round_);
      std::memcpy(send_.data() + layout_.offset[static_cast<size_t>(p)], acc_[static_cast<size_t>(p)].f32(),
                  static_cast<size_t>(layout_.numel[static_cast<size_t>(p)]) * sizeof(float));
    }
    comm_.start_allreduce_sum(send_.data() + bk.begin, bk.end - bk.begin);
  }
}

// Buckets whose parameters the executor did not report (an executor without the hook):
// started in bucket order, the same on every rank.
void GradReducer::start_remaining_buckets() {
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (!started_[b]) start_bucket(b);
}

// ---- moving gradients --------------------------------------------------------------------------

namespace {

// Elements [begin, end) of t to or from host floats.
void read_range(const Tensor& t, int64_t begin, int64_t end, float* dst) {
  if (t.device().is_cpu()) {
    std::memcpy(dst, t.f32() + begin, static_cast<size_t>(end - begin) * sizeof(float));
  } else {
    const std::vector<float> h = t.view_at(begin, Shape{end - begin}).to_vector();
    std::copy(h.begin(), h.end(), dst);
  }
}

void write_range(const Tensor& t, int64_t begin, int64_t end, const float* src) {
  if (t.device().is_cpu()) {
    std::memcpy(t.f32() + begin, src, static_cast<size_t>(end - begin) * sizeof(float));
  } else {
    Tensor dst = t.view_at(begin, Shape{end - begin});
    dst.copy_from(Tensor::from_vector(std::vector<float>(src, src + (end - begin)), Shape{end - begin}));
  }
}

}  // namespace

void GradReducer::pack(const std::vector<Tensor>& ts, float* dst) const {
  for (size_t p = 0; p < ts.size(); ++p)
    if (layout_.offset[p] >= 0) read_range(ts[p], 0, layout_.numel[p], dst + layout_.offset[p]);
}

void GradReducer::unpack(const float* src, std::vector<Tensor>& ts) {
  for (size_t p = 0; p < ts.size(); ++p)
    if (layout_.offset[p] >= 0) write_range(ts[p], 0, layout_.numel[p], src + layout_.offset[p]);
}

void GradReducer::pack_shard(const std::vector<Tensor>& ts, float* dst) const {
  const int64_t lo = shard_ * comm_.rank();
  for (const FlatLayout::Piece& pc : layout_.pieces(comm_.rank()))
    read_range(ts[pc.param], pc.begin, pc.end, dst + layout_.offset[pc.param] + pc.begin - lo);
}

void GradReducer::unpack_shard(const float* src, std::vector<Tensor>& ts) {
  const int64_t lo = shard_ * comm_.rank();
  for (const FlatLayout::Piece& pc : layout_.pieces(comm_.rank()))
    write_range(ts[pc.param], pc.begin, pc.end, src + layout_.offset[pc.param] + pc.begin - lo);
}

// Device-to-device copies, ordered on the backend's stream.
void GradReducer::pack_device(const std::vector<Tensor>& ts, const Tensor& flat) const {
  for (size_t p = 0; p < ts.size(); ++p)
    if (layout_.offset[p] >= 0) flat.view_at(layout_.offset[p], Shape{layout_.numel[p]}).copy_from(ts[p]);
}

void GradReducer::unpack_device(const Tensor& flat, std::vector<Tensor>& ts) {
  for (size_t p = 0; p < ts.size(); ++p)
    if (layout_.offset[p] >= 0) ts[p].copy_from(flat.view_at(layout_.offset[p], Shape{layout_.numel[p]}));
}

void GradReducer::pack_shard_device(const std::vector<Tensor>& ts, const Tensor& shard) const {
  const int64_t lo = shard_ * comm_.rank();
  for (const FlatLayout::Piece& pc : layout_.pieces(comm_.rank()))
    shard.view_at(layout_.offset[pc.param] + pc.begin - lo, Shape{pc.end - pc.begin})
        .copy_from(ts[pc.param].view_at(pc.begin, Shape{pc.end - pc.begin}));
}

void GradReducer::unpack_shard_device(const Tensor& shard, std::vector<Tensor>& ts) {
  const int64_t lo = shard_ * comm_.rank();
  for (const FlatLayout::Piece& pc : layout_.pieces(comm_.rank()))
    ts[pc.param]
        .view_at(pc.begin, Shape{pc.end - pc.begin})
        .copy_from(shard.view_at(layout_.offset[pc.param] + pc.begin - lo, Shape{pc.end - pc.begin}));
}

void GradReducer::fold_param(size_t p, int64_t round) {
  if (!acc_[p].defined()) return;
  if (round == 0)
    acc_[p].copy_from(params_.grads[p]);
  else
    be_.accumulate(acc_[p], params_.grads[p]);
}

void GradReducer::fold_local(int64_t round) {
  for (size_t p = 0; p < acc_.size(); ++p) fold_param(p, round);
}

// ---- the step -----------------------------------------------------------------------------------

void GradReducer::add_round(int64_t round) {
  const int n = comm_.size();
  if (local_ || !ordered_) {
    // Fast: each rank folds its own micro-batches; with overlap the last round's buckets
    // fold and travel as backward completes them.
    if (overlap_ && !ordered_ && last_round_)
      start_remaining_buckets();
    else
      fold_local(round);
    return;
  }
  if (dcomm_) {
    // Shard s of this rank's gradient to rank s; the owner folds the round's N blocks in
    // rank order onto its running sum, with the backend's add.
    pack_device(params_.grads, dsend_);
    dcomm_->alltoall(dsend_.f32(), drecv_.f32(), shard_, be_.native_stream());
    for (int r = 0; r < n; ++r) {
      const Tensor in = drecv_.view_at(static_cast<int64_t>(r) * shard_, Shape{shard_});
      if (round == 0 && r == 0)
        downed_.copy_from(in);
      else
        be_.accumulate(downed_, in);
    }
    return;
  }
  // Shard s of this rank's gradient goes to rank s; the owner folds the round's N
  // gradients (micro-batches jN .. jN + N - 1) in rank order onto its running sum. With
  // overlap the buckets' all-to-alls have brought the same blocks into recv_.
  if (overlap_) {
    start_remaining_buckets();
    comm_.wait_all();
  } else {
    pack(params_.grads, send_.data());
    comm_.alltoall(send_.data(), recv_.data(), shard_);
  }
  float* own = owned_.data();
  for (int r = 0; r < n; ++r) {
    const float* in = recv_.data() + static_cast<int64_t>(r) * shard_;
    if (round == 0 && r == 0) {
      std::copy(in, in + shard_, own);
    } else {
      for (int64_t i = 0; i < shard_; ++i) own[i] += in[i];
    }
  }
}

void GradReducer::finish(float scale, bool whole) {
  if (local_) {
    for (size_t p = 0; p < acc_.size(); ++p)
      if (acc_[p].defined()) be_.scale(acc_[p], scale, params_.grads[p]);
    return;
  }
  if (dcomm_) {
    void* stream = be_.native_stream();
    if (!ordered_) {
      pack_device(acc_, dsend_);
      dcomm_->allreduce_sum(dsend_.f32(), layout_.size, stream);
      be_.scale(dsend_, scale, dsend_);
      unpack_device(dsend_, params_.grads);
    } else {
      be_.scale(downed_, scale, downed_);
      if (whole) {
        dcomm_->allgather(downed_.f32(), drecv_.f32(), shard_, stream);
        unpack_device(drecv_, params_.grads);
      } else {  // a sharded optimizer reads this rank's shard only
        unpack_shard_device(downed_, params_.grads);
      }
    }
    dcomm_->wait(stream);  // the job's deadline on the collectives
    return;
  }
  if (!ordered_) {
    if (overlap_)
      comm_.wait_all();
    else {
      pack(acc_, send_.data());
      comm_.allreduce_sum(send_.data(), layout_.size);
    }
    for (float& v : send_) v *= scale;
    unpack(send_.data(), params_.grads);
    return;
  }
  for (float& v : owned_) v *= scale;
  if (!whole) {  // a sharded optimizer reads this rank's shard only
    unpack_shard(owned_.data(), params_.grads);
    return;
  }
  comm_.allgather(owned_.data(), recv_.data(), shard_);
  unpack(recv_.data(), params_.grads);
}

void GradReducer::gather_weights() {
  if (local_) return;
  if (dcomm_) {
    void* stream = be_.native_stream();
    pack_shard_device(params_.values, downed_);
    dcomm_->allgather(downed_.f32(), drecv_.f32(), shard_, stream);
    unpack_device(drecv_, params_.values);
    dcomm_->wait(stream);
    return;
  }
  pack_shard(params_.values, owned_.data());
  comm_.allgather(owned_.data(), recv_.data(), shard_);
  unpack(recv_.data(), params_.values);
}

}  // namespace remat
