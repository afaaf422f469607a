// `remat memprof` and `remat plan`: where the memory of a training step goes under each
// checkpoint policy, and which plan fits a budget (see docs/memory.md).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>

#include "commands.h"
#include "remat/dist.h"
#include "remat/error.h"
#include "remat/io.h"
#include "remat/profile.h"
#include "remat/schedule.h"

namespace remat::cli {

namespace {

std::vector<std::string> split_list(const char* option, const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string p; std::getline(ss, p, ',');)
    if (!p.empty()) out.push_back(p);
  REMAT_CHECK(!out.empty(), option, ": expected a comma-separated list");
  return out;
}

std::vector<std::string> split_policies(const std::string& s) { return split_list("--policy", s); }

// An output path whose folder does not exist or cannot be written fails before the
// profile runs, naming the option.
void check_output_path(const char* option, const std::string& path) {
  if (path.empty()) return;
  const std::filesystem::path p(path);
  const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
  std::error_code ec;
  REMAT_CHECK(std::filesystem::is_directory(dir, ec), option, " ", path, ": the folder ", dir.string(),
              " does not exist");
  REMAT_CHECK(!std::filesystem::is_directory(p, ec), option, " ", path, ": is a folder, expected a file name");
  REMAT_CHECK(::access(dir.c_str(), W_OK) == 0, option, " ", path, ": the folder ", dir.string(), " is not writable");
}

// --batch and --micro-batch over the config's training section.
// --ranks N: as `mpirun -np N remat train` splits a step: without training.micro_batch
// each rank takes batch / N samples; with it the micro-batches split over the ranks.
void apply_rank_options(Config& cfg, int ranks, bool shard_optimizer) {
  if (shard_optimizer) cfg.training.shard_optimizer = true;
  cfg.training.ranks = ranks;
  if (ranks <= 1) return;
  TrainingConfig& t = cfg.training;
  if (t.micro_batch == 0) {
    REMAT_CHECK(t.batch % ranks == 0, "--ranks ", ranks, ": batch ", t.batch, " does not split over ", ranks,
                " ranks; set --micro-batch");
    t.micro_batch = t.batch / ranks;
  }
  REMAT_CHECK(t.micro_batches() % ranks == 0, "--ranks ", ranks, ": ", t.micro_batches(),
              " micro-batches per step, not a multiple of the ", ranks, " ranks");
}

// GPU ranks exchange gradients with NCCL through device buffers that `remat train` holds
// (docs/distributed.md): the profile of one rank on cuda:N counts them.
void set_device_collectives(Config& cfg, const Device& dev) {
  cfg.training.device_collectives = dev.is_cuda() && cfg.training.ranks > 1 && dist::built_with_nccl();
}

std::string rank_note(const Config& cfg, int ranks) {
  if (ranks <= 1 && !cfg.training.shard_optimizer) return "";
  return ", one rank of " + std::to_string(ranks) +
         (cfg.training.shard_optimizer ? " (optimizer state sharded, ZeRO-1)" : "");
}

void apply_batch_options(Config& cfg, std::optional<int64_t> batch, std::optional<int64_t> micro_batch) {
  if (batch) cfg.training.batch = *batch;  // the values were checked by the option parser
  if (micro_batch) cfg.training.micro_batch = *micro_batch;
  check_micro_batch(cfg);
}

// ", micro-batch 4 (2 per step: the activations of 4 samples, plus a gradient-sized
// accumulation buffer)"; with ranks (cfg.training.ranks > 1) the micro-batches split over
// them and the sum lives in the reduction's host buffers, not on the device.
std::string micro_note(const Config& cfg) {
  const TrainingConfig& t = cfg.training;
  if (t.micro_batches() == 1) return "";
  const std::string head =
      ", micro-batch " + std::to_string(t.micro()) + " (" + std::to_string(t.micro_batches()) + " per step";
  if (t.ranks > 1)
    return head + ", " + std::to_string(t.micro_batches() / t.ranks) + " per rank: the activations of " +
           std::to_string(t.micro()) + " samples)";
  return head + ": the activations of " + std::to_string(t.micro()) +
         " samples, plus a gradient-sized accumulation buffer)";
}

struct MemprofOptions {
  std::string config, policies = "none,all,sqrt,selective", device = "meta", json, trace, svg, html, precisions;
  std::optional<int64_t> batch, micro_batch;  // unset: the config's
  int64_t seq = 0;                            // 0: the config's
  int ranks = 1;
  bool layers = false, schedule = false, shard_optimizer = false;
};

void add_memprof_options(CLI::App* cmd, MemprofOptions& o) {
  cmd->add_option("config", o.config, "Model config (models/*.json)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--batch", o.batch, "Batch size (default: the config's)")->check(positive());
  cmd->add_option("--micro-batch", o.micro_batch,
                  "Profile a step of batch / N micro-batches of N samples (default: the config's training.micro_batch)")
      ->check(non_negative("0 (the whole batch) or more"));
  cmd->add_option("--seq", o.seq, "Sequence length for token models (default: the config's)")->check(positive());
  cmd->add_option("--ranks", o.ranks,
                  "Profile one rank of N data-parallel ranks (mpirun -np N): its micro-batches, its optimizer "
                  "shard with --shard-optimizer")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--shard-optimizer", o.shard_optimizer,
                "ZeRO-1: each rank keeps the optimizer state of 1/N of the parameters (sets "
                "training.shard_optimizer)");
  cmd->add_option("--policy", o.policies,
                  "Comma-separated policies, e.g. none,all,every:4,sqrt,revolve:2,selective,sqrt+offload,budget:8GiB");
  cmd->add_option("--precision", o.precisions,
                  "Comma-separated precisions side by side, e.g. fp32,bf16 (default: the config's training.precision; "
                  "bf16 measured on cpu, cuda and cuda-emu, predicted on meta)");
  cmd->add_option("--device", o.device, "meta (predict, computes nothing); cpu, cuda[:N] or cuda-emu (measure too)")
      ->default_val("meta");
  cmd->add_option("--json", o.json, "Write a machine-readable report");
  cmd->add_option("--trace", o.trace, "Write a Chrome Trace Event file (Perfetto, chrome://tracing)");
  cmd->add_option("--svg", o.svg, "Write a plot of memory over the step, one line per policy");
  cmd->add_option("--html", o.html,
                  "Write a self-contained interactive page: timeline, live tensors, policies, Pareto front, layers");
  cmd->add_flag("--layers", o.layers, "Print the per-layer table of each policy");
  cmd->add_flag("--schedule", o.schedule,
                "Print each policy's schedule: the forward runs, frees, offloads, recomputes, prefetches and "
                "backward runs of a step, in the order the executor runs them");
}

// Every output file's folder exists and is writable, and --html has Chart.js, before the
// profile runs.
void check_memprof_outputs(const MemprofOptions& o) {
  check_output_path("--json", o.json);
  check_output_path("--trace", o.trace);
  check_output_path("--svg", o.svg);
  check_output_path("--html", o.html);
  if (!o.html.empty() && !memory_html_available())
    REMAT_THROW(
        "--html: this remat was built without Chart.js; install the Debian package libjs-chart.js "
        "(tools/bootstrap.sh does) and configure remat again");
}

// The precisions to profile (--precision, else the config's), each one the device computes.
std::vector<std::string> memprof_precisions(const MemprofOptions& o, const Config& cfg, const Device& dev) {
  const std::vector<std::string> precisions =
      o.precisions.empty() ? std::vector<std::string>{cfg.training.precision} : split_list("--precision", o.precisions);
  for (const std::string& p : precisions) {
    if (const std::string e = precision_error(p); !e.empty()) REMAT_THROW("--precision: ", e);
    if (p != "fp32" && !backend_for(dev).supports_bf16())
      REMAT_THROW("--precision ", p, ": not yet supported on ", dev.str(),
                  " (its kernels are fp32 only): predict it with --device meta");
  }
  return precisions;
}

// Each precision x policy: predicted on meta (with the measured device's workspace sizes),
// and measured on the device unless it is meta.
struct Profiles {
  std::vector<StepProfile> predicted, measured;
};

Profiles profile_policies(Config& cfg, const Graph& g, const std::vector<std::string>& precisions,
                          const std::string& policies, const Device& dev) {
  Profiles out;
  Backend* ws = dev.is_meta() ? nullptr : &backend_for(dev);
  for (const std::string& prec : precisions) {
    cfg.training.precision = prec;
    for (const std::string& pol : split_policies(policies)) {
      CheckpointPlan plan = resolve_policy(cfg, g, pol, ws);
      out.predicted.push_back(profile_step(cfg, g, plan, Device::meta(), true, ws));
      if (!dev.is_meta()) out.measured.push_back(profile_step(cfg, g, plan, dev));
    }
  }
  return out;
}

// --json and --html (the same report: the page embeds exactly what --json writes), --trace
// and --svg.
void write_memprof_files(const MemprofOptions& o, const Config& cfg, const Graph& g, const Device& dev,
                         const Profiles& pr) {
  const int64_t batch = cfg.training.batch;
  const std::vector<StepProfile>* measured = dev.is_meta() ? nullptr : &pr.measured;
  const auto& shown = dev.is_meta() ? pr.predicted : pr.measured;
  if (!o.json.empty() || !o.html.empty()) {
    Backend* ws = dev.is_meta() ? nullptr : &backend_for(dev);
    const std::vector<PlanCandidate> all = plan_candidates(cfg, g, ws);
    const std::vector<PlanCandidate> front = pareto_front(all);
    ProfileJsonExtras extras;
    extras.title = cfg.name + ", batch " + std::to_string(batch) + ", device " + dev.str();
    extras.candidates = &all;
    extras.front = &front;
    const nlohmann::json report = profile_json(pr.predicted, measured, extras);
    if (!o.json.empty()) write_file_atomic(o.json, report.dump(2) + "\n");
    if (!o.html.empty()) write_file_atomic(o.html, memory_html(report));
  }
  if (!o.trace.empty()) write_file_atomic(o.trace, chrome_trace(shown).dump() + "\n");
  if (!o.svg.empty())
    write_file_atomic(o.svg, memory_svg(shown, cfg.name + ", batch " + std::to_string(batch) +
                                                   ": allocated memory over one training step"));
}

int run_memprof(const MemprofOptions& o) {
  check_memprof_outputs(o);
  Config cfg = load_config(o.config);
  apply_batch_options(cfg, o.batch, o.micro_batch);
  apply_rank_options(cfg, o.ranks, o.shard_optimizer);
  const int64_t batch = cfg.training.batch;
  const Device dev = Device::parse(o.device);
  require_available(dev);
  set_device_collectives(cfg, dev);
  Graph g = build_config_graph(cfg, cfg.training.micro(), o.seq);  // one micro-batch
  const std::vector<std::string> precisions = memprof_precisions(o, cfg, dev);
  const Profiles pr = profile_policies(cfg, g, precisions, o.policies, dev);
  std::printf("remat memprof %s: %s, batch %lld%s, %lld parameters, device %s%s\n\n", o.config.c_str(),
              cfg.name.c_str(), static_cast<long long>(batch), micro_note(cfg).c_str(),
              static_cast<long long>(g.parameter_count()), dev.str().c_str(), rank_note(cfg, o.ranks).c_str());
  std::printf("%s", profile_table(pr.predicted, dev.is_meta() ? nullptr : &pr.measured).c_str());
  if (std::find_if(precisions.begin(), precisions.end(), [](const std::string& p) { return p != "fp32"; }) !=
      precisions.end())
    std::printf(
        "\nbf16 columns: bf16 activations and working weights; fp32 masters, gradients, moments and "
        "statistics\n");
  if (o.layers)
    for (const auto& p : dev.is_meta() ? pr.predicted : pr.measured) std::printf("\n%s", layer_table(p).c_str());
  if (o.schedule) {
    Backend* ws = dev.is_meta() ? nullptr : &backend_for(dev);
    for (const std::string& pol : split_policies(o.policies))
      std::printf("\n%s", compile_schedule(g, resolve_policy(cfg, g, pol, ws)).listing(g).c_str());
  }
  write_memprof_files(o, cfg, g, dev, pr);
  if (!dev.is_meta())
    for (size_t i = 0; i < pr.predicted.size(); ++i)
      if (pr.predicted[i].peak_bytes != pr.measured[i].peak_bytes) {
        std::fprintf(stderr, "remat: error: policy %s: measured peak %lld differs from the predicted %lld\n",
                     pr.predicted[i].policy.c_str(), static_cast<long long>(pr.measured[i].peak_bytes),
                     static_cast<long long>(pr.predicted[i].peak_bytes));
        return 1;
      }
  return 0;
}

}  // namespace

Runner add_memprof_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("memprof", "Profile the memory of one training step under checkpoint policies");
  auto o = std::make_shared<MemprofOptions>();
  add_memprof_options(cmd, *o);
  return [cmd, o]() -> int {
    if (!cmd->parsed()) return -1;
    return run_memprof(*o);
  };
}

// A candidate's reserved peak; "-" for one read off the unit chain's model, which counts
// allocated bytes only (plan_candidates).
static std::string reserved_text(const PlanCandidate& c) {
  return c.reserved_bytes >= c.peak_bytes ? format_bytes(c.reserved_bytes) : std::string("-");
}

Runner add_plan_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("plan", "Find the cheapest checkpoint plan that fits a memory budget; print the Pareto front");
  struct Opts {
    std::string config, budget, svg, device = "cpu";
    std::optional<int64_t> batch, micro_batch;  // unset: the config's
    int64_t seq = 0;                            // 0: the config's
    int ranks = 1;
    bool shard_optimizer = false;
    bool offload = false;
    std::string host_budget, precision, budget_of = "reserved";
    double link_gbps = 0, tflops = 0;  // 0: the declared model's
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("config", o->config, "Model config (models/*.json)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--budget", o->budget, "Memory budget, e.g. 8GiB, 512MiB, 12GB");
  cmd->add_option("--budget-of", o->budget_of,
                  "What the budget bounds: reserved (what the caching allocator holds from the device, what runs out "
                  "on a GPU) or allocated (the tensors' bytes alone)")
      ->default_val("reserved")
      ->check(CLI::IsMember({"reserved", "allocated"}));
  cmd->add_option("--precision", o->precision, "fp32 or bf16 (default: the config's training.precision)");
  cmd->add_flag("--offload", o->offload,
                "Weigh activation offload too: each plan also with +offload, ranked by modelled step time (the "
                "declared h100 model unless --link-gbps / --tflops say otherwise)");
  cmd->add_option("--host-budget", o->host_budget,
                  "With --offload: the pinned host memory a plan may hold, e.g. 64GiB");
  cmd->add_option("--link-gbps", o->link_gbps, "With --offload: host link bandwidth each way, GB/s (default 50)")
      ->check(positive_real());
  cmd->add_option("--tflops", o->tflops,
                  "With --offload: the device's sustained TFLOP/s at the config's precision (default: half the H100's "
                  "dense peak)")
      ->check(positive_real());
  cmd->add_option("--device", o->device,
                  "Plan for this device's workspace sizes: cpu, cuda[:N] or cuda-emu (simulated on meta either way)")
      ->default_val("cpu");
  cmd->add_option("--batch", o->batch, "Batch size (default: the config's)")->check(positive());
  cmd->add_option("--micro-batch", o->micro_batch,
                  "Plan at this micro-batch (default: with --budget, the largest micro-batch dividing the batch at "
                  "which a plan fits)")
      ->check(non_negative("0 (the whole batch) or more"));
  cmd->add_option("--seq", o->seq, "Sequence length for token models (default: the config's)")->check(positive());
  cmd->add_option("--ranks", o->ranks, "Plan one rank's step of N data-parallel ranks (mpirun -np N)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--shard-optimizer", o->shard_optimizer,
                "ZeRO-1: each rank keeps the optimizer state of 1/N of the parameters");
  cmd->add_option("--svg", o->svg, "Write the Pareto front (peak vs recompute FLOPs) as a plot");
  return [cmd, o]() -> int {
    if (!cmd->parsed()) return -1;
    Config cfg = load_config(o->config);
    apply_batch_options(cfg, o->batch, o->micro_batch);
    if (!o->precision.empty()) {
      if (const std::string e = precision_error(o->precision); !e.empty()) REMAT_THROW("--precision: ", e);
      cfg.training.precision = o->precision;
    }
    const int64_t batch = cfg.training.batch;
    const int64_t budget = o->budget.empty() ? 0 : parse_size(o->budget);
    const Device dev = Device::parse(o->device);
    REMAT_CHECK(!dev.is_meta(), "plan --device meta: name the device to plan for (cpu, cuda, cuda-emu)");
    require_available(dev);
    Backend* ws = &backend_for(dev);
    std::optional<MicroBatchPlan> searched;
    const bool search_micro = budget > 0 && !o->micro_batch;
    if (search_micro) {  // the search picks a micro-batch that splits over the ranks
      if (o->shard_optimizer) cfg.training.shard_optimizer = true;
      cfg.training.ranks = o->ranks;
    } else {
      apply_rank_options(cfg, o->ranks, o->shard_optimizer);
    }
    set_device_collectives(cfg, dev);
    REMAT_CHECK(o->offload || (o->host_budget.empty() && o->link_gbps == 0 && o->tflops == 0),
                "plan: --host-budget, --link-gbps and --tflops weigh offload: add --offload");
    std::optional<OffloadModel> om;
    if (o->offload) {
      om = declared_offload_model("h100", cfg.training.precision);
      if (o->link_gbps > 0 || o->tflops > 0) {
        if (o->link_gbps > 0) om->d2h_bytes_per_s = om->h2d_bytes_per_s = o->link_gbps * 1e9;
        if (o->tflops > 0) om->flops_per_s = o->tflops * 1e12;
        char buf[160];
        std::snprintf(buf, sizeof buf, "declared: %g TFLOP/s, link %g GB/s each way", om->flops_per_s / 1e12,
                      om->d2h_bytes_per_s / 1e9);
        om->name = buf;
      }
      if (!o->host_budget.empty()) om->host_budget = parse_size(o->host_budget);
    }
    const OffloadModel* model = om ? &*om : nullptr;
    const BudgetOf of = o->budget_of == "allocated" ? BudgetOf::allocated : BudgetOf::reserved;
    if (search_micro) {
      // Search the micro-batch too: the front and the answer are then at the one found.
      searched = plan_micro_batch_for_budget(cfg, budget, o->seq, ws, model, of);
      cfg = searched->config;
    }
    Graph g = build_config_graph(cfg, cfg.training.micro(), o->seq);
    std::vector<PlanCandidate> all = plan_candidates(cfg, g, ws, model);
    std::vector<PlanCandidate> front = pareto_front(all);
    // The front's reserved peaks: simulated for the plans read off the unit chain's model
    // (it counts allocated bytes), on chains short enough for that to be quick.
    if (unit_count(g) <= 128)
      for (PlanCandidate& c : front)
        if (c.reserved_bytes < c.peak_bytes)
          c.reserved_bytes = profile_step(cfg, g, c.plan, Device::meta(), false, ws).peak_reserved_bytes;
    std::printf("remat plan %s: %s, batch %lld%s%s: %zu candidate plans simulated on meta\n", o->config.c_str(),
                cfg.name.c_str(), static_cast<long long>(batch), micro_note(cfg).c_str(),
                rank_note(cfg, o->ranks).c_str(), all.size());
    int w = 24;  // the plan column: its longest name
    for (const auto& c : front) w = std::max(w, static_cast<int>(c.name.size()) + 1);
    if (model) {
      std::printf("offload weighed with the model %s%s\n", model->name.c_str(),
                  model->host_budget > 0 ? (", host budget " + format_bytes(model->host_budget)).c_str() : "");
      std::printf("\nPareto front (peak vs modelled step time):\n%-*s %12s %12s %12s %16s %10s\n", w, "plan", "peak",
                  "reserved", "host", "recompute GFLOP", "step ms");
      for (const auto& c : front)
        std::printf("%-*s %12s %12s %12s %16.3f %10.2f\n", w, c.name.c_str(), format_bytes(c.peak_bytes).c_str(),
                    reserved_text(c).c_str(), format_bytes(c.host_peak_bytes).c_str(), c.recompute_flops / 1e9,
                    c.modelled_ms);
    } else {
      std::printf("\nPareto front (peak vs recompute FLOPs):\n%-*s %14s %14s %18s\n", w, "plan", "peak", "reserved",
                  "recompute GFLOP");
      for (const auto& c : front)
        std::printf("%-*s %14s %14s %18.3f\n", w, c.name.c_str(), format_bytes(c.peak_bytes).c_str(),
                    reserved_text(c).c_str(), c.recompute_flops / 1e9);
    }
    if (!o->svg.empty())
      write_file_atomic(o->svg,
                        pareto_svg(all, front, cfg.name + ", batch " + std::to_string(batch) + ": checkpoint plans"));
    if (budget > 0) {
      PlanCandidate best = searched ? searched->best : plan_for_budget(cfg, g, budget, ws, model, of);
      std::string micro;
      if (cfg.training.micro_batches() > 1)
        micro = ", micro-batch " + std::to_string(cfg.training.micro()) + " (" +
                std::to_string(cfg.training.micro_batches()) + " per step)";
      std::printf(
          "\nbudget %s (%s): plan %s%s, peak %s allocated, %s reserved, recompute %.3f GFLOP per micro-batch\n  %s\n",
          format_bytes(budget).c_str(), o->budget_of.c_str(), best.name.c_str(), micro.c_str(),
          format_bytes(best.peak_bytes).c_str(), format_bytes(best.reserved_bytes).c_str(), best.recompute_flops / 1e9,
          best.plan.describe(g).c_str());
      if (unit_count(g) <= 128)
        std::printf("  units (. kept, s selective, R recomputed, N nested, | between segments): %s\n",
                    best.plan.unit_layout(g).c_str());
      if (best.plan.offloads()) {
        const int units = static_cast<int>(offload_units(g).size());
        const int j = split_offload_suffix(best.plan.policy).units;
        std::printf("  offload: what the first %d of %d units keep waits in pinned host memory\n",
                    j == -1 ? units - 1 : j, units);
      }
      if (model)
        std::printf("  pinned host peak %s, modelled step %.2f ms\n", format_bytes(best.host_peak_bytes).c_str(),
                    best.modelled_ms);
    }
    return 0;
  };
}

}  // namespace remat::cli
