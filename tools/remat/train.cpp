// `remat train CONFIG ...`: train a model config (see docs/cli.md).
#include <algorithm>
#include <cstdio>
#include <map>

#include "commands.h"
#include "remat/dist.h"
#include "remat/profile.h"
#include "remat/train.h"

namespace remat::cli {

Runner add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a model config with a checkpointing policy");
  auto opt = std::make_shared<TrainOptions>();
  cmd->add_option("config", opt->config, "Model config (models/*.json)")->required()->check(CLI::ExistingFile);
  cmd->add_option(
      "--policy", opt->policy,
      "Checkpoint policy: none, all, every:K, sqrt, revolve:S, selective, manual (each optionally +offload or "
      "+offload:J, the first J units: CUDA devices), budget:SIZE (the reserved bytes; +offload too) (default: the "
      "config's)");
  cmd->add_option("--precision", opt->precision, "fp32 or bf16 (default: the config's training.precision)");
  cmd->add_option(
         "--device", opt->device,
         "cpu, cuda, cuda:N, cuda-emu (the CUDA kernels on the emulator: slow) or auto (cuda:0 when a GPU is present)")
      ->default_val("auto");
  auto* steps = cmd->add_option("--steps", opt->steps, "Training steps (overrides the config)")->check(positive());
  cmd->add_option("--epochs", opt->epochs, "Epochs (overrides the config)")->check(positive())->excludes(steps);
  cmd->add_option("--batch", opt->batch, "Batch size (overrides the config)")->check(positive());
  cmd->add_option("--micro-batch", opt->micro_batch,
                  "Gradient accumulation: run each step as batch / N micro-batches of N samples (overrides "
                  "training.micro_batch; 0 = the whole batch)")
      ->check(non_negative("0 (the whole batch) or more"));
  cmd->add_option("--reduce", opt->reduce,
                  "Data parallel (mpirun -np N): ordered (bitwise the same weights for any N) or fast "
                  "(MPI_Allreduce, not bitwise)")
      ->check(CLI::IsMember({"ordered", "fast"}))
      ->default_val("ordered");
  cmd->add_flag("--shard-optimizer", opt->shard_optimizer,
                "Data parallel: each rank keeps the optimizer state of 1/N of the parameters (ZeRO-1; sets "
                "training.shard_optimizer)");
  cmd->add_option("--overlap", opt->overlap,
                  "Data parallel on cpu: reduce buckets of gradients during the backward sweep (on) or after it "
                  "(off); the same weights either way")
      ->transform(CLI::CheckedTransformer(std::map<std::string, bool>{{"on", true}, {"off", false}}))
      ->default_str("on");
  cmd->add_option("--bucket-kib", opt->bucket_kib,
                  "Data parallel with --overlap on: a bucket of gradients closes at the parameter that brings it "
                  "to this many KiB")
      ->check(CLI::PositiveNumber)
      ->default_val(opt->bucket_kib);
  cmd->add_option("--seed", opt->seed, "Seed for initialisation, data order and dropout")->check(non_negative());
  cmd->add_option("--out", opt->out, "Run folder: checkpoint/, metrics.jsonl, config.json, memory.html");
  auto* resume =
      cmd->add_option("--resume", opt->resume, "Resume from a run folder (continues bitwise as if uninterrupted)")
          ->check(CLI::ExistingDirectory);
  cmd->add_flag("--overwrite", opt->overwrite,
                "Let --out name a folder that holds a run and start it over (its checkpoint is removed, "
                "metrics.jsonl truncated); without it such a folder is an error")
      ->excludes(resume);
  cmd->add_flag("--reschedule", opt->reschedule,
                "With --resume: fit the learning-rate schedule to this run's length (default: keep the length "
                "recorded in the run, so that --steps extends it)")
      ->needs(resume);
  cmd->add_option("--data", opt->data_path, "Data folder, file or (token shards) glob (overrides data.path)");
  cmd->add_option("--dataset", opt->dataset, "Data set (overrides data.dataset), e.g. token_shards")
      ->check(CLI::IsMember(known_datasets()));
  auto* init = cmd->add_option("--init-from", opt->init_from,
                               "Start from these weights: a Hugging Face GPT-2 folder or .safetensors file, or a remat "
                               "run folder (a fresh optimizer, unlike --resume)");
  init->excludes("--resume");
  cmd->add_flag("--init-from-partial", opt->init_from_partial,
                "With --init-from: leave missing parameters as initialised and ignore unexpected tensors")
      ->needs(init);
  cmd->add_flag("--verify-recompute", opt->verify_recompute,
                "Hash every tensor freed for recompute and check the recomputed one against it");
  cmd->add_flag("--quiet", opt->quiet, "Only the final done: line (no progress lines, sample or memory report)");
  return [cmd, opt]() -> int {
    if (!cmd->parsed()) return -1;
    TrainResult r = train(*opt);
    if (dist::world().rank() != 0) return 0;  // with several ranks, rank 0 reports
    // The summary line, --quiet or not.
    std::printf("done: %lld steps, final loss %.4f", static_cast<long long>(r.steps), r.last_loss);
    if (r.eval_accuracy >= 0) std::printf(", eval loss %.4f, eval accuracy %.4f", r.eval_loss, r.eval_accuracy);
    std::printf(", peak %.1f MiB\n", static_cast<double>(r.peak_bytes) / (1 << 20));
    if (!opt->quiet) {
      if (r.ranks > 1 && !r.losses.empty()) {
        const double steps = static_cast<double>(r.losses.size());
        std::printf(
            "communication: %d ranks, %.2f MiB sent and %.2f ms per step by rank 0, %.2f ms of it waited "
            "for (%.0f%% hidden behind the backward sweep)\n",
            r.ranks, static_cast<double>(r.comm_bytes) / steps / (1 << 20), r.comm_ms / steps, r.comm_wait_ms / steps,
            r.comm_ms > 0 ? 100.0 * std::max(0.0, r.comm_ms - r.comm_wait_ms) / r.comm_ms : 0.0);
      }
      std::printf("%s", memory_report(r.peak_stats, "memory at the peak of a training step (policy " + r.policy + ", " +
                                                        r.precision + "):")
                            .c_str());
      if (r.host_peak_bytes > 0)
        std::printf("  %-16s %14s    (offloaded activations, beside the device)\n", "pinned host peak",
                    format_bytes(r.host_peak_bytes).c_str());
    }
    return 0;
  };
}

}  // namespace remat::cli
