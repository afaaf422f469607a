#include "train/grad_reduce.h"

#include <algorithm>
#include <cstring>

#include "remat/error.h"
#include "remat/memory.h"

namespace remat {

GradReducer::GradReducer(ParamStore& params, Backend& be, dist::Comm& comm, bool ordered)
    : params_(params), be_(be), comm_(comm), ordered_(ordered), layout_(params, comm.size()), shard_(layout_.shard) {
  const int n = comm_.size();
  if (n == 1 || !ordered_) {
    // The running sum of this rank's micro-batches, beside the gradients.
    TagScope scope(MemoryCategory::gradient, "accumulation", Phase::setup);
    for (const Tensor& g : params_.grads) acc_.push_back(g.defined() ? Tensor::empty(g.shape(), g.device()) : Tensor());
  }
  if (n > 1) {
    // Zeros in the padding between parameters stay zeros.
    send_.assign(static_cast<size_t>(layout_.size), 0.0f);
    recv_.assign(static_cast<size_t>(layout_.size), 0.0f);
    owned_.assign(static_cast<size_t>(shard_), 0.0f);
  }
}

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

void GradReducer::fold_local(int64_t round) {
  for (size_t p = 0; p < acc_.size(); ++p) {
    if (!acc_[p].defined()) continue;
    if (round == 0)
      acc_[p].copy_from(params_.grads[p]);
    else
      be_.accumulate(acc_[p], params_.grads[p]);
  }
}

void GradReducer::add_round(int64_t round) {
  const int n = comm_.size();
  if (n == 1 || !ordered_) {
    fold_local(round);
    return;
  }
  // Shard s of this rank's gradient goes to rank s; the owner folds the round's N
  // gradients (micro-batches jN .. jN + N - 1) in rank order onto its running sum.
  pack(params_.grads, send_.data());
  comm_.alltoall(send_.data(), recv_.data(), shard_);
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
  const int n = comm_.size();
  if (n == 1) {
    for (size_t p = 0; p < acc_.size(); ++p)
      if (acc_[p].defined()) be_.scale(acc_[p], scale, params_.grads[p]);
    return;
  }
  if (!ordered_) {
    for (size_t p = 0; p < acc_.size(); ++p)
      if (acc_[p].defined()) params_.grads[p].copy_from(acc_[p]);
    pack(params_.grads, send_.data());
    comm_.allreduce_sum(send_.data(), layout_.size);
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
  if (comm_.size() == 1) return;
  pack_shard(params_.values, owned_.data());
  comm_.allgather(owned_.data(), recv_.data(), shard_);
  unpack(recv_.data(), params_.values);
}

}  // namespace remat
