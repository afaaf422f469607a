// The single-process Comm and the collectives' accounting; the MPI Comm is in mpi_comm.cpp
// (built when CMake finds MPI).
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "dist/comm_impl.h"
#include "remat/dist.h"

namespace remat::dist {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

class SingleComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string engine() const override { return "single"; }
  void abort(int) override {}

 protected:
  void alltoall_impl(const void* send, void* recv, int64_t bytes) override { copy(send, recv, bytes); }
  void allgather_impl(const void* send, void* recv, int64_t bytes) override { copy(send, recv, bytes); }
  void allreduce_sum_impl(float*, int64_t) override {}

 private:
  static void copy(const void* send, void* recv, int64_t bytes) {
    if (send != recv && bytes > 0) std::memcpy(recv, send, static_cast<size_t>(bytes));
  }
};

}  // namespace

void Comm::alltoall(const float* send, float* recv, int64_t count) {
  const Clock::time_point t = Clock::now();
  alltoall_impl(send, recv, count * 4);
  stats_.bytes += count * 4 * (size() - 1);
  stats_.ms += ms_since(t);
  stats_.calls++;
}

void Comm::allgather(const float* send, float* recv, int64_t count) {
  const Clock::time_point t = Clock::now();
  allgather_impl(send, recv, count * 4);
  stats_.bytes += count * 4 * (size() - 1);
  stats_.ms += ms_since(t);
  stats_.calls++;
}

void Comm::allgather(const uint64_t* send, uint64_t* recv, int64_t count) {
  const Clock::time_point t = Clock::now();
  allgather_impl(send, recv, count * 8);
  stats_.bytes += count * 8 * (size() - 1);
  stats_.ms += ms_since(t);
  stats_.calls++;
}

void Comm::allreduce_sum(float* data, int64_t count) {
  const Clock::time_point t = Clock::now();
  allreduce_sum_impl(data, count);
  stats_.bytes += count * 4 * 2 * (size() - 1) / size();
  stats_.ms += ms_since(t);
  stats_.calls++;
}

bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") || std::getenv("PMI_RANK");
}

bool built_with_mpi() {
#ifdef REMAT_WITH_MPI
  return true;
#else
  return false;
#endif
}

Comm& world() {
  static std::unique_ptr<Comm> comm = [] {
    std::unique_ptr<Comm> c;
    if (built_with_mpi() && launched_by_mpirun()) c = make_mpi_comm();
    if (!c) c = std::make_unique<SingleComm>();
    return c;
  }();
  return *comm;
}

void abort_job_on_error(int code) { mpi_abort_if_running(code); }

}  // namespace remat::dist
