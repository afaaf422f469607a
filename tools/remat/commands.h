// The subcommands of the `remat` tool. Each registers itself on the CLI11 app and runs
// when selected; errors surface as remat::Error and are printed by main.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>

namespace remat::cli {

using Runner = std::function<int()>;

// Validators of whole-number options: a value out of range is a usage error naming the
// option and the value (`--batch -4: must be positive`), never ignored.
inline CLI::Validator whole_number_at_least(int64_t min, const std::string& what) {
  return CLI::Validator(
      [min, what](std::string& s) -> std::string {
        size_t used = 0;
        int64_t v = 0;
        try {
          v = std::stoll(s, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != s.size()) return s + ": expected a whole number";
        if (v < min) return s + ": must be " + what;
        return "";
      },
      min > 0 ? "POSITIVE" : "NONNEGATIVE");
}
inline CLI::Validator positive() { return whole_number_at_least(1, "positive"); }
// A real number above 0 (`--link-gbps 0: must be above 0`).
inline CLI::Validator positive_real() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        size_t used = 0;
        double v = 0;
        try {
          v = std::stod(s, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != s.size()) return s + ": expected a number";
        if (!(v > 0)) return s + ": must be above 0";
        return "";
      },
      "POSITIVE");
}
inline CLI::Validator non_negative(const std::string& what = "0 or more") { return whole_number_at_least(0, what); }

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
Runner add_corpus_command(CLI::App& app);
Runner add_translate_command(CLI::App& app);
Runner add_predict_command(CLI::App& app);

}  // namespace remat::cli
