// `remat predict RUN IMAGES.npy`: an image classifier's class for each image of a .npy
// file, printed as counts and written with --out (see docs/cli.md).
#include <cstdio>

#include "commands.h"
#include "remat/evaluate.h"

namespace remat::cli {

Runner add_predict_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("predict", "Classify the images of a .npy file with a trained image model");
  auto opt = std::make_shared<PredictOptions>();
  cmd->add_option("config", opt->config,
                  "A run folder (its config and weights), or a model config (models/*.json) with --init-from")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("images", opt->input,
                  "Images: a .npy file of [N, C, H, W] (or [N, H, W], [N, D]) numbers, as np.save writes it")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--out", opt->out, "Write the classes to this .npy file (int32 [N])");
  cmd->add_option("--logits", opt->logits_out, "Write the logits to this .npy file (float32 [N, classes])");
  cmd->add_option("--init-from", opt->init_from, "Weights: a remat run folder (default: the run folder's own)");
  cmd->add_flag(
      "--init-from-partial", opt->init_from_partial,
      "Leave parameters missing from --init-from as initialised and ignore tensors the config has no use for");
  cmd->add_option("--device", opt->device, "cpu, cuda, cuda:N, cuda-emu or auto (cuda:0 when a GPU is present)")
      ->default_val("auto");
  cmd->add_option("--batch", opt->batch, "Images per batch (default: the config's training.batch)")->check(positive());
  cmd->add_option("--seed", opt->seed, "Seed for parameters not loaded")->check(non_negative());
  cmd->add_flag("--quiet", opt->quiet, "Print one class per line and nothing else");
  return [cmd, opt]() -> int {
    if (!cmd->parsed()) return -1;
    const Predictions p = predict_images(*opt);
    if (opt->quiet)
      for (int32_t c : p.classes) std::printf("%d\n", c);
    return 0;
  };
}

}  // namespace remat::cli
