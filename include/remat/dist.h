// The ranks of a data-parallel run and the collectives they use: MPI when remat is built
// with it and the process was started by mpirun, one process otherwise (see
// docs/distributed.md). Below the trainer; knows no tensor.
#pragma once

#include <cstdint>
#include <string>

namespace remat::dist {

// What this rank's collectives moved: bytes it sent to other ranks (its own block
// excluded; an all-reduce counted as a ring's 2(N-1)/N of the buffer) and the time spent
// in them, since the last reset.
struct CommStats {
  int64_t bytes = 0;
  double ms = 0;
  int64_t calls = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;  // among the ranks of this machine
  virtual int local_size() const = 0;
  virtual std::string engine() const = 0;  // "single" or "mpi"

  // send holds size() blocks of `count` floats, block r for rank r; recv receives size()
  // blocks, block r from rank r.
  void alltoall(const float* send, float* recv, int64_t count);
  // recv receives size() blocks of `count` floats, block r being rank r's send.
  void allgather(const float* send, float* recv, int64_t count);
  void allgather(const uint64_t* send, uint64_t* recv, int64_t count);
  // data = the sum over the ranks, in the engine's own order: not bitwise the same for
  // another rank count.
  void allreduce_sum(float* data, int64_t count);
  // Ends every rank of the job with exit status `code` (one process: returns).
  virtual void abort(int code) = 0;

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 protected:
  virtual void alltoall_impl(const void* send, void* recv, int64_t bytes_per_block) = 0;
  virtual void allgather_impl(const void* send, void* recv, int64_t bytes_per_block) = 0;
  virtual void allreduce_sum_impl(float* data, int64_t count) = 0;

 private:
  CommStats stats_;
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

}  // namespace remat::dist
