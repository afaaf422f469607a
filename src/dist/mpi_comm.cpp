// The MPI Comm (OpenMPI from Debian): collectives on MPI_COMM_WORLD. Without MPI in the
// build, the factory returns nullptr and the run is one process.
#include <chrono>
#include <cstdlib>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "dist/comm_impl.h"
#include "remat/error.h"

#ifdef REMAT_WITH_MPI
// The C API only: OpenMPI's deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace remat::dist {

#ifdef REMAT_WITH_MPI

namespace {

bool g_initialised = false;
int g_size = 1;

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  REMAT_THROW("MPI ", what, " failed: ", std::string(msg, static_cast<size_t>(len)));
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

// Seconds a collective may wait for the other ranks (REMAT_DIST_TIMEOUT, default 300).
double timeout_s() {
  const char* v = std::getenv("REMAT_DIST_TIMEOUT");
  const double t = v ? std::atof(v) : 300.0;
  return t > 0 ? t : 300.0;
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

class MpiComm final : public Comm {
 public:
  MpiComm() {
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    g_initialised = true;
    std::atexit(finalize_at_exit);
    // Errors come back as return codes, turned into remat::Error by check().
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    g_size = size_;
    local_rank_ = env_int("OMPI_COMM_WORLD_LOCAL_RANK", rank_);
    local_size_ = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string engine() const override { return "mpi"; }
  void abort(int code) override { MPI_Abort(MPI_COMM_WORLD, code); }

 protected:
  // Non-blocking collectives waited on with a deadline: a rank that hangs (or dies
  // without mpirun noticing) makes the others fail instead of waiting for ever.
  void alltoall_impl(const void* send, void* recv, int64_t bytes) override {
    MPI_Request rq;
    check(MPI_Ialltoall(send, count(bytes), MPI_BYTE, recv, count(bytes), MPI_BYTE, MPI_COMM_WORLD, &rq),
          "MPI_Ialltoall");
    wait(rq, "MPI_Alltoall");
  }
  void allgather_impl(const void* send, void* recv, int64_t bytes) override {
    MPI_Request rq;
    check(MPI_Iallgather(send, count(bytes), MPI_BYTE, recv, count(bytes), MPI_BYTE, MPI_COMM_WORLD, &rq),
          "MPI_Iallgather");
    wait(rq, "MPI_Allgather");
  }
  void allreduce_sum_impl(float* data, int64_t n) override {
    MPI_Request rq;
    check(MPI_Iallreduce(MPI_IN_PLACE, data, count(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &rq), "MPI_Iallreduce");
    wait(rq, "MPI_Allreduce");
  }
  void start_alltoallv_impl(const float* send, const std::vector<int64_t>& send_count,
                            const std::vector<int64_t>& send_offset, float* recv,
                            const std::vector<int64_t>& recv_count, const std::vector<int64_t>& recv_offset) override {
    // MPI reads the count and offset arrays until the collective completes: they live in
    // the pending record.
    Pending& p = pending_.emplace_back();
    p.what = "MPI_Ialltoallv";
    for (const auto* v : {&send_count, &send_offset, &recv_count, &recv_offset}) {
      std::vector<int>& out = p.ints.emplace_back();
      for (int64_t x : *v) out.push_back(count(x));
    }
    check(MPI_Ialltoallv(send, p.ints[0].data(), p.ints[1].data(), MPI_FLOAT, recv, p.ints[2].data(), p.ints[3].data(),
                         MPI_FLOAT, MPI_COMM_WORLD, &p.rq),
          "MPI_Ialltoallv");
  }
  void start_allreduce_sum_impl(float* data, int64_t n) override {
    Pending& p = pending_.emplace_back();
    p.what = "MPI_Iallreduce";
    check(MPI_Iallreduce(MPI_IN_PLACE, data, count(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &p.rq), "MPI_Iallreduce");
  }
  int poll_impl() override {
    int done = 0;
    for (Pending& p : pending_) {
      if (p.rq == MPI_REQUEST_NULL) continue;
      int flag = 0;
      check(MPI_Test(&p.rq, &flag, MPI_STATUS_IGNORE), p.what);  // sets rq to MPI_REQUEST_NULL when done
      done += flag;
    }
    while (!pending_.empty() && pending_.front().rq == MPI_REQUEST_NULL) pending_.pop_front();
    return done;
  }
  void wait_all_impl() override {
    for (Pending& p : pending_)
      if (p.rq != MPI_REQUEST_NULL) wait(p.rq, p.what);
    pending_.clear();
  }

 private:
  void wait(MPI_Request& rq, const char* what) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_);
    for (int spins = 0;; ++spins) {
      int done = 0;
      check(MPI_Test(&rq, &done, MPI_STATUS_IGNORE), what);
      if (done) return;
      if (std::chrono::steady_clock::now() > deadline)
        REMAT_THROW("data parallel: rank ", rank_, ": ", what, " did not complete within ", timeout_,
                    " s (REMAT_DIST_TIMEOUT): another rank hangs or died; ending the job");
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  static int count(int64_t n) {
    REMAT_CHECK(n <= (int64_t{1} << 31) - 1, "MPI: a message of ", n, " elements is over MPI's int count");
    return static_cast<int>(n);
  }
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  double timeout_ = timeout_s();
  // The started non-blocking collectives (a deque: MPI holds pointers into the records).
  struct Pending {
    MPI_Request rq = MPI_REQUEST_NULL;
    const char* what = "";
    std::vector<std::vector<int>> ints;  // alltoallv's counts and offsets
  };
  std::deque<Pending> pending_;
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm() { return std::make_unique<MpiComm>(); }

void mpi_abort_if_running(int code) {
  if (!g_initialised || g_size <= 1) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

#else

std::unique_ptr<Comm> make_mpi_comm() { return nullptr; }
void mpi_abort_if_running(int) {}

#endif

}  // namespace remat::dist
