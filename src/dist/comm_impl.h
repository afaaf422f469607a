// Inside src/dist: the MPI Comm's factory (nullptr in a build without MPI).
#pragma once

#include <memory>

#include "remat/dist.h"

namespace remat::dist {

std::unique_ptr<Comm> make_mpi_comm();
// MPI_Abort when MPI was initialised with several ranks; otherwise nothing.
void mpi_abort_if_running(int code);

}  // namespace remat::dist
