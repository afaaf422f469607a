// The CUDA backend's device, stream and handles; GEMM and linear layers through cuBLAS.
#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "backends/cuda/cuda_device.h"
#include "backends/cuda/gemm.h"
#include "kernels/bias.cuh"
#include "kernels/gemm.cuh"
#include "remat/cuda_check.h"
#include "remat/device_registry.h"
#include "remat/error.h"
#include "remat/memory.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

namespace {

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

int to_int(int64_t v, const char* what) {
  REMAT_CHECK(v <= std::numeric_limits<int>::max(), "GEMM ", what, " = ", v, " exceeds cuBLAS's 32-bit sizes");
  return static_cast<int>(v);
}

cublasOperation_t op_of(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

// Contiguous row-major matrices, batched with element strides; any of them may be bf16
// (gemm_strided_mixed's combinations).
void gemm_rowmajor(cublasHandle_t h, const char* op, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                   const Tensor& a, int64_t stride_a, const Tensor& b, int64_t stride_b, float beta, const Tensor& c,
                   int64_t stride_c, int64_t batch) {
  const int64_t k1 = std::max<int64_t>(k, 1);
  gemm_strided_mixed(h, op, GemmSize{m, n, k, batch}, alpha, GemmOperand{fbuf(a), ta ? m : k1, stride_a, ta},
                     GemmOperand{fbuf(b), tb ? k1 : n, stride_b, tb}, beta, matrix(fbuf(c), n, stride_c));
}

}  // namespace

void gemm_strided(cublasHandle_t h, const GemmSize& size, float alpha, const GemmOperand& a, const GemmOperand& b,
                  float beta, const GemmOperand& c) {
  REMAT_CHECK(!a.buf.bf16 && !b.buf.bf16 && !c.buf.bf16, "gemm_strided: a bf16 operand (gemm_strided_mixed takes it)");
  if (size.m == 0 || size.n == 0 || size.batch == 0) return;
  const int M = to_int(size.m, "m"), N = to_int(size.n, "n"), K = to_int(size.k, "k");
  const int LDA = to_int(a.ld, "lda"), LDB = to_int(b.ld, "ldb"), LDC = to_int(c.ld, "ldc");
  const auto* pa = static_cast<const float*>(a.buf.p);
  const auto* pb = static_cast<const float*>(b.buf.p);
  auto* pc = static_cast<float*>(c.buf.p);
  if (size.batch == 1) {
    REMAT_CUBLAS_CHECK(
        cublasSgemm(h, op_of(b.trans), op_of(a.trans), N, M, K, &alpha, pb, LDB, pa, LDA, &beta, pc, LDC));
  } else {
    REMAT_CUBLAS_CHECK(cublasSgemmStridedBatched(h, op_of(b.trans), op_of(a.trans), N, M, K, &alpha, pb, LDB, b.stride,
                                                 pa, LDA, a.stride, &beta, pc, LDC, c.stride,
                                                 to_int(size.batch, "batch")));
  }
}

void gemm_strided_mixed(cublasHandle_t h, const char* op, const GemmSize& size, float alpha, const GemmOperand& a,
                        const GemmOperand& b, float beta, const GemmOperand& c) {
  if (!a.buf.bf16 && !b.buf.bf16 && !c.buf.bf16) {
    gemm_strided(h, size, alpha, a, b, beta, c);
    return;
  }
  if (a.buf.bf16 != b.buf.bf16 || !a.buf.bf16) {  // f32 by bf16, or f32 factors into a bf16 c: no cuBLAS kernel
    (void)op;
    cudaStream_t stream = nullptr;
    REMAT_CUBLAS_CHECK(cublasGetStream(h, &stream));
    kernels::gemm_fma(a.trans, b.trans, size.m, size.n, size.k, alpha, a.buf, a.ld, a.stride, b.buf, b.ld, b.stride,
                      beta, c.buf, c.ld, c.stride, size.batch, stream);
    return;
  }
  if (size.m == 0 || size.n == 0 || size.batch == 0) return;
  const int M = to_int(size.m, "m"), N = to_int(size.n, "n"), K = to_int(size.k, "k");
  const int LDA = to_int(a.ld, "lda"), LDB = to_int(b.ld, "ldb"), LDC = to_int(c.ld, "ldc");
  const cublasOperation_t op_a = op_of(a.trans), op_b = op_of(b.trans);
  const cudaDataType ct = c.buf.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  if (size.batch == 1) {
    REMAT_CUBLAS_CHECK(cublasGemmEx(h, op_b, op_a, N, M, K, &alpha, b.buf.p, CUDA_R_16BF, LDB, a.buf.p, CUDA_R_16BF,
                                    LDA, &beta, c.buf.p, ct, LDC, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  } else {
    REMAT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        h, op_b, op_a, N, M, K, &alpha, b.buf.p, CUDA_R_16BF, LDB, b.stride, a.buf.p, CUDA_R_16BF, LDA, a.stride, &beta,
        c.buf.p, ct, LDC, c.stride, to_int(size.batch, "batch"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

void gemm_batched(cublasHandle_t h, const GemmSize& size, float alpha, const GemmPointers& a, const GemmPointers& b,
                  float beta, const GemmPointers& c) {
  REMAT_CHECK(a.bf16 == b.bf16, "gemm_batched: an f32 factor by a bf16 one (no cuBLAS kernel)");
  if (size.m == 0 || size.n == 0 || size.batch == 0) return;
  const int M = to_int(size.m, "m"), N = to_int(size.n, "n"), K = to_int(size.k, "k");
  const int LDA = to_int(a.ld, "lda"), LDB = to_int(b.ld, "ldb"), LDC = to_int(c.ld, "ldc");
  const int count = to_int(size.batch, "batch");
  const cublasOperation_t op_a = op_of(a.trans), op_b = op_of(b.trans);
  if (!a.bf16) {
    REMAT_CHECK(!c.bf16, "gemm_batched: f32 factors into a bf16 c (no cuBLAS kernel)");
    REMAT_CUBLAS_CHECK(cublasSgemmBatched(h, op_b, op_a, N, M, K, &alpha, reinterpret_cast<const float* const*>(b.ptrs),
                                          LDB, reinterpret_cast<const float* const*>(a.ptrs), LDA, &beta,
                                          reinterpret_cast<float* const*>(c.ptrs), LDC, count));
    return;
  }
  REMAT_CUBLAS_CHECK(cublasGemmBatchedEx(h, op_b, op_a, N, M, K, &alpha, b.ptrs, CUDA_R_16BF, LDB, a.ptrs, CUDA_R_16BF,
                                         LDA, &beta, c.ptrs, c.bf16 ? CUDA_R_16BF : CUDA_R_32F, LDC, count,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

CudaBackend::CudaBackend(Device device) : device_(device) {
  REMAT_CHECK(device.is_cuda() || device.is_cuda_emu(), "CudaBackend on ", device.str());
  activate();
  // Every op, copy and fill runs on this stream (cuda_memory.cpp too). It stays a blocking
  // stream (ordered with the legacy default stream) only as a safety net for code outside
  // remat that uses the default stream; nothing of remat's relies on it.
  REMAT_CUDA_CHECK(cudaStreamCreate(&stream_));
  REMAT_CUBLAS_CHECK(cublasCreate(&cublas_));
  REMAT_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
  pedantic_ = env_flag("REMAT_CUBLAS_PEDANTIC");
  set_tf32(env_flag("REMAT_TF32"));
  REMAT_CUDA_CHECK(cudaMalloc(&scratch_, kScratchBytes));
}

CudaBackend::~CudaBackend() {
  activate();
  if (copy_stream_) cudaStreamDestroy(copy_stream_);  // completes its copies first
  for (auto& [ticket, c] : copies_) cudaEventDestroy(c.done);
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
  if (start_) cudaEventDestroy(start_);
  if (stop_) cudaEventDestroy(stop_);
  if (flush_) cudaFree(flush_);
  if (scratch_) cudaFree(scratch_);
  if (cublas_) cublasDestroy(cublas_);
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaBackend::activate() const {
  if (device_.is_cuda()) REMAT_CUDA_CHECK(cudaSetDevice(device_.index));
}

bool CudaBackend::set_tf32(bool on) {
  tf32_ = on;
  apply_math_mode();
  return true;
}

void CudaBackend::set_pedantic_math(bool on) {
  pedantic_ = on;
  apply_math_mode();
}

void CudaBackend::apply_math_mode() {
  // TF32 wins over pedantic: asking for TF32 is asking for tensor cores.
  const cublasMath_t mode = tf32_ ? CUBLAS_TF32_TENSOR_OP_MATH : pedantic_ ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH;
  REMAT_CUBLAS_CHECK(cublasSetMathMode(cublas_, mode));
}

void CudaBackend::synchronize() {
  activate();
  note_drain();
  REMAT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// On the emulator launches are synchronous and events would time the host anyway: the
// generic host-clock timer, no cache to flush, no device attributes.
#if defined(REMAT_EMULATE)
double CudaBackend::time_ms(const std::function<void()>& body) { return HostTuning(*this).time_ms(body); }
void CudaBackend::flush_caches() {}
BackendTuning::Properties CudaBackend::properties() const { return HostTuning::properties_of(*this); }
#else
double CudaBackend::time_ms(const std::function<void()>& body) {
  activate();
  if (!start_) {
    REMAT_CUDA_CHECK(cudaEventCreate(&start_));
    REMAT_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  REMAT_CUDA_CHECK(cudaEventRecord(start_, stream_));
  body();
  REMAT_CUDA_CHECK(cudaEventRecord(stop_, stream_));
  note_drain();
  REMAT_CUDA_CHECK(cudaEventSynchronize(stop_));
  float ms = 0;
  REMAT_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
  return ms;
}

void CudaBackend::flush_caches() {
  activate();
  if (!flush_) {
    int l2 = 0;
    REMAT_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device_.index));
    if (l2 <= 0) return;
    flush_bytes_ = 2 * static_cast<size_t>(l2);  // writing twice the L2 evicts whatever a run left there
    REMAT_CUDA_CHECK(cudaMalloc(&flush_, flush_bytes_));
  }
  REMAT_CUDA_CHECK(cudaMemsetAsync(flush_, ++flushes_ & 0xff, flush_bytes_, stream_));
}

BackendTuning::Properties CudaBackend::properties() const {
  Properties p = HostTuning::properties_of(*this);
  activate();
  cudaDeviceProp prop{};
  REMAT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_.index));
  p.name = prop.name;
  p.device_clock = true;
  int l2 = 0, clock_khz = 0, bus_bits = 0;
  REMAT_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device_.index));
  p.cache_bytes = l2 > 0 ? l2 : 0;
  // CUDA 13's cudaDeviceProp has no memory clock; the attribute still gives it.
  REMAT_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device_.index));
  REMAT_CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device_.index));
  if (clock_khz > 0 && bus_bits > 0) {
    p.memory_gbps = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
    p.gbps_source = "device: 2 x memory clock " + std::to_string(clock_khz) + " kHz (cudaDevAttrMemoryClockRate) x " +
                    std::to_string(bus_bits) + "-bit bus (cudaDevAttrGlobalMemoryBusWidth) / 8";
  } else {
    p.gbps_source = "device reports memory clock " + std::to_string(clock_khz) + " kHz, bus " +
                    std::to_string(bus_bits) + " bit: unknown";
  }
  return p;
}
#endif

void CudaBackend::copy_to_host(void* dst, const void* src, size_t bytes) const {
  REMAT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  note_drain();
  REMAT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::gemm_impl(const Tensor& a, const Tensor& b, const Tensor& c, const GemmParams& p) {
  const int64_t m = c.size(-2), n = c.size(-1);
  const int64_t k = p.trans_a ? a.size(-2) : a.size(-1);
  const int64_t batch = m * n == 0 ? 0 : c.numel() / (m * n);
  const bool shared_b = b.rank() == 2;
  gemm_rowmajor(cublas_, "gemm", p.trans_a, p.trans_b, m, n, k, p.alpha, a, m * k, b, shared_b ? 0 : k * n, p.beta, c,
                m * n, batch);
}

void CudaBackend::linear_forward_impl(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  const int64_t in = w.size(1), out = w.size(0), rows = in == 0 ? x.numel() : x.numel() / in;
  if (b.defined()) kernels::bias_broadcast(fbuf(b), rows, out, fbuf(y), stream_);
  gemm_rowmajor(cublas_, "linear_forward", false, true, rows, out, in, 1.0f, x, 0, w, 0, b.defined() ? 1.0f : 0.0f, y,
                0, 1);
}

void CudaBackend::linear_backward_impl(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx,
                                       const Tensor& dw, const Tensor& db) {
  const int64_t in = w.size(1), out = w.size(0), rows = dy.numel() / std::max<int64_t>(out, 1);
  if (dx.defined())
    gemm_rowmajor(cublas_, "linear_backward (dx)", false, false, rows, in, out, 1.0f, dy, 0, w, 0, 0.0f, dx, 0, 1);
  if (dw.defined())
    gemm_rowmajor(cublas_, "linear_backward (dw)", true, false, out, in, rows, 1.0f, dy, 0, x, 0, 1.0f, dw, 0, 1);
  // The chunk sums of the row split in scratch(): kScratchBytes holds 16 Ki floats, enough
  // for kColumnSumBlocks blocks at any width up to 16 Ki columns (wider ones have more
  // column blocks than that already): docs/kernels.md, "Bias gradients".
  if (db.defined())
    kernels::column_sums(fbuf(dy), rows, out, db.f32(), /*accumulate=*/true, static_cast<float*>(scratch_),
                         kScratchBytes, stream_);
}

#if defined(REMAT_EMULATE)
bool CudaBackend::count_traffic(bool on) {
  if (!emu::traffic_instrumented()) return false;
  emu::set_traffic_count(on);
  return true;
}

std::vector<BackendTuning::KernelTraffic> CudaBackend::take_traffic() {
  std::vector<KernelTraffic> out;
  for (const emu::KernelTraffic& t : emu::take_traffic()) {
    KernelTraffic k;
    k.kernel = t.kernel;
    k.launches = static_cast<int64_t>(t.launches);
    k.warp_accesses = static_cast<int64_t>(t.warp_accesses);
    k.requested_bytes = static_cast<int64_t>(t.requested_bytes);
    k.sectors = static_cast<int64_t>(t.sectors);
    k.worst_site = t.worst_site;
    k.worst_site_efficiency = t.worst_site_efficiency;
    out.push_back(std::move(k));
  }
  return out;
}
#endif

REMAT_KERNELS_ABI_END

#if defined(REMAT_EMULATE)
// The emulated GPU: the CUDA backend on the host emulator, its memory the emulator's
// cudaMalloc arena (as a GPU's, not addressable by host code), its copies and fills those
// of cuda_memory.cpp on the backend's stream. Registering twice is allowed (each test
// binary and the remat command call this at startup).
void register_cuda_emu_backend() {
  if (find_device_kind(DeviceType::cuda_emu)) return;
  DeviceKind k;
  k.type = DeviceType::cuda_emu;
  k.make_raw_allocator = &cuda_device::make_raw_allocator;
  k.make_backend = [](Device d) -> std::unique_ptr<Backend> { return std::make_unique<CudaBackend>(d); };
  k.copy = &cuda_device::copy;
  k.fill_f32 = &cuda_device::fill_f32;
  k.zero = &cuda_device::zero;
  k.summary = "the CUDA kernels on the host emulator: exact semantics, slow";
  register_device_kind(k);
}
#else
std::unique_ptr<Backend> cuda_device::make_backend(Device d) { return std::make_unique<CudaBackend>(d); }
#endif

}  // namespace remat
