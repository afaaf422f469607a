// remat: the command-line tool. `remat --help` lists the subcommands.
#include <cstdio>
#include <exception>
#include <vector>

#include "commands.h"
#include "remat/error.h"

int main(int argc, char** argv) {
  CLI::App app{"remat: train deep models in less memory (gradient checkpointing on CUDA and CPU)"};
  app.require_subcommand(1);
  std::vector<remat::cli::Runner> runners;
  runners.push_back(remat::cli::add_info_command(app));
  runners.push_back(remat::cli::add_train_command(app));
  runners.push_back(remat::cli::add_bench_command(app));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& run : runners) {
      int rc = run();
      if (rc >= 0) return rc;
    }
  } catch (const remat::Error& e) {
    std::fprintf(stderr, "remat: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "remat: unexpected error: %s\n", e.what());
    return 2;
  }
  return 0;
}
