// Attention's dimensions, read from its fused qkv [B, T, 3C] and its heads: what the cpu
// and cuda backends size their loops, GEMMs and scratch by.
#pragma once

#include <climits>
#include <cstdint>

#include "remat/backend.h"
#include "remat/error.h"

namespace remat {

struct AttnDims {
  int64_t b, t, c, h, hs;  // batch, sequence, channels, heads, head size (c / h)
};

// `blas` names the library the backend's GEMMs go to (cblas, cuBLAS): it takes int sizes
// and leading dimensions, so T and 3C must fit an int.
inline AttnDims attn_dims(const Shape& qkv, const AttentionParams& p, const char* blas) {
  AttnDims d{qkv[0], qkv[1], qkv[2] / 3, p.n_head, 0};
  d.hs = d.c / d.h;
  REMAT_CHECK(d.t <= INT_MAX && qkv[2] <= INT_MAX, "attention: qkv ", qkv.str(), " is too large for ", blas);
  return d;
}

}  // namespace remat
