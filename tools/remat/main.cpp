// remat: the command-line tool. `remat --help` lists the subcommands.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

#include "commands.h"
#include "remat/backend.h"
#include "remat/dist.h"
#include "remat/error.h"
#include "remat/log.h"

// OpenMP threads that spin-wait between parallel regions steal the cores that BLAS and
// the other OpenMP threads need; on a small or shared machine a training step ran 20x
// slower. libgomp reads its wait policy before main runs, so when the user has not chosen
// one, re-execute once with OMP_WAIT_POLICY=passive.
static void prefer_passive_openmp_waits(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT") || std::getenv("REMAT_NO_REEXEC")) return;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  setenv("REMAT_NO_REEXEC", "1", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: carry on with the default policy
}

int main(int argc, char** argv) {
  prefer_passive_openmp_waits(argv);
#ifdef REMAT_HAVE_CUDA_EMU
  remat::register_cuda_emu_backend();
#endif
  CLI::App app{"remat: train deep models in less memory (gradient checkpointing on CUDA and CPU)"};
  app.set_version_flag("--version", std::string("remat ") + REMAT_VERSION);
  app.require_subcommand(1);
  std::vector<remat::cli::Runner> runners;
  runners.push_back(remat::cli::add_info_command(app));
  runners.push_back(remat::cli::add_train_command(app));
  runners.push_back(remat::cli::add_bench_command(app));
  runners.push_back(remat::cli::add_memprof_command(app));
  runners.push_back(remat::cli::add_plan_command(app));
  runners.push_back(remat::cli::add_eval_command(app));
  runners.push_back(remat::cli::add_export_command(app));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every usage error (an unknown option, a missing or
    // out-of-range value) exits 2, whatever CLI11's own code for its kind.
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    for (auto& run : runners) {
      int rc = run();
      if (rc >= 0) return rc;
    }
  } catch (const remat::Error& e) {
    // The user reads what is at fault (file, field, option, value); the failed check and
    // remat's source file and line are for REMAT_LOG=debug.
    if (!e.source().empty()) remat::log().debug("error source:{}", e.source());
    std::fprintf(stderr, "remat: error: %s\n", e.message().c_str());
    std::fflush(stderr);
    remat::dist::abort_job_on_error(1);  // no other rank waits for this one
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "remat: unexpected error: %s\n", e.what());
    std::fflush(stderr);
    remat::dist::abort_job_on_error(2);
    return 2;
  }
  return 0;
}
