// `remat eval CONFIG --data SHARDS ...`: loss and perplexity of a language model on token
// shards; `remat eval RUN` of a translation run: its loss and BLEU on a split; of any other
// run: its loss and accuracy on its evaluation set (see docs/cli.md).
#include <cstdio>

#include "commands.h"
#include "remat/evaluate.h"

namespace remat::cli {

Runner add_eval_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "eval",
      "Loss and perplexity of a language model on token shards; loss and BLEU of a translation model; loss and "
      "accuracy of any other model on its evaluation set");
  auto opt = std::make_shared<EvalOptions>();
  cmd->add_option("config", opt->config,
                  "Model config (models/*.json), or a run folder (its config and, unless --init-from, its weights)")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("--init-from", opt->init_from,
                  "Weights: a Hugging Face GPT-2 folder or .safetensors file, or a remat run folder (default: "
                  "initialised from the seed)");
  cmd->add_flag(
      "--init-from-partial", opt->init_from_partial,
      "Leave parameters missing from --init-from as initialised and ignore tensors the config has no use for");
  cmd->add_option("--data", opt->data_path,
                  "Token shards: one file (evaluated whatever its name), a folder or a glob (its *val* shards, or "
                  "all of them when none is named val); default: the config's data.path");
  cmd->add_option("--device", opt->device, "cpu, cuda, cuda:N, cuda-emu or auto (cuda:0 when a GPU is present)")
      ->default_val("auto");
  cmd->add_option("--batch", opt->batch, "Windows per batch (default: the config's training.batch)")->check(positive());
  cmd->add_option("--seed", opt->seed, "Seed for parameters not loaded by --init-from")->check(non_negative());
  cmd->add_option("--max-batches", opt->max_batches, "Evaluate at most this many batches (default: every window)")
      ->check(non_negative("0 (every window) or more"));
  cmd->add_option("--save-logits", opt->save_logits,
                  "Write the first batch's input_ids, targets and logits to this safetensors file");
  cmd->add_option("--split", opt->split, "Translation models: the corpus split evaluated (default: test)")
      ->check(CLI::IsMember({"train", "valid", "test"}));
  cmd->add_flag("--quiet", opt->quiet, "Only the result line");
  return [cmd, opt]() -> int {
    if (!cmd->parsed()) return -1;
    const EvalResult r = evaluate(*opt);
    if (opt->quiet) {
      std::printf("loss %.6f", r.loss);
      if (r.tokens > 0) std::printf(" perplexity %.4f", r.perplexity);
      if (r.accuracy) std::printf(" accuracy %.4f", *r.accuracy);
      if (r.bleu) std::printf(" bleu %.2f", r.bleu->score);
      std::printf("\n");
    }
    return 0;
  };
}

}  // namespace remat::cli
