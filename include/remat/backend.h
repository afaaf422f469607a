// The backend interface: one set of ops, forward and backward, implemented for cpu
// (the reference), meta (no data) and cuda.
//
// Conventions, for every op:
// - All tensors are contiguous, row-major, f32 unless noted (ids, targets and pooling
//   indices are i32). Images are NCHW. Layouts and formulas follow PyTorch.
// - The caller allocates every output, and the workspace an op asks for through its
//   *_workspace query; ops never allocate. That keeps the allocation sequence in one
//   place (remat/ops.h and the executor), so the meta backend accounts exactly what a
//   real backend holds.
// - Backward writes (=) the gradient of an op's *inputs* (dx) and accumulates (+=) into
//   the gradient of its *parameters* (dw, db, dgamma, dtable): parameters may be shared,
//   and the executor zeroes parameter gradients once per step. An undefined Tensor for an
//   optional gradient means "not needed".
// - Random ops take the RngState reserved for them; element i of their output uses
//   Philox word offset + i (kernels/philox.cuh), so backward and recompute regenerate the
//   same mask from the state instead of storing it.
// - The public methods validate shapes, dtypes and devices, throwing remat::Error that
//   names the op and the shapes, then call the backend's *_impl.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "remat/rng.h"
#include "remat/tensor.h"

namespace remat {

struct GemmParams {
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  float beta = 0.0f;
};

struct Conv2dParams {
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;
  int dilation_h = 1, dilation_w = 1;
  int groups = 1;
};

struct Pool2dParams {
  int kernel_h = 2, kernel_w = 2;
  int stride_h = 2, stride_w = 2;
  int pad_h = 0, pad_w = 0;
  // avg pooling divides by kernel_h * kernel_w including padding (PyTorch's default,
  // count_include_pad=True).
};

struct BatchNormParams {
  float momentum = 0.1f;  // running = (1 - momentum) * running + momentum * batch
  float eps = 1e-5f;
};

enum class GeluApprox { none, tanh };  // exact erf form, or PyTorch's approximate="tanh"

struct AttentionParams {
  int n_head = 1;
  bool causal = true;
  float dropout = 0.0f;  // on the attention probabilities
  // Dropout is applied when it can drop something: a keep probability that rounds to 1
  // in float keeps everything (philox::keep's rule), so it is no dropout at all. Every
  // backend sizes its workspace and regenerates masks by this one rule.
  bool applies_dropout() const { return 1.0f - dropout < 1.0f; }
};

// Optimizer hyperparameters are doubles, like the Python floats torch.optim computes its
// coefficients (1 - beta, lr * weight_decay, ...) from before applying them in fp32.
struct SgdParams {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

struct AdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

// Output shapes, shared by every backend and the ops wrappers.
Shape conv2d_output_shape(const Shape& x, const Shape& w, const Conv2dParams& p);
Shape pool2d_output_shape(const Shape& x, const Pool2dParams& p);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;

  // ---- GEMM and linear ---------------------------------------------------------------
  // c = alpha * op(a) @ op(b) + beta * c over matrices in the last two dims; leading dims
  // are a batch (equal in a, b and c, or b 2-D and shared by the whole batch).
  void gemm(const Tensor& a, const Tensor& b, const Tensor& c, const GemmParams& p);
  // x [..., in], w [out, in], b [out] or undefined, y [..., out].
  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y);
  // dx = dy @ w (if defined); dw += dy^T @ x; db += sum(dy) (if defined).
  void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx, const Tensor& dw,
                       const Tensor& db);

  // ---- Elementwise -------------------------------------------------------------------
  void add(const Tensor& a, const Tensor& b, const Tensor& y);       // y = a + b
  void accumulate(const Tensor& dst, const Tensor& src);             // dst += src
  void scale(const Tensor& x, float alpha, const Tensor& y);         // y = alpha * x (y may be x)
  void relu_forward(const Tensor& x, const Tensor& y);
  void relu_backward(const Tensor& dy, const Tensor& x, const Tensor& dx);
  void gelu_forward(const Tensor& x, GeluApprox approx, const Tensor& y);
  void gelu_backward(const Tensor& dy, const Tensor& x, GeluApprox approx, const Tensor& dx);
  // Inverted dropout: y = x * keep / (1 - p); p = 1 gives zeros.
  void dropout_forward(const Tensor& x, float p, RngState rng, const Tensor& y);
  void dropout_backward(const Tensor& dy, float p, RngState rng, const Tensor& dx);

  // ---- Softmax and losses (over the last dimension) -----------------------------------
  void softmax_forward(const Tensor& x, bool log, const Tensor& y);
  void softmax_backward(const Tensor& dy, const Tensor& y, bool log, const Tensor& dx);
  // logits [N, V], targets i32 [N]; loss [1] = mean over non-ignored rows of
  // logsumexp(row) - row[target]; lse [N] saved for backward. All rows ignored gives NaN
  // (as PyTorch).
  void cross_entropy_forward(const Tensor& logits, const Tensor& targets, int ignore_index, const Tensor& loss,
                             const Tensor& lse);
  // dlogits = dloss * (softmax(logits) - onehot(target)) / count (0 for ignored rows).
  void cross_entropy_backward(float dloss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int ignore_index, const Tensor& dlogits);
  // Number of non-ignored rows whose argmax (first maximum) equals the target; and that
  // row count in *counted.
  int64_t accuracy(const Tensor& logits, const Tensor& targets, int ignore_index, int64_t* counted);

  // ---- Convolution and pooling (NCHW) -------------------------------------------------
  // x [N, C, H, W], w [K, C / groups, R, S], b [K] or undefined, y [N, K, P, Q].
  size_t conv2d_forward_workspace(const Shape& x, const Shape& w, const Conv2dParams& p);
  void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p, const Tensor& y,
                      const Tensor& workspace);
  size_t conv2d_backward_workspace(const Shape& x, const Shape& w, const Conv2dParams& p);
  void conv2d_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Conv2dParams& p, const Tensor& dx,
                       const Tensor& dw, const Tensor& db, const Tensor& workspace);
  // indices i32, same shape as y: the flat h * W + w position of each maximum in its plane.
  void maxpool2d_forward(const Tensor& x, const Pool2dParams& p, const Tensor& y, const Tensor& indices);
  void maxpool2d_backward(const Tensor& dy, const Tensor& indices, const Tensor& dx);
  void avgpool2d_forward(const Tensor& x, const Pool2dParams& p, const Tensor& y);
  void avgpool2d_backward(const Tensor& dy, const Pool2dParams& p, const Tensor& dx);
  // x [N, C, H, W] -> y [N, C]
  void global_avgpool_forward(const Tensor& x, const Tensor& y);
  void global_avgpool_backward(const Tensor& dy, const Tensor& dx);

  // ---- Normalisation -------------------------------------------------------------------
  // Training mode: batch statistics over (N, H, W); save_mean, save_invstd [C] for backward;
  // when update_running, running_mean/var [C] move by momentum (running_var with the
  // unbiased batch variance, as PyTorch). Recompute passes update_running = false.
  void batchnorm2d_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                 const Tensor& running_mean, const Tensor& running_var, const BatchNormParams& p,
                                 bool update_running, const Tensor& y, const Tensor& save_mean,
                                 const Tensor& save_invstd);
  void batchnorm2d_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                                const Tensor& running_var, const BatchNormParams& p, const Tensor& y);
  void batchnorm2d_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& save_mean,
                            const Tensor& save_invstd, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta);
  // x [..., C] normalised over C; mean, rstd [N] with N the product of leading dims.
  void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, const Tensor& y,
                         const Tensor& mean, const Tensor& rstd);
  void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                          const Tensor& rstd, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta);

  // ---- Transformer pieces -------------------------------------------------------------
  // ids i32 [B, T], table [V, C], y [B, T, C] = table[ids]; plus pos_table[t] (pos_table
  // [Tmax >= T, C]) when pos_table is defined. Out-of-range ids are an error.
  void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& pos_table, const Tensor& y);
  void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dtable, const Tensor& dpos_table);
  // qkv [B, T, 3C] (q, k, v concatenated on the last dim, heads of size C / n_head),
  // out [B, T, C], probs [B, H, T, T] = softmax(q k^T / sqrt(hs)) saved for backward
  // (before dropout; the dropout mask is regenerated from rng). With out undefined, only
  // probs are computed (no dropout, no P V): recompute rebuilds them when out is kept.
  size_t attention_forward_workspace(const Shape& qkv, const AttentionParams& p);
  void attention_forward(const Tensor& qkv, const AttentionParams& p, RngState rng, const Tensor& out,
                         const Tensor& probs, const Tensor& workspace);
  size_t attention_backward_workspace(const Shape& qkv, const AttentionParams& p);
  void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& probs, const AttentionParams& p,
                          RngState rng, const Tensor& dqkv, const Tensor& workspace);
  // x [A, B, C, D] -> y [A, C, B, D] (split/merge heads); its own inverse.
  void permute_0213(const Tensor& x, const Tensor& y);

  // ---- Optimizers (PyTorch's formulas); step counts from 1 -----------------------------
  void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& p,
                int64_t step);
  void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                  const AdamWParams& p, int64_t step);
  // sqrt of the sum of squares of every element of every tensor, summed in double in a
  // fixed order.
  double global_norm(const std::vector<Tensor>& tensors);

 protected:
  virtual void gemm_impl(const Tensor& a, const Tensor& b, const Tensor& c, const GemmParams& p) = 0;
  virtual void linear_forward_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) = 0;
  virtual void linear_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx,
                                    const Tensor& dw, const Tensor& db) = 0;
  virtual void add_impl(const Tensor& a, const Tensor& b, const Tensor& y) = 0;
  virtual void accumulate_impl(const Tensor& dst, const Tensor& src) = 0;
  virtual void scale_impl(const Tensor& x, float alpha, const Tensor& y) = 0;
  virtual void relu_forward_impl(const Tensor& x, const Tensor& y) = 0;
  virtual void relu_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& dx) = 0;
  virtual void gelu_forward_impl(const Tensor& x, GeluApprox approx, const Tensor& y) = 0;
  virtual void gelu_backward_impl(const Tensor& dy, const Tensor& x, GeluApprox approx, const Tensor& dx) = 0;
  virtual void dropout_forward_impl(const Tensor& x, float p, RngState rng, const Tensor& y) = 0;
  virtual void dropout_backward_impl(const Tensor& dy, float p, RngState rng, const Tensor& dx) = 0;
  virtual void softmax_forward_impl(const Tensor& x, bool log, const Tensor& y) = 0;
  virtual void softmax_backward_impl(const Tensor& dy, const Tensor& y, bool log, const Tensor& dx) = 0;
  virtual void cross_entropy_forward_impl(const Tensor& logits, const Tensor& targets, int ignore_index,
                                          const Tensor& loss, const Tensor& lse) = 0;
  virtual void cross_entropy_backward_impl(float dloss, const Tensor& logits, const Tensor& targets,
                                           const Tensor& lse, int ignore_index, const Tensor& dlogits) = 0;
  virtual int64_t accuracy_impl(const Tensor& logits, const Tensor& targets, int ignore_index,
                                int64_t* counted) = 0;
  virtual size_t conv2d_forward_workspace_impl(const Shape& x, const Shape& w, const Conv2dParams& p) = 0;
  virtual void conv2d_forward_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p,
                                   const Tensor& y, const Tensor& workspace) = 0;
  virtual size_t conv2d_backward_workspace_impl(const Shape& x, const Shape& w, const Conv2dParams& p) = 0;
  virtual void conv2d_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, const Conv2dParams& p,
                                    const Tensor& dx, const Tensor& dw, const Tensor& db,
                                    const Tensor& workspace) = 0;
  virtual void maxpool2d_forward_impl(const Tensor& x, const Pool2dParams& p, const Tensor& y,
                                      const Tensor& indices) = 0;
  virtual void maxpool2d_backward_impl(const Tensor& dy, const Tensor& indices, const Tensor& dx) = 0;
  virtual void avgpool2d_forward_impl(const Tensor& x, const Pool2dParams& p, const Tensor& y) = 0;
  virtual void avgpool2d_backward_impl(const Tensor& dy, const Pool2dParams& p, const Tensor& dx) = 0;
  virtual void global_avgpool_forward_impl(const Tensor& x, const Tensor& y) = 0;
  virtual void global_avgpool_backward_impl(const Tensor& dy, const Tensor& dx) = 0;
  virtual void batchnorm2d_forward_train_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                              const Tensor& running_mean, const Tensor& running_var,
                                              const BatchNormParams& p, bool update_running, const Tensor& y,
                                              const Tensor& save_mean, const Tensor& save_invstd) = 0;
  virtual void batchnorm2d_forward_eval_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                             const Tensor& running_mean, const Tensor& running_var,
                                             const BatchNormParams& p, const Tensor& y) = 0;
  virtual void batchnorm2d_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                         const Tensor& save_mean, const Tensor& save_invstd, const Tensor& dx,
                                         const Tensor& dgamma, const Tensor& dbeta) = 0;
  virtual void layernorm_forward_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                                      const Tensor& y, const Tensor& mean, const Tensor& rstd) = 0;
  virtual void layernorm_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                       const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                                       const Tensor& dbeta) = 0;
  virtual void embedding_forward_impl(const Tensor& ids, const Tensor& table, const Tensor& pos_table,
                                      const Tensor& y) = 0;
  virtual void embedding_backward_impl(const Tensor& dy, const Tensor& ids, const Tensor& dtable,
                                       const Tensor& dpos_table) = 0;
  virtual size_t attention_forward_workspace_impl(const Shape& qkv, const AttentionParams& p) = 0;
  virtual void attention_forward_impl(const Tensor& qkv, const AttentionParams& p, RngState rng, const Tensor& out,
                                      const Tensor& probs, const Tensor& workspace) = 0;
  virtual size_t attention_backward_workspace_impl(const Shape& qkv, const AttentionParams& p) = 0;
  virtual void attention_backward_impl(const Tensor& dout, const Tensor& qkv, const Tensor& probs,
                                       const AttentionParams& p, RngState rng, const Tensor& dqkv,
                                       const Tensor& workspace) = 0;
  virtual void permute_0213_impl(const Tensor& x, const Tensor& y) = 0;
  virtual void sgd_step_impl(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                             const SgdParams& p, int64_t step) = 0;
  virtual void adamw_step_impl(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                               const Tensor& exp_avg_sq, const AdamWParams& p, int64_t step) = 0;
  virtual double global_norm_impl(const std::vector<Tensor>& tensors) = 0;
};

// The backend for a device (cpu, meta, cuda:N, cuda-emu), created on first use.
Backend& backend_for(Device d);
std::unique_ptr<Backend> make_cpu_backend();
// A meta backend whose workspace queries are those of `workspace_model` (default: cpu's).
std::unique_ptr<Backend> make_meta_backend(Backend* workspace_model = nullptr);
#ifdef REMAT_WITH_CUDA
std::unique_ptr<Backend> make_cuda_backend(int device);  // src/backends/cuda
#endif

// Backends that live outside the core library register a factory for their device type
// before first use: the emulated CUDA backend (library remat_cuda_emu) through
// register_cuda_emu_backend(), which the remat command and the tests call at startup.
using BackendFactory = std::unique_ptr<Backend> (*)(Device);
void register_backend_factory(DeviceType type, BackendFactory factory);
bool backend_registered(DeviceType type);
void register_cuda_emu_backend();  // defined in remat_cuda_emu

}  // namespace remat
