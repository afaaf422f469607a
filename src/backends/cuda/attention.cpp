// Multi-head self-attention on the GPU, with the CPU backend's semantics
// (src/backends/cpu/attention.cpp): qkv [B, T, 3C] with q, k, v side by side and head h in
// columns h*hs .. (h+1)*hs of each; probs [B, H, T, T] saved before dropout; dropout mask
// bits from Philox, element index = flat index in probs.
//
// The products run on cuBLAS as batched GEMMs that read the heads in place through their
// leading dimensions (row stride 3C in qkv, C in out): no permute copies. A head (b, h)
// sits at b * stride_b + h * stride_h, two strides, which no one strided-batched call
// spans; so each product is one pointer-array call (cublasSgemmBatched,
// cublasGemmBatchedEx) over all the group's B' * H heads, its arrays written on the stream
// by a kernel into the backend's scratch (head_gemm_mixed); one strided-batched call where
// B' or H is 1 (the heads then one stride apart). The row work (scaled causal softmax,
// dropout, softmax backward) is kernels/attention.cu.
//
// Forward:  S = Q K^T / sqrt(hs) -> probs; softmax (+ dropout) in place -> probs
//           (dropped copy in the workspace); out = Pd V.
// Backward: dPd = dO V^T; dS = softmax backward through dropout (dropped probs rebuilt in
//           the workspace); dV = Pd^T dO; dQ = dS K / sqrt(hs); dK = dS^T Q / sqrt(hs).
//
// The [T, T] scratch goes by groups of whole batch elements, at most kGroupBytes per
// buffer (one batch element at least), like the CPU backend's head groups; tests shrink
// the limit (set_attention_group_bytes) to run several groups at small shapes.
//
// bf16 (training.precision bf16: qkv, probs, out, dout, dqkv all bf16): the products are
// cublasGemmEx with bf16 factors; the scores and dPd come out in fp32 into the workspace,
// the softmax rounds the probabilities to bf16 as it stores them (P V then uses the stored
// probabilities, as the CPU), and the backward's dS is rounded to bf16 for its two GEMMs
// (the CPU keeps dS in fp32: within a bf16 rounding). The workspace query under bf16
// (activation_dtype()) counts the fp32 scores or dPd, dS and the dropped probabilities in
// bf16, per group; the meta backend asks this query for cuda predictions.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "backends/attention_dims.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/gemm.h"
#include "kernels/attention.cuh"
#include "remat/cuda_check.h"
#include "remat/dtype.h"
#include "remat/error.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

namespace {

kernels::AttentionDropout dropout_args(const AttentionParams& p, RngState rng) {
  kernels::AttentionDropout d;
  d.on = p.applies_dropout();
  d.keep_prob = 1.0f - p.dropout;
  d.scale = d.keep_prob > 0.0f ? 1.0f / d.keep_prob : 0.0f;
  d.seed = rng.seed;
  d.offset = rng.offset;
  return d;
}

constexpr int64_t kGroupBytes = int64_t{64} << 20;

// Batch elements per group: each [T, T] scratch buffer holds a group's B' * H matrices,
// at most `limit` bytes (kGroupBytes where 0).
int64_t group_batch(const AttnDims& d, int64_t limit) {
  const int64_t per_b = std::max<int64_t>(d.h * d.t * d.t * static_cast<int64_t>(sizeof(float)), 1);
  return std::clamp<int64_t>((limit > 0 ? limit : kGroupBytes) / per_b, 1, std::max<int64_t>(d.b, 1));
}

size_t group_floats(const AttnDims& d, int64_t limit) {
  return static_cast<size_t>(group_batch(d, limit) * d.h * d.t * d.t);
}

// A matrix per head (b, h): data + b * per_b + h * per_h, rows ld floats apart.
template <typename T>
struct HeadMatrices {
  T* data;
  int64_t ld, per_b, per_h;
};
using HeadMatrix = HeadMatrices<const float>;
using HeadOutput = HeadMatrices<float>;

// bf16 (training.precision bf16): head matrices of f32 or bf16 elements.
struct HeadBuf {
  void* data;
  bool bf16;
  int64_t ld, per_b, per_h;
  kernels::FloatBuf at(int64_t b, int64_t h) const {
    const int64_t e = b * per_b + h * per_h;
    return {bf16 ? static_cast<void*>(static_cast<kernels::bf16*>(data) + e)
                 : static_cast<void*>(static_cast<float*>(data) + e),
            bf16};
  }
};

template <typename T>
HeadBuf head_buf(const HeadMatrices<T>& x) {
  return {const_cast<float*>(x.data), false, x.ld, x.per_b, x.per_h};
}

// What the head GEMMs need of the backend: the handle, its stream (the pointer arrays are
// written there) and where the arrays go. They go in the backend's scratch(): attention
// uses it for nothing else, and each fill is followed on the one stream by the GEMM that
// reads it, so the next fill (or the next op's use of scratch) comes after that GEMM.
// tf32: cuBLAS's fast math, under which the alignment rule below applies to fp32 too.
struct HeadGemm {
  cublasHandle_t handle;
  cudaStream_t stream;
  void* arrays;
  bool tf32;
};

// Heads per pointer-array call: three arrays of pointers in the 64 KiB scratch (2730). A
// group has at most 16 Mi / T^2 heads at the default limit (kGroupBytes), so every group
// with T >= 79 is one call; only groups of more heads than this take several.
constexpr int64_t kArrayHeads = static_cast<int64_t>(CudaBackend::kScratchBytes / (3 * sizeof(void*)));

size_t elem_bytes(const HeadBuf& x) { return x.bf16 ? 2 : 4; }

// The alignment (bytes, at most 16) that every head's matrix of x has: the base's, and the
// batch and head strides' where more than one is taken. Known on the host: no read of the
// arrays.
size_t head_alignment(const HeadBuf& x, int64_t nb, int64_t nh) {
  uintptr_t bits = reinterpret_cast<uintptr_t>(x.data) | 16;
  if (nb > 1) bits |= static_cast<uintptr_t>(x.per_b) * elem_bytes(x);
  if (nh > 1) bits |= static_cast<uintptr_t>(x.per_h) * elem_bytes(x);
  return bits & (~bits + 1);
}

// Whether the heads go through one pointer-array call. Not needed where the group is one
// batch element or there is one head: then the heads are one stride apart, and one
// strided-batched call covers them (no arrays to write). cuBLAS's types: fp32 factors into
// an fp32 C (cublasSgemmBatched), bf16 factors into bf16 or fp32 (cublasGemmBatchedEx);
// mixed factors stay on the strided loop (gemm_strided_mixed's own kernel). Alignment:
// through pointer arrays cuBLAS cannot see the matrices' addresses, and its documentation
// asks, for bf16 inputs or a fast math mode (TF32), that they be 16-byte aligned where a
// factor's k elements are a multiple of 16 bytes (4 where of 4); heads that are not keep
// the strided calls, which check their pointers themselves. GPT-2's heads (hs = 64,
// T = 1024) are all 16-byte aligned.
bool pointer_arrays_fit(const HeadGemm& g, int64_t k, const HeadBuf& a, const HeadBuf& b, const HeadBuf& c, int64_t nb,
                        int64_t nh) {
  if (nb < 2 || nh < 2 || a.bf16 != b.bf16 || (c.bf16 && !a.bf16)) return false;
  if (!a.bf16 && !g.tf32) return true;
  const int64_t k_bytes = k * static_cast<int64_t>(elem_bytes(a));
  const size_t need = k_bytes % 16 == 0 ? 16 : k_bytes % 4 == 0 ? 4 : 1;
  for (const HeadBuf* x : {&a, &b, &c})
    if (head_alignment(*x, nb, nh) < need) return false;
  return true;
}

// C = alpha op(A) op(B) for the heads (b, h) of nb batch elements, row-major [m, n] results
// (the row-major trick of cuda_backend.cpp: cuBLAS computes C^T = op(B)^T op(A)^T). All the
// nb * nh heads go through one pointer-array call (per kArrayHeads heads) when
// pointer_arrays_fit: a kernel writes the arrays on the stream, then cublasSgemmBatched or
// cublasGemmBatchedEx. Otherwise strided-batched calls: one call batches over heads (or
// over the batch, whichever is longer) and a loop covers the other (one iteration where
// nb or nh is 1). Either way each head is the same GEMM (the same bits on cuda-emu).
void head_gemm_mixed(const HeadGemm& g, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                     const HeadBuf& a, const HeadBuf& b, const HeadBuf& c, int64_t nb, int64_t nh) {
  if (pointer_arrays_fit(g, k, a, b, c, nb, nh)) {
    void** ptrs = static_cast<void**>(g.arrays);
    const auto byte_stride = [](const HeadBuf& x, int64_t s) { return s * static_cast<int64_t>(elem_bytes(x)); };
    const kernels::HeadPointerArgs args{
        {static_cast<char*>(a.data), static_cast<char*>(b.data), static_cast<char*>(c.data)},
        {byte_stride(a, a.per_b), byte_stride(b, b.per_b), byte_stride(c, c.per_b)},
        {byte_stride(a, a.per_h), byte_stride(b, b.per_h), byte_stride(c, c.per_h)}};
    for (int64_t first = 0; first < nb * nh; first += kArrayHeads) {
      const int64_t count = std::min(kArrayHeads, nb * nh - first);
      kernels::attention_head_pointers(args, nh, first, count, ptrs, g.stream);
      gemm_batched(g.handle, GemmSize{m, n, k, count}, alpha, GemmPointers{ptrs, a.bf16, a.ld, ta},
                   GemmPointers{ptrs + count, b.bf16, b.ld, tb}, 0.0f,
                   GemmPointers{ptrs + 2 * count, c.bf16, c.ld, false});
    }
    return;
  }
  const bool over_heads = nh >= nb;
  const int64_t loops = over_heads ? nb : nh, batch = over_heads ? nh : nb;
  for (int64_t l = 0; l < loops; ++l) {
    const int64_t bi = over_heads ? l : 0, hi = over_heads ? 0 : l;
    auto stride = [&](const HeadBuf& x) -> int64_t { return over_heads ? x.per_h : x.per_b; };
    gemm_strided_mixed(g.handle, "attention", GemmSize{m, n, k, batch}, alpha,
                       GemmOperand{a.at(bi, hi), a.ld, stride(a), ta}, GemmOperand{b.at(bi, hi), b.ld, stride(b), tb},
                       0.0f, matrix(c.at(bi, hi), c.ld, stride(c)));
  }
}

// The fp32 path: gemm_strided_mixed with three f32 operands is gemm_strided (as before).
void head_gemm(const HeadGemm& g, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const HeadMatrix& a,
               const HeadMatrix& b, const HeadOutput& c, int64_t nb, int64_t nh) {
  head_gemm_mixed(g, ta, tb, m, n, k, alpha, head_buf(a), head_buf(b), head_buf(c), nb, nh);
}

bool bf16_mode() { return activation_dtype() == DType::bf16; }

// The bf16 workspace, per group of batch elements: forward, the fp32 scores [G, H, T, T]
// and (with dropout) the bf16 dropped probabilities; backward, dPd in fp32, dS in bf16 and
// (with dropout) the dropped probabilities in bf16.
size_t bf16_forward_bytes(const AttnDims& d, int64_t limit, bool dropout) {
  const size_t g = group_floats(d, limit);
  return g * sizeof(float) + (dropout ? g * 2 : 0);
}
size_t bf16_backward_bytes(const AttnDims& d, int64_t limit, bool dropout) {
  const size_t g = group_floats(d, limit);
  return g * sizeof(float) + g * 2 + (dropout ? g * 2 : 0);
}

bool all_bf16(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined() && t->dtype() != DType::bf16) return false;
  return true;
}
bool all_f32(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined() && t->dtype() != DType::f32) return false;
  return true;
}

}  // namespace

int64_t CudaBackend::set_attention_group_bytes(int64_t bytes) {
  REMAT_CHECK(bytes >= 0, "set_attention_group_bytes: ", bytes, " bytes (want >= 0; 0: the default)");
  const int64_t old = attn_group_bytes_;
  attn_group_bytes_ = bytes;
  return old;
}

size_t CudaBackend::attention_forward_workspace_impl(const Shape& qkv, const AttentionParams& p) {
  const AttnDims d = attn_dims(qkv, p, "cuBLAS");
  if (bf16_mode()) return bf16_forward_bytes(d, attn_group_bytes_, p.applies_dropout());
  return p.applies_dropout() ? group_floats(d, attn_group_bytes_) * sizeof(float) : 0;
}

size_t CudaBackend::attention_backward_workspace_impl(const Shape& qkv, const AttentionParams& p) {
  const AttnDims d = attn_dims(qkv, p, "cuBLAS");
  if (bf16_mode()) return bf16_backward_bytes(d, attn_group_bytes_, p.applies_dropout());
  return group_floats(d, attn_group_bytes_) * (p.applies_dropout() ? 2 : 1) * sizeof(float);
}

void CudaBackend::attention_forward_impl(const Tensor& qkv, const AttentionParams& p, RngState rng, const Tensor& out,
                                         const Tensor& probs, const Tensor& workspace) {
  const AttnDims d = attn_dims(qkv.shape(), p, "cuBLAS");
  if (d.b == 0 || d.t == 0) return;
  const int64_t T = d.t, C = d.c, H = d.h, hs = d.hs, TT = T * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // Without out, only the probabilities: no dropout (they are taken before it), no P V.
  const bool want_out = out.defined();
  kernels::AttentionDropout drop = dropout_args(p, rng);
  drop.on = drop.on && want_out;
  const int64_t G = group_batch(d, attn_group_bytes_);
  const HeadGemm g{cublas_, stream_, scratch_, tf32_};
  if (!all_f32({&qkv, &out, &probs})) {
    REMAT_CHECK(bf16_mode() && all_bf16({&qkv, &out, &probs}), "attention_forward: qkv ", qkv.str(), ", probs ",
                probs.str(), out.defined() ? ", out " + out.str() : std::string(), ": expected all f32 or all bf16");
    const int64_t gf = static_cast<int64_t>(group_floats(d, attn_group_bytes_));
    float* scores = static_cast<float*>(workspace.raw_data());
    auto* dropped = drop.on ? reinterpret_cast<kernels::bf16*>(scores + gf) : nullptr;
    auto* qkv_h = static_cast<kernels::bf16*>(qkv.raw_data());
    auto* probs_h = static_cast<kernels::bf16*>(probs.raw_data());
    for (int64_t b0 = 0; b0 < d.b; b0 += G) {
      const int64_t nb = std::min(G, d.b - b0);
      kernels::bf16* x = qkv_h + b0 * T * 3 * C;
      kernels::bf16* pr = probs_h + b0 * H * TT;
      const HeadBuf q{x, true, 3 * C, T * 3 * C, hs}, k{x + C, true, 3 * C, T * 3 * C, hs},
          v{x + 2 * C, true, 3 * C, T * 3 * C, hs};
      const HeadBuf s{scores, false, T, H * TT, TT};
      head_gemm_mixed(g, false, true, T, T, hs, scale, q, k, s, nb, H);  // S = Q K^T / sqrt(hs), fp32
      kernels::attention_softmax_forward_bf16(scores, pr, dropped, nb * H * T, T, b0 * H * T, p.causal, drop, stream_);
      if (!want_out) continue;
      const HeadBuf o{static_cast<kernels::bf16*>(out.raw_data()) + b0 * T * C, true, C, T * C, hs};
      const HeadBuf pd{drop.on ? dropped : pr, true, T, H * TT, TT};
      head_gemm_mixed(g, false, false, T, hs, T, 1.0f, pd, v, o, nb, H);  // out = Pd V
    }
    return;
  }
  float* dropped = drop.on ? workspace.f32() : nullptr;

  for (int64_t b0 = 0; b0 < d.b; b0 += G) {
    const int64_t nb = std::min(G, d.b - b0);
    const float* x = qkv.f32() + b0 * T * 3 * C;
    float* pr = probs.f32() + b0 * H * TT;
    const HeadMatrix q{x, 3 * C, T * 3 * C, hs}, k{x + C, 3 * C, T * 3 * C, hs}, v{x + 2 * C, 3 * C, T * 3 * C, hs};
    const HeadOutput s{pr, T, H * TT, TT};
    head_gemm(g, false, true, T, T, hs, scale, q, k, s, nb, H);  // S = Q K^T / sqrt(hs)
    kernels::attention_softmax_forward(pr, dropped, nb * H * T, T, b0 * H * T, p.causal, drop, stream_);
    if (!want_out) continue;
    const HeadOutput o{out.f32() + b0 * T * C, C, T * C, hs};
    const HeadMatrix pd{drop.on ? dropped : pr, T, H * TT, TT};
    head_gemm(g, false, false, T, hs, T, 1.0f, pd, v, o, nb, H);  // out = Pd V
  }
}

void CudaBackend::attention_backward_impl(const Tensor& dout, const Tensor& qkv, const Tensor& probs,
                                          const AttentionParams& p, RngState rng, const Tensor& dqkv,
                                          const Tensor& workspace) {
  const AttnDims d = attn_dims(qkv.shape(), p, "cuBLAS");
  if (d.b == 0 || d.t == 0) return;
  const int64_t T = d.t, C = d.c, H = d.h, hs = d.hs, TT = T * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const kernels::AttentionDropout drop = dropout_args(p, rng);
  const int64_t G = group_batch(d, attn_group_bytes_);
  const HeadGemm g{cublas_, stream_, scratch_, tf32_};
  if (!all_f32({&dout, &qkv, &probs, &dqkv})) {
    REMAT_CHECK(bf16_mode() && all_bf16({&dout, &qkv, &probs, &dqkv}), "attention_backward: qkv ", qkv.str(), ", dqkv ",
                dqkv.str(), ", dout ", dout.str(), ", probs ", probs.str(), ": expected all f32 or all bf16");
    const int64_t gf = static_cast<int64_t>(group_floats(d, attn_group_bytes_));
    float* dpd = static_cast<float*>(workspace.raw_data());  // [G, H, T, T] fp32
    auto* dsh = reinterpret_cast<kernels::bf16*>(dpd + gf);  // [G, H, T, T] bf16
    kernels::bf16* dropped = drop.on ? dsh + gf : nullptr;   // [G, H, T, T] bf16
    for (int64_t b0 = 0; b0 < d.b; b0 += G) {
      const int64_t nb = std::min(G, d.b - b0);
      kernels::bf16* x = static_cast<kernels::bf16*>(qkv.raw_data()) + b0 * T * 3 * C;
      kernels::bf16* dx = static_cast<kernels::bf16*>(dqkv.raw_data()) + b0 * T * 3 * C;
      kernels::bf16* pr = static_cast<kernels::bf16*>(probs.raw_data()) + b0 * H * TT;
      const HeadBuf q{x, true, 3 * C, T * 3 * C, hs}, k{x + C, true, 3 * C, T * 3 * C, hs},
          v{x + 2 * C, true, 3 * C, T * 3 * C, hs};
      const HeadBuf dq{dx, true, 3 * C, T * 3 * C, hs}, dk{dx + C, true, 3 * C, T * 3 * C, hs},
          dv{dx + 2 * C, true, 3 * C, T * 3 * C, hs};
      const HeadBuf go{static_cast<kernels::bf16*>(dout.raw_data()) + b0 * T * C, true, C, T * C, hs};
      const HeadBuf dpd_m{dpd, false, T, H * TT, TT}, ds_m{dsh, true, T, H * TT, TT};
      const HeadBuf pd{drop.on ? dropped : pr, true, T, H * TT, TT};
      head_gemm_mixed(g, false, true, T, T, hs, 1.0f, go, v, dpd_m, nb, H);  // dPd = dO V^T (fp32)
      kernels::attention_softmax_backward_bf16(dpd, pr, dropped, dsh, nb * H * T, T, b0 * H * T, p.causal, drop,
                                               stream_);
      head_gemm_mixed(g, true, false, T, hs, T, 1.0f, pd, go, dv, nb, H);     // dV = Pd^T dO
      head_gemm_mixed(g, false, false, T, hs, T, scale, ds_m, k, dq, nb, H);  // dQ = dS K / sqrt(hs)
      head_gemm_mixed(g, true, false, T, hs, T, scale, ds_m, q, dk, nb, H);   // dK = dS^T Q / sqrt(hs)
    }
    return;
  }
  float* ds = workspace.f32();  // [G, H, T, T]: dPd, then dS
  float* dropped = drop.on ? ds + static_cast<int64_t>(group_floats(d, attn_group_bytes_)) : nullptr;  // [G, H, T, T]

  for (int64_t b0 = 0; b0 < d.b; b0 += G) {
    const int64_t nb = std::min(G, d.b - b0);
    const float* x = qkv.f32() + b0 * T * 3 * C;
    float* dx = dqkv.f32() + b0 * T * 3 * C;
    const float* pr = probs.f32() + b0 * H * TT;
    const HeadMatrix q{x, 3 * C, T * 3 * C, hs}, k{x + C, 3 * C, T * 3 * C, hs}, v{x + 2 * C, 3 * C, T * 3 * C, hs};
    const HeadOutput dq{dx, 3 * C, T * 3 * C, hs}, dk{dx + C, 3 * C, T * 3 * C, hs},
        dv{dx + 2 * C, 3 * C, T * 3 * C, hs};
    const HeadMatrix go{dout.f32() + b0 * T * C, C, T * C, hs};
    const HeadOutput dpd{ds, T, H * TT, TT};
    const HeadMatrix dsm{ds, T, H * TT, TT};
    const HeadMatrix pd{drop.on ? dropped : pr, T, H * TT, TT};
    head_gemm(g, false, true, T, T, hs, 1.0f, go, v, dpd, nb, H);  // dPd = dO V^T
    kernels::attention_softmax_backward(ds, pr, dropped, nb * H * T, T, b0 * H * T, p.causal, drop, stream_);
    head_gemm(g, true, false, T, hs, T, 1.0f, pd, go, dv, nb, H);    // dV = Pd^T dO
    head_gemm(g, false, false, T, hs, T, scale, dsm, k, dq, nb, H);  // dQ = dS K / sqrt(hs)
    head_gemm(g, true, false, T, hs, T, scale, dsm, q, dk, nb, H);   // dK = dS^T Q / sqrt(hs)
  }
}

void CudaBackend::permute_0213_impl(const Tensor& x, const Tensor& y) {
  // x and y have one dtype (the validator's rule, for every backend): a copy of its bytes.
  kernels::permute_0213(x.raw_data(), x.size(0), x.size(1), x.size(2), x.size(3), dtype_size(x.dtype()), y.raw_data(),
                        stream_);
}

REMAT_KERNELS_ABI_END
}  // namespace remat
