// fp32 staging of float tensors that may be stored in bf16 (training.precision bf16):
// the CPU backend computes in fp32 always, and an op reads a bf16 tensor a piece at a
// time (a row, a chunk, a GEMM panel) through a per-thread buffer, writing bf16 outputs
// back the same way (round to nearest even, include/remat/bf16.h). An f32 tensor passes
// straight through (a pointer into its own storage, no copy), so the fp32 path of every
// op is the code it was, bit for bit.
//
// The buffers are per thread and per slot, grown to the largest piece asked for (a row
// of a row op, at most kPiece elements of an elementwise op, one panel of a GEMM): small,
// bounded by the shapes, and not tensors, so outside the memory model (docs/memory.md,
// "Mixed precision").
#pragma once

#include <cstdint>
#include <initializer_list>

#include "remat/tensor.h"

namespace remat::cpu {

// Elements per piece of the chunked (elementwise) paths.
constexpr int64_t kPiece = 2048;

// The calling thread's staging buffer `slot` (0 .. kSlots-1), at least n floats.
constexpr int kSlots = 8;
float* staging(int slot, int64_t n);

bool is_bf16(const Tensor& t);
// Every defined tensor among them is f32 (the fast path of an op).
inline bool all_f32(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined() && is_bf16(*t)) return false;
  return true;
}

// Reads elements [begin, begin + n) of a float tensor in fp32.
class F32Reader {
 public:
  F32Reader(const Tensor& t, int slot);
  const float* get(int64_t begin, int64_t n);
  // One row of a [rows, n] view.
  const float* row(int64_t r, int64_t n) { return get(r * n, n); }

 private:
  const float* f_ = nullptr;
  const uint16_t* h_ = nullptr;
  int slot_;
};

// Writes elements [begin, begin + n) of a float tensor from fp32: get() gives where to
// write (the tensor itself when f32), put() stores what was written (rounding to bf16).
// With `load`, get() also fills the buffer with the current values (for +=).
class F32Writer {
 public:
  F32Writer(const Tensor& t, int slot, bool load = false);
  float* get(int64_t begin, int64_t n);
  float* row(int64_t r, int64_t n) { return get(r * n, n); }
  void put();

 private:
  float* f_ = nullptr;
  uint16_t* h_ = nullptr;
  int slot_;
  bool load_;
  float* buf_ = nullptr;
  int64_t begin_ = 0, n_ = 0;
};

// The whole of a small tensor (a gamma, a bias) in fp32: its own floats, or a converted
// copy in staging slot `slot`.
const float* f32_all(const Tensor& t, int slot);

// Element i of a float tensor, read in fp32 / written from fp32 (rounded when bf16).
float load_f32(const Tensor& t, int64_t i);
void store_f32(const Tensor& t, int64_t i, float v);

}  // namespace remat::cpu
