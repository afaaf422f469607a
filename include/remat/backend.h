// The backend interface: one set of ops, forward and backward, implemented for cpu
// (the reference), meta (no data) and cuda. The ops themselves are listed once, with
// their shapes, formulas and aliasing rules, in remat/backend_ops.def; this header turns
// that list into Backend's methods.
//
// - The public methods validate shapes, dtypes and devices, throwing remat::Error that
//   names the op and the shapes (src/backends/validate/<family>.cpp), then call enter_op() and the
//   backend's *_impl.
// - The caller allocates every output, and the workspace an op asks for through its
//   *_workspace query; ops never allocate. That keeps the allocation sequence in one
//   place (remat/ops.h and the executor), so the meta backend accounts exactly what a
//   real backend holds.
// - Backward writes (=) the gradient of an op's *inputs* (dx) and accumulates (+=) into
//   the gradient of its *parameters* (dw, db, dgamma, dtable): parameters may be shared,
//   and the executor zeroes parameter gradients once per step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "remat/memory.h"
#include "remat/rng.h"
#include "remat/rope.h"
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

// Max pooling saves, per output, the offset of its maximum within the window in one byte
// (u8), so a max pool window holds at most this many positions (kernel_h * kernel_w).
constexpr int64_t kMaxPoolWindow = 256;

struct BatchNormParams {
  float momentum = 0.1f;  // running = (1 - momentum) * running + momentum * batch
  float eps = 1e-5f;
};

// Layer and RMS normalisation over the last dimension (eps inside the square root).
struct LayerNormParams {
  float eps = 1e-5f;  // PyTorch's nn.LayerNorm
};
struct RmsNormParams {
  float eps = 1e-6f;  // LLaMA's RMSNorm
};

struct RopeParams {
  int heads = 1;           // heads per token in x (d = x's last size / heads, even)
  int rotated = 1;         // the first `rotated` heads turn (q's and k's), the rest are copied
  double theta = 10000.0;  // the angle base: channel pair i turns by t * theta^(-2i/d)
  RopeScaling scaling;     // long-context frequency scaling (remat/rope.h); none by default
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

// The fused attention (flash_attention_*): query head n < n_head reads the columns
// [q_col + n head_dim, q_col + (n + 1) head_dim) of xq [B, tq, Wq]; key/value head g <
// kv_heads() reads [k_col + g head_dim, ...) and [v_col + g head_dim, ...) of xkv [B, tk,
// Wkv]; query head n attends with key/value head n / (n_head / kv_heads()) (grouped-query
// attention). The operands tile their tensors exactly: xq holds the q columns alone and xkv
// the k and v columns, or xq and xkv are one tensor [q | k | v] (packed self-attention).
struct FlashAttentionParams {
  int n_head = 1;
  int n_kv_head = 0;     // 0: n_head (one key/value head per query head)
  int64_t head_dim = 0;  // 1 .. 256
  bool causal = true;    // query i sees keys j <= i (tq == tk)
  float dropout = 0.0f;  // on the probabilities
  int64_t q_col = 0, k_col = 0, v_col = 0;
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  // As AttentionParams::applies_dropout: a keep probability that rounds to 1 keeps all.
  bool applies_dropout() const { return 1.0f - dropout < 1.0f; }
  // Packed self-attention over [B, T, (n_head + 2 kv_heads) head_dim]: q, then k, then v.
  static FlashAttentionParams packed(int n_head, int n_kv_head, int64_t head_dim, bool causal, float dropout) {
    FlashAttentionParams p;
    p.n_head = n_head;
    p.n_kv_head = n_kv_head;
    p.head_dim = head_dim;
    p.causal = causal;
    p.dropout = dropout;
    p.k_col = n_head * head_dim;
    p.v_col = p.k_col + p.kv_heads() * head_dim;
    return p;
  }
  // Cross-attention: q [B, tq, n_head head_dim] alone, kv [B, tk, 2 kv_heads head_dim] (k, then v).
  static FlashAttentionParams cross(int n_head, int n_kv_head, int64_t head_dim, float dropout) {
    FlashAttentionParams p = packed(n_head, n_kv_head, head_dim, false, dropout);
    p.k_col = 0;
    p.v_col = p.kv_heads() * head_dim;
    return p;
  }
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

class BackendTuning;  // remat/backend_tuning.h

class Backend {
 public:
  Backend();
  virtual ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;

  // The ops of remat/backend_ops.def, e.g.
  //   void gemm(const Tensor& a, const Tensor& b, const Tensor& c, const GemmParams& p);
  // (where each one's validator and implementations live: the index at the end of the op list).
#define REMAT_OP(kind, R, name, params, args) R name params;
#include "remat/backend_ops.def"
#undef REMAT_OP

  // ---- Running ops ---------------------------------------------------------------------
  // Waits until every op enqueued so far has finished (a no-op where ops run
  // synchronously).
  virtual void synchronize() {}
  // The queue the ops run on, for a library that enqueues beside them (NCCL's
  // collectives): the cudaStream_t of a CUDA device; nullptr where ops run synchronously.
  virtual void* native_stream() const { return nullptr; }
  // Whether the ops compute on bf16 storage (training.precision bf16: bf16 activations and
  // working weights, fp32 math; docs/memory.md "Mixed precision"). Which layers do is the
  // graph's question (Layer::runs_in_bf16).
  virtual bool supports_bf16() const { return false; }

  // ---- Activation offload (docs/checkpointing.md, "Offload") ----------------------------
  // Empty where the backend can keep activations in pinned host memory between forward and
  // backward; else why it cannot (cpu: its memory is host memory already).
  virtual std::string offload_unsupported() const;
  // Raw page-locked host memory for an executor's host pool, taken from the system in
  // chunks of at least `chunk` bytes (one chunk when the plan's estimate holds), returned
  // when the allocator goes. Only the copies below read or write it.
  virtual std::unique_ptr<RawAllocator> make_pinned_allocator(size_t chunk);
  // Starts copying `src` into `dst` (the same byte count: one in this device's memory, the
  // other from make_pinned_allocator's) on a second stream, after every op enqueued so far;
  // returns the copy's ticket. Copies run in the order they were started.
  virtual uint64_t copy_async(const Tensor& dst, const Tensor& src);
  // The ops enqueued from now on run after copy `ticket` completed (the compute stream waits
  // for it; the host does not). Each ticket is waited for once.
  virtual void wait_copy(uint64_t ticket);

  // What benchmarks and tests turn and read besides the ops (remat/backend_tuning.h): the
  // device's clock, TF32 and attention's scratch groups, the emulator's traffic counters.
  // A backend without its own answers with a HostTuning (host clocks, no knobs).
  virtual BackendTuning& tuning();

 protected:
  // Called by every public op before its *_impl: a backend makes its device current here
  // (cuda:N), so no op can forget to.
  virtual void enter_op() {}

#define REMAT_OP(kind, R, name, params, args) virtual R name##_impl params = 0;
#include "remat/backend_ops.def"
#undef REMAT_OP

 private:
  std::unique_ptr<BackendTuning> host_tuning_;  // tuning()'s answer unless a backend has its own
};

// A backend declares its overrides of every op inside its class with
//   #define REMAT_OP(kind, R, name, params, args) R name##_impl params override;
//   #include "remat/backend_ops.def"
//   #undef REMAT_OP

// The backend for a device (cpu, meta, cuda:N, cuda-emu), created on first use from the
// device registry (remat/device_registry.h).
Backend& backend_for(Device d);
std::unique_ptr<Backend> make_cpu_backend();
// A meta backend whose workspace queries are those of `workspace_model` (default: cpu's).
std::unique_ptr<Backend> make_meta_backend(Backend* workspace_model = nullptr);

// Whether this program has a backend for the device type (registered in the device
// registry): cpu and meta always; cuda in a CUDA build; cuda-emu once
// register_cuda_emu_backend() ran (defined in remat_cuda_emu, which the remat command and
// the tests call at startup).
bool backend_registered(DeviceType type);
void register_cuda_emu_backend();

}  // namespace remat
