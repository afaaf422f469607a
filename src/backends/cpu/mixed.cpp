#include "backends/cpu/mixed.h"

#include <vector>

#include "backends/cpu/bf16.h"
#include "remat/bf16.h"
#include "remat/error.h"

namespace remat::cpu {

float* staging(int slot, int64_t n) {
  thread_local std::vector<float> buffers[kSlots];
  REMAT_CHECK(slot >= 0 && slot < kSlots, "cpu staging slot ", slot, " of ", kSlots);
  std::vector<float>& b = buffers[slot];
  if (static_cast<int64_t>(b.size()) < n) b.resize(static_cast<size_t>(n));
  return b.data();
}

bool is_bf16(const Tensor& t) { return t.dtype() == DType::bf16; }

F32Reader::F32Reader(const Tensor& t, int slot) : slot_(slot) {
  if (is_bf16(t))
    h_ = t.bf16();
  else
    f_ = t.f32();
}

const float* F32Reader::get(int64_t begin, int64_t n) {
  if (f_) return f_ + begin;
  float* b = staging(slot_, n);
  bf16_to_f32(h_ + begin, b, n);
  return b;
}

F32Writer::F32Writer(const Tensor& t, int slot, bool load) : slot_(slot), load_(load) {
  if (is_bf16(t))
    h_ = t.bf16();
  else
    f_ = t.f32();
}

float* F32Writer::get(int64_t begin, int64_t n) {
  if (f_) return f_ + begin;
  buf_ = staging(slot_, n);
  begin_ = begin;
  n_ = n;
  if (load_) bf16_to_f32(h_ + begin, buf_, n);
  return buf_;
}

void F32Writer::put() {
  if (h_ && buf_) f32_to_bf16(buf_, h_ + begin_, n_);
}

const float* f32_all(const Tensor& t, int slot) {
  if (!is_bf16(t)) return t.f32();
  F32Reader r(t, slot);
  return r.get(0, t.numel());
}

float load_f32(const Tensor& t, int64_t i) { return is_bf16(t) ? bf16_to_float(t.bf16()[i]) : t.f32()[i]; }

void store_f32(const Tensor& t, int64_t i, float v) {
  if (is_bf16(t))
    t.bf16()[i] = bf16_from_float(v);
  else
    t.f32()[i] = v;
}

}  // namespace remat::cpu
