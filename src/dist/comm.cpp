// The single-process Comm and the collectives' accounting; the MPI Comm is in mpi_comm.cpp
// (built when CMake finds MPI), the NCCL DeviceComm in nccl_comm.cpp.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>

#include "dist/comm_impl.h"
#include "remat/dist.h"
#include "remat/error.h"

namespace remat::dist {

namespace {

using Clock = std::chrono::steady_clock;

double now_ms() { return std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count(); }

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
  void start_alltoallv_impl(const float* send, const std::vector<int64_t>& send_count,
                            const std::vector<int64_t>& send_offset, float* recv, const std::vector<int64_t>&,
                            const std::vector<int64_t>& recv_offset) override {
    copy(send + send_offset[0], recv + recv_offset[0], send_count[0] * 4);
    ++done_;
  }
  void start_allreduce_sum_impl(float*, int64_t) override { ++done_; }
  int poll_impl() override { return std::exchange(done_, 0); }
  void wait_all_impl() override { done_ = 0; }

 private:
  static void copy(const void* send, void* recv, int64_t bytes) {
    if (send != recv && bytes > 0) std::memcpy(recv, send, static_cast<size_t>(bytes));
  }
  int done_ = 0;
};

}  // namespace

// ---- accounting --------------------------------------------------------------------------------

void Comm::begin_flight(double t) {
  if (depth_++ == 0) flight_t0_ = t;
}

void Comm::end_flight(int n, double t) {
  if (n == 0) return;
  depth_ -= n;
  if (depth_ == 0) stats_.ms += t - flight_t0_;
}

// A blocking collective: in flight and waited for from start to end.
void Comm::blocking(int64_t bytes, const std::function<void()>& run) {
  const double t0 = now_ms();
  begin_flight(t0);
  run();
  const double t1 = now_ms();
  end_flight(1, t1);
  stats_.bytes += bytes;
  stats_.wait_ms += t1 - t0;
  stats_.calls++;
}

// A non-blocking one: in flight from its start until poll or wait_all sees it complete.
void Comm::started(int64_t bytes, const std::function<void()>& start) {
  const double t0 = now_ms();
  begin_flight(t0);
  ++pending_;
  start();
  stats_.bytes += bytes;
  stats_.wait_ms += now_ms() - t0;
  stats_.calls++;
}

void Comm::alltoall(const float* send, float* recv, int64_t count) {
  blocking(count * 4 * (size() - 1), [&] { alltoall_impl(send, recv, count * 4); });
}

void Comm::allgather(const float* send, float* recv, int64_t count) {
  blocking(count * 4 * (size() - 1), [&] { allgather_impl(send, recv, count * 4); });
}

void Comm::allgather(const uint64_t* send, uint64_t* recv, int64_t count) {
  blocking(count * 8 * (size() - 1), [&] { allgather_impl(send, recv, count * 8); });
}

void Comm::allreduce_sum(float* data, int64_t count) {
  blocking(count * 4 * 2 * (size() - 1) / size(), [&] { allreduce_sum_impl(data, count); });
}

void Comm::start_alltoallv(const float* send, const std::vector<int64_t>& send_count,
                           const std::vector<int64_t>& send_offset, float* recv, const std::vector<int64_t>& recv_count,
                           const std::vector<int64_t>& recv_offset) {
  const auto n = static_cast<size_t>(size());
  REMAT_CHECK(send_count.size() == n && send_offset.size() == n && recv_count.size() == n && recv_offset.size() == n,
              "alltoallv: counts and offsets need one entry per rank (", n, ")");
  int64_t bytes = 0;
  for (size_t s = 0; s < n; ++s)
    if (static_cast<int>(s) != rank()) bytes += send_count[s] * 4;
  started(bytes, [&] { start_alltoallv_impl(send, send_count, send_offset, recv, recv_count, recv_offset); });
}

void Comm::start_allreduce_sum(float* data, int64_t count) {
  started(count * 4 * 2 * (size() - 1) / size(), [&] { start_allreduce_sum_impl(data, count); });
}

void Comm::poll() {
  if (pending_ == 0) return;
  const double t0 = now_ms();
  const int done = poll_impl();
  pending_ -= done;
  const double t1 = now_ms();
  end_flight(done, t1);
  stats_.wait_ms += t1 - t0;
}

void Comm::wait_all() {
  if (pending_ == 0) return;
  const double t0 = now_ms();
  wait_all_impl();
  const double t1 = now_ms();
  end_flight(pending_, t1);
  pending_ = 0;
  stats_.wait_ms += t1 - t0;
}

// ---- the job ---------------------------------------------------------------------------------------

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
