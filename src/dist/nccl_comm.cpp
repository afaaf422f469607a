// The NCCL DeviceComm: GPU collectives on the backend's CUDA stream, one CUDA device per
// rank; the unique id travels over the host Comm (MPI). Built when CMake finds NCCL
// (REMAT_WITH_NCCL, only this file sees nccl.h); otherwise make_nccl_comm refuses.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "remat/dist.h"
#include "remat/error.h"

#ifdef REMAT_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace remat::dist {

#ifdef REMAT_WITH_NCCL

namespace {

void check_nccl(ncclResult_t rc, const char* what) {
  if (rc == ncclSuccess || rc == ncclInProgress) return;
  REMAT_THROW("NCCL ", what, " failed: ", ncclGetErrorString(rc), " (", static_cast<int>(rc), ")");
}

void check_cuda(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return;
  REMAT_THROW("CUDA ", what, " failed: ", cudaGetErrorString(rc), " (", static_cast<int>(rc), ")");
}

double timeout_s() {
  const char* v = std::getenv("REMAT_DIST_TIMEOUT");
  const double t = v ? std::atof(v) : 300.0;
  return t > 0 ? t : 300.0;
}

class NcclComm final : public DeviceComm {
 public:
  NcclComm(Comm& host, int device) : rank_(host.rank()), size_(host.size()), device_(device) {
    static_assert(sizeof(ncclUniqueId) % sizeof(uint64_t) == 0, "ncclUniqueId is not a whole number of words");
    constexpr int64_t words = sizeof(ncclUniqueId) / sizeof(uint64_t);
    std::vector<uint64_t> mine(words, 0), all(static_cast<size_t>(words * size_), 0);
    if (rank_ == 0) {
      ncclUniqueId id;
      check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
      std::memcpy(mine.data(), &id, sizeof id);
    }
    host.allgather(mine.data(), all.data(), words);  // block 0: rank 0's id
    ncclUniqueId id;
    std::memcpy(&id, all.data(), sizeof id);
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_nccl(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
  }
  ~NcclComm() override {
    for (Timing& t : timings_) {
      cudaEventDestroy(t.begin);
      cudaEventDestroy(t.end);
    }
    if (comm_) ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string engine() const override { return "nccl " + nccl_version(); }

  // Grouped point-to-point calls (NCCL 2.7 and later): block s to rank s, block r from r.
  void alltoall(const float* send, float* recv, int64_t count, void* stream) override {
    cudaStream_t s = enter(stream);
    const auto n = static_cast<size_t>(count);
    record_begin(s);
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size_; ++r) {
      check_nccl(ncclSend(send + n * static_cast<size_t>(r), n, ncclFloat32, r, comm_, s), "ncclSend");
      check_nccl(ncclRecv(recv + n * static_cast<size_t>(r), n, ncclFloat32, r, comm_, s), "ncclRecv");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd (all-to-all)");
    record_end(s);
    stats_.bytes += count * 4 * (size_ - 1);
    stats_.calls++;
  }
  void allgather(const float* send, float* recv, int64_t count, void* stream) override {
    cudaStream_t s = enter(stream);
    record_begin(s);
    check_nccl(ncclAllGather(send, recv, static_cast<size_t>(count), ncclFloat32, comm_, s), "ncclAllGather");
    record_end(s);
    stats_.bytes += count * 4 * (size_ - 1);
    stats_.calls++;
  }
  void allreduce_sum(float* data, int64_t count, void* stream) override {
    cudaStream_t s = enter(stream);
    record_begin(s);
    check_nccl(ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat32, ncclSum, comm_, s), "ncclAllReduce");
    record_end(s);
    stats_.bytes += count * 4 * 2 * (size_ - 1) / size_;
    stats_.calls++;
  }

  void wait(void* stream) override {
    cudaStream_t s = enter(stream);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_);
    for (int spins = 0;; ++spins) {
      const cudaError_t q = cudaStreamQuery(s);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) check_cuda(q, "cudaStreamQuery (waiting for NCCL collectives)");
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
      if (async != ncclSuccess && async != ncclInProgress) {
        abort_comm();
        REMAT_THROW("data parallel: rank ", rank_, ": an NCCL collective failed: ", ncclGetErrorString(async),
                    "; ending the job");
      }
      if (std::chrono::steady_clock::now() > deadline) {
        abort_comm();
        REMAT_THROW("data parallel: rank ", rank_, ": NCCL collectives did not complete within ", timeout_,
                    " s (REMAT_DIST_TIMEOUT): another rank hangs or died; ending the job");
      }
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    // The stream is idle: every recorded event has happened.
    for (size_t i = 0; i < used_; ++i) {
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, timings_[i].begin, timings_[i].end), "cudaEventElapsedTime");
      stats_.ms += ms;
      stats_.wait_ms += ms;  // on the backend's stream: nothing runs beside it
    }
    used_ = 0;
  }

 private:
  struct Timing {
    cudaEvent_t begin = nullptr, end = nullptr;
  };
  cudaStream_t enter(void* stream) {
    REMAT_CHECK(comm_, "data parallel: rank ", rank_, ": the NCCL communicator was aborted");
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    return static_cast<cudaStream_t>(stream);
  }
  void record_begin(cudaStream_t s) {
    if (used_ == timings_.size()) {
      Timing t;
      check_cuda(cudaEventCreate(&t.begin), "cudaEventCreate");
      check_cuda(cudaEventCreate(&t.end), "cudaEventCreate");
      timings_.push_back(t);
    }
    check_cuda(cudaEventRecord(timings_[used_].begin, s), "cudaEventRecord");
  }
  void record_end(cudaStream_t s) { check_cuda(cudaEventRecord(timings_[used_++].end, s), "cudaEventRecord"); }
  void abort_comm() {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  int rank_ = 0, size_ = 1, device_ = 0;
  ncclComm_t comm_ = nullptr;
  double timeout_ = timeout_s();
  std::vector<Timing> timings_;  // event pairs around the collectives since the last wait
  size_t used_ = 0;
};

}  // namespace

bool built_with_nccl() { return true; }

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::unique_ptr<DeviceComm> make_nccl_comm(Comm& host, int device) { return std::make_unique<NcclComm>(host, device); }

#else

bool built_with_nccl() { return false; }
std::string nccl_version() { return ""; }

std::unique_ptr<DeviceComm> make_nccl_comm(Comm&, int) {
  REMAT_THROW("this remat was built without NCCL (CMake found no nccl.h and libnccl; set NCCL_ROOT)");
}

#endif

}  // namespace remat::dist
