// `remat export RUN_DIR --format hf-gpt2|hf-llama OUT`: a run's weights in another tool's
// layout (see docs/cli.md).
#include <cstdio>

#include "commands.h"
#include "remat/error.h"
#include "remat/interop.h"
#include "remat/profile.h"

namespace remat::cli {

Runner add_export_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "export", "Write a run's checkpoint in another format (hf-gpt2, hf-llama: Hugging Face GPT-2 or Llama)");
  auto run_dir = std::make_shared<std::string>();
  auto format = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto shard = std::make_shared<std::string>("5GB");
  auto dtype = std::make_shared<std::string>("f32");
  cmd->add_option("run", *run_dir, "Run folder (remat train --out): config.json and checkpoint/")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--format", *format,
                  "Output format: hf-gpt2 (GPT2LMHeadModel) or hf-llama (LlamaForCausalLM): config.json and "
                  "safetensors for transformers")
      ->required()
      ->check(CLI::IsMember({"hf-gpt2", "hf-llama"}));
  cmd->add_option("--max-shard-size", *shard,
                  "Largest weights file (as save_pretrained's max_shard_size): larger exports are sharded with a "
                  "model.safetensors.index.json (e.g. 2GB, 500MiB)")
      ->capture_default_str();
  cmd->add_option("--dtype", *dtype,
                  "Weights' type in the files: f32 (the checkpoint's) or bf16 (rounded to nearest even, half the "
                  "size)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("out", *out, "Output folder (created; the files of an earlier export in it are replaced)")
      ->required();
  return [cmd, run_dir, format, out, shard, dtype]() -> int {
    if (!cmd->parsed()) return -1;
    int64_t bytes = 0;
    try {
      bytes = parse_size(*shard);
    } catch (const Error& e) {
      REMAT_THROW("--max-shard-size: ", e.what());
    }
    if (bytes <= 0) REMAT_THROW("--max-shard-size ", *shard, ": must be positive");
    const HfArch arch = *format == "hf-llama" ? HfArch::llama : HfArch::gpt2;
    std::printf("%s\n", export_hf(*run_dir, *out, arch, bytes, *dtype == "bf16" ? DType::bf16 : DType::f32).c_str());
    return 0;
  };
}

}  // namespace remat::cli
