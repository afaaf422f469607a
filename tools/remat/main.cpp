// remat: the command-line tool. `remat --help` lists the subcommands.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "commands.h"
#include "remat/backend.h"
#include "remat/config.h"
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

// After "The following arguments were not expected: --stpes 3": the option of the chosen
// command nearest to each unknown one ("did you mean --steps?").
static void suggest_options(const CLI::App& app, const std::string& message) {
  const CLI::App* cmd = &app;
  for (bool deeper = true; deeper;) {
    deeper = false;
    for (const CLI::App* sub : cmd->get_subcommands())
      if (sub->parsed()) cmd = sub, deeper = true;
  }
  std::vector<std::string> names;
  for (const CLI::Option* o : cmd->get_options())
    for (const std::string& n : o->get_lnames()) names.push_back(n);
  const size_t colon = message.find(':');
  std::string word;
  for (size_t i = colon == std::string::npos ? 0 : colon + 1; i <= message.size(); ++i) {
    if (i < message.size() && message[i] != ' ') {
      word += message[i];
      continue;
    }
    if (word.rfind("--", 0) == 0) {
      const std::string name =
          word.substr(2, word.find('=') == std::string::npos ? std::string::npos : word.find('=') - 2);
      const std::string best = remat::nearest_name(name, names);
      if (!best.empty())
        std::fprintf(stderr, "remat: unknown option %s; did you mean --%s?\n", word.c_str(), best.c_str());
    }
    word.clear();
  }
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
  runners.push_back(remat::cli::add_corpus_command(app));
  runners.push_back(remat::cli::add_translate_command(app));
  runners.push_back(remat::cli::add_predict_command(app));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every usage error (an unknown option, a missing or
    // out-of-range value) exits 2, whatever CLI11's own code for its kind.
    const int rc = app.exit(e) == 0 ? 0 : 2;
    if (dynamic_cast<const CLI::ExtrasError*>(&e)) suggest_options(app, e.what());
    return rc;
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
