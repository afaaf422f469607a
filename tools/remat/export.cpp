// `remat export RUN_DIR --format hf-gpt2 OUT`: a run's weights in another tool's layout
// (see docs/cli.md).
#include <cstdio>

#include "commands.h"
#include "remat/error.h"
#include "remat/interop.h"

namespace remat::cli {

Runner add_export_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("export", "Write a run's checkpoint in another format (hf-gpt2: Hugging Face GPT-2)");
  auto run_dir = std::make_shared<std::string>();
  auto format = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  cmd->add_option("run", *run_dir, "Run folder (remat train --out): config.json and checkpoint/")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--format", *format, "Output format: hf-gpt2 (config.json + model.safetensors for transformers)")
      ->required()
      ->check(CLI::IsMember({"hf-gpt2"}));
  cmd->add_option("out", *out, "Output folder (created; its config.json and model.safetensors are replaced)")
      ->required();
  return [cmd, run_dir, format, out]() -> int {
    if (!cmd->parsed()) return -1;
    std::printf("%s\n", export_hf_gpt2(*run_dir, *out).c_str());
    return 0;
  };
}

}  // namespace remat::cli
