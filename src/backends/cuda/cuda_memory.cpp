// Raw CUDA memory for the caching allocator, and the copies and fills Tensor needs.
#include <cuda_runtime.h>

#include "backends/cuda/cuda_device.h"
#include "kernels/fill.cuh"
#include "remat/cuda_check.h"
#include "remat/memory.h"
#include "remat/tensor.h"

namespace remat {

namespace {

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

 private:
  int device_;
  int64_t capacity_ = 0;
};

}  // namespace

std::unique_ptr<RawAllocator> cuda_device::make_raw_allocator(Device d) {
  return std::make_unique<CudaRawAllocator>(d.index);
}

namespace detail {

void device_memcpy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  REMAT_CHECK(!dst_dev.is_meta() && !src_dev.is_meta(), "copy between ", src_dev.str(), " and ", dst_dev.str());
  // cuda-emu memory is host memory
  cudaMemcpyKind kind = dst_dev.is_cuda() ? (src_dev.is_cuda() ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                          : (src_dev.is_cuda() ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  if (dst_dev.is_cuda())
    REMAT_CUDA_CHECK(cudaSetDevice(dst_dev.index));
  else if (src_dev.is_cuda())
    REMAT_CUDA_CHECK(cudaSetDevice(src_dev.index));
  REMAT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind));
}

void device_fill_f32(float* dst, Device dev, int64_t n, float value) {
  REMAT_CHECK(dev.is_cuda(), "device_fill_f32 on ", dev.str());
  REMAT_CUDA_CHECK(cudaSetDevice(dev.index));
  kernels::fill_f32(dst, n, value, nullptr);
}

}  // namespace detail
}  // namespace remat
