#include "train/grad_reduce.h"

#include <algorithm>
#include <cstring>

#include "remat/error.h"
#include "remat/memory.h"

namespace remat {

GradReducer::GradReducer(ParamStore& params, Backend& be, dist::Comm& comm, bool ordered)
    : params_(params), be_(be), comm_(comm), ordered_(ordered) {
  for (const Tensor& g : params_.grads)
    if (g.defined()) flat_ += g.numel();
  const int n = comm_.size();
  shard_ = (flat_ + n - 1) / n;
  if (n == 1 || !ordered_) {
    // The running sum of this rank's micro-batches, beside the gradients.
    TagScope scope(MemoryCategory::gradient, "accumulation", Phase::setup);
    for (const Tensor& g : params_.grads) acc_.push_back(g.defined() ? Tensor::empty(g.shape(), g.device()) : Tensor());
  }
  if (n > 1) {
    send_.assign(static_cast<size_t>(shard_ * n), 0.0f);
    if (ordered_) {
      recv_.assign(static_cast<size_t>(shard_ * n), 0.0f);
      owned_.assign(static_cast<size_t>(shard_), 0.0f);
    }
  }
}

void GradReducer::pack(float* dst) const {
  int64_t off = 0;
  for (const Tensor& g : params_.grads) {
    if (!g.defined()) continue;
    if (g.device().is_cpu()) {
      std::memcpy(dst + off, g.f32(), static_cast<size_t>(g.numel()) * sizeof(float));
    } else {
      const std::vector<float> h = g.to_vector();
      std::copy(h.begin(), h.end(), dst + off);
    }
    off += g.numel();
  }
}

void GradReducer::unpack(const float* src) {
  int64_t off = 0;
  for (Tensor& g : params_.grads) {
    if (!g.defined()) continue;
    if (g.device().is_cpu()) {
      std::memcpy(g.f32(), src + off, static_cast<size_t>(g.numel()) * sizeof(float));
    } else {
      g.copy_from(Tensor::from_vector(std::vector<float>(src + off, src + off + g.numel()), g.shape()));
    }
    off += g.numel();
  }
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
  pack(send_.data());
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

void GradReducer::finish(float scale) {
  const int n = comm_.size();
  if (n == 1) {
    for (size_t p = 0; p < acc_.size(); ++p)
      if (acc_[p].defined()) be_.scale(acc_[p], scale, params_.grads[p]);
    return;
  }
  if (!ordered_) {
    for (size_t p = 0; p < acc_.size(); ++p)
      if (acc_[p].defined()) params_.grads[p].copy_from(acc_[p]);
    pack(send_.data());
    comm_.allreduce_sum(send_.data(), flat_);
    for (int64_t i = 0; i < flat_; ++i) send_[static_cast<size_t>(i)] *= scale;
    unpack(send_.data());
    return;
  }
  for (float& v : owned_) v *= scale;
  comm_.allgather(owned_.data(), recv_.data(), shard_);
  unpack(recv_.data());
}

}  // namespace remat
