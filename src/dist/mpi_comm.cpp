// The MPI Comm (OpenMPI from Debian): collectives on MPI_COMM_WORLD. Without MPI in the
// build, the factory returns nullptr and the run is one process.
#include <cstdlib>
#include <string>

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
  void alltoall_impl(const void* send, void* recv, int64_t bytes) override {
    check(MPI_Alltoall(send, count(bytes), MPI_BYTE, recv, count(bytes), MPI_BYTE, MPI_COMM_WORLD), "MPI_Alltoall");
  }
  void allgather_impl(const void* send, void* recv, int64_t bytes) override {
    check(MPI_Allgather(send, count(bytes), MPI_BYTE, recv, count(bytes), MPI_BYTE, MPI_COMM_WORLD), "MPI_Allgather");
  }
  void allreduce_sum_impl(float* data, int64_t n) override {
    check(MPI_Allreduce(MPI_IN_PLACE, data, count(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  }

 private:
  static int count(int64_t n) {
    REMAT_CHECK(n <= (int64_t{1} << 31) - 1, "MPI: a message of ", n, " elements is over MPI's int count");
    return static_cast<int>(n);
  }
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
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
