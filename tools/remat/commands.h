// The subcommands of the `remat` tool. Each registers itself on the CLI11 app and runs
// when selected; errors surface as remat::Error and are printed by main.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace remat::cli {

using Runner = std::function<int()>;

// Adds `info` to the app; the returned runner is called when it was selected.
Runner add_info_command(CLI::App& app);
Runner add_train_command(CLI::App& app);
Runner add_bench_command(CLI::App& app);
// `kernels` under `bench` (called by add_bench_command).
Runner add_bench_kernels_command(CLI::App& bench);
Runner add_memprof_command(CLI::App& app);
Runner add_plan_command(CLI::App& app);
Runner add_eval_command(CLI::App& app);
Runner add_export_command(CLI::App& app);

}  // namespace remat::cli
