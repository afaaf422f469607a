// The ranks of a data-parallel run and the collectives they use: MPI when remat is built
// with it and the process was started by mpirun, one process otherwise (see
// docs/distributed.md); NCCL for the collectives on GPU memory (DeviceComm) when built
// with it. Below the trainer; knows no tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace remat::dist {

// What this rank's collectives moved: bytes it sent to other ranks (its own block
// excluded; an all-reduce counted as a ring's 2(N-1)/N of the buffer) and their time,
// since the last reset.
struct CommStats {
  int64_t bytes = 0;
  // Wall time during which a collective of this rank was in flight: a blocking one's
  // duration, a non-blocking one's from its start until its completion was seen.
  double ms = 0;
  // The part of it this rank spent blocked inside collective calls (starting, polling,
  // waiting, blocking ones): what the step paid. ms - wait_ms was hidden behind compute.
  double wait_ms = 0;
  int64_t calls = 0;
  double hidden_ms() const { return ms > wait_ms ? ms - wait_ms : 0.0; }
  CommStats& operator+=(const CommStats& o) {
    bytes += o.bytes;
    ms += o.ms;
    wait_ms += o.wait_ms;
    calls += o.calls;
    return *this;
  }
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;  // among the ranks of this machine
  virtual int local_size() const = 0;
  virtual std::string engine() const = 0;  // "single" or "mpi"

  // Blocking collectives.
  // send holds size() blocks of `count` floats, block r for rank r; recv receives size()
  // blocks, block r from rank r.
  void alltoall(const float* send, float* recv, int64_t count);
  // recv receives size() blocks of `count` floats, block r being rank r's send.
  void allgather(const float* send, float* recv, int64_t count);
  void allgather(const uint64_t* send, uint64_t* recv, int64_t count);
  // data = the sum over the ranks, in the engine's own order: not bitwise the same for
  // another rank count.
  void allreduce_sum(float* data, int64_t count);

  // Non-blocking collectives (the buckets of a reduction overlapped with the backward
  // sweep): each starts now; poll() lets the engine move every started one on (MPI
  // progresses them only inside its calls) and wait_all() waits for all of them, with the
  // same deadline as the blocking ones. The caller leaves the buffers alone until
  // wait_all() returns. Collectives start in the same order on every rank.
  // alltoallv: to rank s, send_count[s] floats from send + send_offset[s]; from rank r,
  // recv_count[r] floats into recv + recv_offset[r] (size() entries each; counts may be 0).
  void start_alltoallv(const float* send, const std::vector<int64_t>& send_count,
                       const std::vector<int64_t>& send_offset, float* recv, const std::vector<int64_t>& recv_count,
                       const std::vector<int64_t>& recv_offset);
  void start_allreduce_sum(float* data, int64_t count);  // as allreduce_sum
  void poll();
  void wait_all();
  int in_flight() const { return pending_; }  // started and not yet seen complete

  // Ends every rank of the job with exit status `code` (one process: returns).
  virtual void abort(int code) = 0;

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 protected:
  virtual void alltoall_impl(const void* send, void* recv, int64_t bytes_per_block) = 0;
  virtual void allgather_impl(const void* send, void* recv, int64_t bytes_per_block) = 0;
  virtual void allreduce_sum_impl(float* data, int64_t count) = 0;
  virtual void start_alltoallv_impl(const float* send, const std::vector<int64_t>& send_count,
                                    const std::vector<int64_t>& send_offset, float* recv,
                                    const std::vector<int64_t>& recv_count,
                                    const std::vector<int64_t>& recv_offset) = 0;
  virtual void start_allreduce_sum_impl(float* data, int64_t count) = 0;
  // How many of the started collectives completed since the last call (never blocks).
  virtual int poll_impl() = 0;
  // Waits for every started collective (the deadline: REMAT_DIST_TIMEOUT).
  virtual void wait_all_impl() = 0;

 private:
  // The in-flight time is a union of intervals: it runs while depth_ > 0 (t: now, ms).
  void begin_flight(double t);
  void end_flight(int n, double t);  // n collectives seen complete
  void blocking(int64_t bytes, const std::function<void()>& run);
  void started(int64_t bytes, const std::function<void()>& start);
  CommStats stats_;
  int pending_ = 0;       // non-blocking collectives in flight
  int depth_ = 0;         // collectives in flight, blocking ones included
  double flight_t0_ = 0;  // when depth_ last went from 0 to 1 (ms on the steady clock)
};

// The job's ranks, set up on first use: MPI when built with it (REMAT_WITH_MPI) and the
// environment names an MPI launch (OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_RANK); a
// single-process Comm otherwise. MPI is finalised at exit.
Comm& world();
bool built_with_mpi();
bool launched_by_mpirun();  // the environment of an MPI launch
// After an error: when MPI runs with several ranks, ends the whole job (MPI_Abort), so
// that no other rank waits in a collective for this one; otherwise returns.
void abort_job_on_error(int code);

// Collectives on GPU memory, enqueued on a CUDA stream (NCCL): the ranks of a Comm, one
// CUDA device each. Pointers are device pointers to floats; `stream` is a cudaStream_t
// (the backend's: Backend::native_stream). Nothing waits for the device but wait().
class DeviceComm {
 public:
  virtual ~DeviceComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string engine() const = 0;  // e.g. "nccl 2.28.9"
  // As Comm's: send holds size() blocks of `count` floats, block s for rank s.
  virtual void alltoall(const float* send, float* recv, int64_t count, void* stream) = 0;
  virtual void allgather(const float* send, float* recv, int64_t count, void* stream) = 0;
  virtual void allreduce_sum(float* data, int64_t count, void* stream) = 0;  // not bitwise across N
  // Waits until the stream has run all it holds, collectives included, with the deadline
  // of REMAT_DIST_TIMEOUT: a collective that does not complete in time (another rank hangs
  // or died) aborts the communicator and throws. Settles stats(): the collectives' time on
  // the device (CUDA events around each), all of it paid by the stream (nothing hidden).
  virtual void wait(void* stream) = 0;
  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 protected:
  CommStats stats_;
};

bool built_with_nccl();
std::string nccl_version();  // of the NCCL library remat runs with ("2.28.9"); "" without NCCL
// An NCCL communicator over the ranks of `host`, rank r on CUDA device `device`: rank 0
// makes the unique id and host's allgather carries it to the others (a collective call).
// Throws when remat was built without NCCL.
std::unique_ptr<DeviceComm> make_nccl_comm(Comm& host, int device);

}  // namespace remat::dist
