// Batch order (BatchSampler), batch assembly (image_batch, text_batch) and the training-time
// flips of image batches (hflip_draws).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>

#include "data/random.h"
#include "data/token_batch.h"
#include "remat/data.h"
#include "remat/error.h"
#include "remat/memory.h"
#include "remat/philox.h"

namespace remat {

BatchSampler::BatchSampler(int64_t n, int64_t batch, uint64_t seed, bool shuffle, bool drop_last)
    : n_(n), batch_(batch), seed_(seed), shuffle_(shuffle), drop_last_(drop_last) {
  REMAT_CHECK(n > 0, "BatchSampler: the data set is empty (n = ", n, ")");
  REMAT_CHECK(batch > 0, "BatchSampler: batch size ", batch, " must be positive");
  REMAT_CHECK(!drop_last || batch <= n, "BatchSampler: batch size ", batch, " exceeds the ", n,
              " samples, so with drop_last an epoch has no batch");
  shuffle_epoch();
}

int64_t BatchSampler::batches_per_epoch() const { return drop_last_ ? n_ / batch_ : (n_ + batch_ - 1) / batch_; }

namespace {

template <class T>
void fisher_yates(std::vector<T>& v, uint64_t seed) {
  std::mt19937_64 gen(seed);
  for (auto i = static_cast<int64_t>(v.size()) - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(detail::uniform_below(gen, static_cast<uint64_t>(i) + 1));
    std::swap(v[static_cast<size_t>(i)], v[static_cast<size_t>(j)]);
  }
}

}  // namespace

void BatchSampler::shuffle_epoch() {
  order_.resize(static_cast<size_t>(n_));
  std::iota(order_.begin(), order_.end(), int64_t{0});
  if (shuffle_) fisher_yates(order_, detail::splitmix64(detail::splitmix64(seed_) ^ static_cast<uint64_t>(epoch_)));
  if (!lengths_.empty()) group_epoch();
}

void BatchSampler::group_epoch() {
  // The pools cover the whole batches only: the n % batch samples after them (left out with
  // drop_last, else the last batch) stay a random draw, not the longest of the last pool.
  const int64_t whole = n_ / batch_;
  const auto pool = static_cast<ptrdiff_t>(pool_batches_ * batch_);
  auto by_length = [&](int64_t a, int64_t b) {
    return lengths_[static_cast<size_t>(a)] < lengths_[static_cast<size_t>(b)];
  };
  const auto grouped_end = order_.begin() + whole * batch_;
  for (auto it = order_.begin(); it != grouped_end;) {
    const auto end = grouped_end - it > pool ? it + pool : grouped_end;
    std::stable_sort(it, end, by_length);
    it = end;
  }
  // The whole batches change places; a last, partial batch (no drop_last) stays last.
  std::vector<int64_t> batches(static_cast<size_t>(whole));
  std::iota(batches.begin(), batches.end(), int64_t{0});
  if (shuffle_)
    fisher_yates(batches,
                 detail::splitmix64(detail::splitmix64(detail::splitmix64(seed_) ^ static_cast<uint64_t>(epoch_))));
  std::vector<int64_t> grouped;
  grouped.reserve(order_.size());
  for (int64_t b : batches)
    grouped.insert(grouped.end(), order_.begin() + b * batch_, order_.begin() + (b + 1) * batch_);
  grouped.insert(grouped.end(), order_.begin() + whole * batch_, order_.end());
  order_ = std::move(grouped);
}

void BatchSampler::group_by_length(std::vector<int64_t> lengths, int64_t pool_batches) {
  REMAT_CHECK(static_cast<int64_t>(lengths.size()) == n_, "BatchSampler::group_by_length: ", lengths.size(),
              " lengths for ", n_, " samples");
  REMAT_CHECK(pool_batches >= 1, "BatchSampler::group_by_length: pool of ", pool_batches, " batches");
  lengths_ = std::move(lengths);
  pool_batches_ = pool_batches;
  shuffle_epoch();
}

std::vector<int64_t> BatchSampler::next() {
  if (position_ >= batches_per_epoch()) {
    ++epoch_;
    position_ = 0;
    shuffle_epoch();
  }
  const int64_t begin = position_ * batch_;
  const int64_t end = std::min(begin + batch_, n_);
  ++position_;
  return {order_.begin() + begin, order_.begin() + end};
}

void BatchSampler::seek(int64_t epoch, int64_t position) {
  REMAT_CHECK(epoch >= 0, "BatchSampler::seek: epoch ", epoch, " is negative");
  REMAT_CHECK(position >= 0 && position <= batches_per_epoch(), "BatchSampler::seek: position ", position,
              " is outside [0, ", batches_per_epoch(), "] batches per epoch");
  const bool reshuffle = epoch != epoch_;
  epoch_ = epoch;
  position_ = position;
  if (reshuffle) shuffle_epoch();
}

Batch::Batch(Tensor input, Tensor targets) {
  set("input", std::move(input));
  set("targets", std::move(targets));
}

Batch& Batch::set(const std::string& name, Tensor t) {
  for (auto& [n, v] : items_)
    if (n == name) {
      v = std::move(t);
      return *this;
    }
  items_.emplace_back(name, std::move(t));
  return *this;
}

bool Batch::has(const std::string& name) const {
  for (const auto& item : items_)
    if (item.first == name) return true;
  return false;
}

const Tensor& Batch::at(const std::string& name) const {
  for (const auto& item : items_)
    if (item.first == name) return item.second;
  std::string names;
  for (const auto& item : items_) names += (names.empty() ? "" : ", ") + item.first;
  REMAT_THROW("the batch has no tensor \"", name, "\" (it has: ", names.empty() ? "none" : names, ")");
}

const Tensor& Batch::input() const { return at("input"); }
const Tensor& Batch::targets() const { return at("targets"); }

namespace data_detail {

Tensor to_device(const Tensor& host, Device device) { return device.is_cpu() ? host : host.to(device); }

Batch empty_token_batch(int64_t b, int64_t seq_len, Device on) {
  return {Tensor::empty(Shape{b, seq_len}, on, DType::i32), Tensor::empty(Shape{b, seq_len}, on, DType::i32)};
}

}  // namespace data_detail

using data_detail::to_device;

std::vector<uint8_t> hflip_draws(uint64_t seed, int64_t epoch, int64_t n, const std::vector<int64_t>& indices,
                                 double p) {
  REMAT_CHECK(epoch >= 0 && n > 0, "hflip_draws: epoch ", epoch, " and set size ", n, " must be >= 0 and > 0");
  REMAT_CHECK(p >= 0.0 && p <= 1.0, "hflip_draws: probability ", p, " is outside [0, 1]");
  const uint64_t s = seed ^ kAugmentStream;
  const uint64_t first = static_cast<uint64_t>(epoch) * static_cast<uint64_t>(n);
  std::vector<uint8_t> out(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    REMAT_CHECK(indices[i] >= 0 && indices[i] < n, "hflip_draws: index ", indices[i], " is outside [0, ", n, ")");
    out[i] = philox::keep(s, first, static_cast<uint64_t>(indices[i]), static_cast<float>(p)) ? 1 : 0;
  }
  return out;
}

Batch image_batch(const ImageDataset& d, const std::vector<int64_t>& indices, Device device,
                  const std::vector<uint8_t>& hflip) {
  REMAT_CHECK(d.images.defined() && d.labels.defined(), "image_batch: data set ", d.source, " is empty");
  REMAT_CHECK(d.images.dtype() == DType::f32 && d.images.rank() == 4, "image_batch: images of ", d.source,
              " must be f32 [N, C, H, W], not ", d.images.str());
  const int64_t n = d.images.size(0);
  REMAT_CHECK(d.labels.dtype() == DType::i32 && d.labels.rank() == 1 && d.labels.size(0) == n,
              "image_batch: labels of ", d.source, " must be i32 [", n, "], not ", d.labels.str());
  REMAT_CHECK(!indices.empty(), "image_batch: no indices");
  for (size_t i = 0; i < indices.size(); ++i)
    REMAT_CHECK(indices[i] >= 0 && indices[i] < n, "image_batch: index ", indices[i], " at position ", i,
                " is outside [0, ", n, ") of ", d.source);
  REMAT_CHECK(hflip.empty() || hflip.size() == indices.size(), "image_batch: ", hflip.size(), " flip flags for ",
              indices.size(), " indices");
  const auto b = static_cast<int64_t>(indices.size());
  const Shape in_shape{b, d.images.size(1), d.images.size(2), d.images.size(3)};

  TagScope scope(MemoryCategory::input, "data", Phase::setup);
  if (device.is_meta())
    return {Tensor::empty(in_shape, device, DType::f32), Tensor::empty(Shape{b}, device, DType::i32)};
  Tensor input = Tensor::empty(in_shape, Device::cpu(), DType::f32);
  Tensor targets = Tensor::empty(Shape{b}, Device::cpu(), DType::i32);
  const int64_t per = d.images.size(1) * d.images.size(2) * d.images.size(3);
  const float* src = d.images.f32();
  const int32_t* lab = d.labels.i32();
  float* dst = input.f32();
  int32_t* tgt = targets.i32();
  const int64_t w = d.images.size(3);
  for (int64_t i = 0; i < b; ++i) {
    const int64_t k = indices[static_cast<size_t>(i)];
    const float* from = src + k * per;
    float* to = dst + i * per;
    if (hflip.empty() || !hflip[static_cast<size_t>(i)]) {
      std::memcpy(to, from, static_cast<size_t>(per) * sizeof(float));
    } else {
      for (int64_t r = 0; r < per; r += w)  // every row of every channel, reversed
        std::reverse_copy(from + r, from + r + w, to + r);
    }
    tgt[i] = lab[k];
  }
  return {to_device(input, device), to_device(targets, device)};
}

int64_t text_windows(const TextDataset& d, int64_t seq_len) {
  REMAT_CHECK(seq_len > 0, "text_windows: seq_len ", seq_len, " must be positive");
  const auto n = static_cast<int64_t>(d.tokens.size());
  return n > seq_len ? (n - 1) / seq_len : 0;
}

Batch text_batch(const TextDataset& d, const std::vector<int64_t>& starts, int64_t seq_len, Device device) {
  REMAT_CHECK(seq_len > 0, "text_batch: seq_len ", seq_len, " must be positive");
  REMAT_CHECK(!starts.empty(), "text_batch: no window starts");
  const auto n = static_cast<int64_t>(d.tokens.size());
  REMAT_CHECK(n > seq_len, "text_batch: ", d.source, " has ", n, " tokens, too few for one window of ", seq_len,
              " plus its target");
  const int64_t last = n - seq_len - 1;  // the largest valid start
  for (size_t i = 0; i < starts.size(); ++i)
    REMAT_CHECK(starts[i] >= 0 && starts[i] <= last, "text_batch: start ", starts[i], " at position ", i,
                " is outside [0, ", last, "] for windows of ", seq_len, " in ", n, " tokens of ", d.source);
  const auto b = static_cast<int64_t>(starts.size());
  REMAT_CHECK(b <= INT64_MAX / seq_len, "text_batch: ", b, " windows of ", seq_len, " tokens overflow");

  TagScope scope(MemoryCategory::input, "data", Phase::setup);
  if (device.is_meta()) return data_detail::empty_token_batch(b, seq_len, device);
  const Batch host = data_detail::empty_token_batch(b, seq_len, Device::cpu());
  Tensor input = host.input(), targets = host.targets();
  int32_t* in = input.i32();
  int32_t* tg = targets.i32();
  const auto bytes = static_cast<size_t>(seq_len) * sizeof(int32_t);
  for (int64_t i = 0; i < b; ++i) {
    const int32_t* w = d.tokens.data() + starts[static_cast<size_t>(i)];
    std::memcpy(in + i * seq_len, w, bytes);
    std::memcpy(tg + i * seq_len, w + 1, bytes);
  }
  return {to_device(input, device), to_device(targets, device)};
}

}  // namespace remat
