// Raw CUDA memory for the caching allocator, and the copies and fills Tensor needs (on the
// device's backend stream). Built twice, like the backend: against CUDA for `cuda:N` and
// against the emulator for `cuda-emu`, whose memory is the emulator's cudaMalloc arena,
// which host code cannot touch (kernels/emu/device_memory.cpp).
#include <cuda_runtime.h>

#include <cstring>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_device.h"
#include "kernels/fill.cuh"
#include "remat/backend.h"
#include "remat/cuda_check.h"
#include "remat/error.h"
#include "remat/memory.h"
#include "remat/tensor.h"

namespace remat {
REMAT_KERNELS_ABI_BEGIN

namespace {

#if defined(REMAT_EMULATE)
constexpr DeviceType kGpu = DeviceType::cuda_emu;
#else
constexpr DeviceType kGpu = DeviceType::cuda;
#endif
bool on_gpu(Device d) { return d.type == kGpu; }

class CudaRawAllocator final : public RawAllocator {
 public:
  explicit CudaRawAllocator(int device) : device_(device) {
    REMAT_CUDA_CHECK(cudaSetDevice(device_));
    size_t free_bytes = 0, total = 0;
    REMAT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    capacity_ = static_cast<int64_t>(total);
  }
  void* allocate(size_t bytes) override {
    REMAT_CUDA_CHECK(cudaSetDevice(device_));
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      (void)cudaGetLastError();  // out of memory is not sticky; clear it
      return nullptr;
    }
    return p;
  }
  void deallocate(void* ptr, size_t) override {
    cudaSetDevice(device_);
    cudaFree(ptr);
  }
  int64_t capacity() const override { return capacity_; }
#if defined(REMAT_EMULATE)
  bool guards_each_allocation() const override { return true; }  // every cudaMalloc has its guard page
#endif

 private:
  int device_;
  int64_t capacity_ = 0;
};

// The stream of the device's backend: every copy and fill goes there, in order with the
// ops, never on the legacy default stream.
CudaBackend& backend_of(Device d) {
  auto* be = dynamic_cast<CudaBackend*>(&backend_for(d));
  REMAT_CHECK(be, "the backend of ", d.str(), " is not the CUDA backend");
  return *be;
}
cudaStream_t stream_of(Device d) { return backend_of(d).stream(); }

}  // namespace

// ---- Activation offload: pinned host memory, the copy stream, tickets ----------------------

std::unique_ptr<RawAllocator> CudaBackend::make_pinned_allocator(size_t chunk) {
  const Device dev = device_;
  return make_chunked_raw_allocator(
      [dev](size_t bytes) -> void* {
        if (dev.is_cuda()) REMAT_CUDA_CHECK(cudaSetDevice(dev.index));
        void* p = nullptr;
        if (cudaMallocHost(&p, bytes) != cudaSuccess) {
          (void)cudaGetLastError();  // out of pinned memory is not sticky
          return nullptr;
        }
        return p;
      },
      [](void* p) { cudaFreeHost(p); }, chunk);
}

cudaEvent_t CudaBackend::take_event() {
  if (spare_events_.empty()) {
    cudaEvent_t e = nullptr;
    REMAT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  cudaEvent_t e = spare_events_.back();
  spare_events_.pop_back();
  return e;
}

uint64_t CudaBackend::copy_async(const Tensor& dst, const Tensor& src) {
  REMAT_CHECK(dst.nbytes() == src.nbytes(), "offload copy of ", src.str(), " into ", dst.str());
  const bool in = on_gpu(dst.device()) && src.device().is_cpu();
  const bool out = dst.device().is_cpu() && on_gpu(src.device());
  REMAT_CHECK(in || out, "offload copies between ", device_.str(), " and pinned host memory, not from ",
              src.device().str(), " to ", dst.device().str());
  activate();
  if (!copy_stream_) REMAT_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  // The copy waits for every op enqueued so far: the producer of a copy-out's source, the
  // last readers of a copy-in's destination block (the allocator may have just reused it).
  cudaEvent_t ready = take_event();
  REMAT_CUDA_CHECK(cudaEventRecord(ready, stream_));
  REMAT_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, ready, 0));
  spare_events_.push_back(ready);  // the wait is enqueued: the event may be recorded again
  REMAT_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), src.nbytes(),
                                   in ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, copy_stream_));
  cudaEvent_t done = take_event();
  REMAT_CUDA_CHECK(cudaEventRecord(done, copy_stream_));
  copies_[++next_ticket_] = PendingCopy{done, (in ? dst : src).storage_ref(), out};
  return next_ticket_;
}

void CudaBackend::wait_copy(uint64_t ticket) {
  auto it = copies_.find(ticket);
  REMAT_CHECK(it != copies_.end(), "offload: copy ", ticket, " is not pending (waited for twice?)");
  // Until compute waits for the copy, the caching allocator may hand a freed device block
  // to the next kernel while the copy stream still reads (or writes) it.
  const PendingCopy c = it->second;
  copies_.erase(it);
  activate();
  REMAT_CUDA_CHECK(cudaStreamWaitEvent(stream_, c.done, 0));
  spare_events_.push_back(c.done);
  REMAT_CHECK(!c.device_side.expired(), "offload copy ", ticket, ": the device tensor it ",
              (c.out ? "reads" : "writes"),
              " was freed before compute waited for the copy; the allocator could hand its block to a kernel while "
              "the copy stream still uses it (executor bug)");
}

namespace cuda_device {

std::unique_ptr<RawAllocator> make_raw_allocator(Device d) { return std::make_unique<CudaRawAllocator>(d.index); }

void copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  REMAT_CHECK((on_gpu(dst_dev) || dst_dev.is_cpu()) && (on_gpu(src_dev) || src_dev.is_cpu()) &&
                  (on_gpu(dst_dev) || on_gpu(src_dev)),
              "the ", Device{kGpu, 0}.str(), " copy cannot copy from ", src_dev.str(), " to ", dst_dev.str());
  if (bytes == 0) return;
  const cudaMemcpyKind kind =
      on_gpu(dst_dev) ? (on_gpu(src_dev) ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice) : cudaMemcpyDeviceToHost;
  // A copy out of another GPU waits for that GPU's stream to produce the data.
  if (kind == cudaMemcpyDeviceToDevice && src_dev.index != dst_dev.index) {
    REMAT_CUDA_CHECK(cudaSetDevice(src_dev.index));
    backend_of(src_dev).note_drain();
    REMAT_CUDA_CHECK(cudaStreamSynchronize(stream_of(src_dev)));
  }
  const Device dev = on_gpu(dst_dev) ? dst_dev : src_dev;
  REMAT_CUDA_CHECK(cudaSetDevice(dev.index));
  cudaStream_t stream = stream_of(dev);
  REMAT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  // Host memory here is pageable and the caller's (a std::vector): wait until the copy has
  // read or written it. A device-to-device copy stays ordered on the stream.
  if (kind != cudaMemcpyDeviceToDevice) {
    backend_of(dev).note_drain();
    REMAT_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
}

void fill_f32(float* dst, Device dev, int64_t n, float value) {
  REMAT_CHECK(on_gpu(dev), "the ", Device{kGpu, 0}.str(), " fill on ", dev.str());
  REMAT_CUDA_CHECK(cudaSetDevice(dev.index));
  kernels::fill_f32(dst, n, value, stream_of(dev));
}

void zero(void* dst, Device dev, size_t bytes) {
  REMAT_CHECK(on_gpu(dev), "the ", Device{kGpu, 0}.str(), " zeroing on ", dev.str());
  if (bytes == 0) return;
  REMAT_CUDA_CHECK(cudaSetDevice(dev.index));
  REMAT_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_of(dev)));
}

}  // namespace cuda_device

REMAT_KERNELS_ABI_END
}  // namespace remat
