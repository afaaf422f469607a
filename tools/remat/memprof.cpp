// `remat memprof` and `remat plan`: where the memory of a training step goes under each
// checkpoint policy, and which plan fits a budget (see docs/memory.md).
#include <cstdio>
#include <sstream>

#include "commands.h"
#include "remat/error.h"
#include "remat/io.h"
#include "remat/profile.h"

namespace remat::cli {

namespace {

std::vector<std::string> split_policies(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string p; std::getline(ss, p, ',');)
    if (!p.empty()) out.push_back(p);
  REMAT_CHECK(!out.empty(), "--policy: expected a comma-separated list of policies");
  return out;
}

}  // namespace

Runner add_memprof_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("memprof", "Profile the memory of one training step under checkpoint policies");
  struct Opts {
    std::string config, policies = "none,all,sqrt,selective", device = "meta", json, trace, svg;
    int64_t batch = -1, seq = 0;
    bool layers = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("config", o->config, "Model config (models/*.json)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--batch", o->batch, "Batch size (default: the config's)");
  cmd->add_option("--seq", o->seq, "Sequence length for token models (default: the config's)");
  cmd->add_option("--policy", o->policies,
                  "Comma-separated policies, e.g. none,all,every:4,sqrt,selective,budget:8GiB");
  cmd->add_option("--device", o->device, "meta (predict, computes nothing); cpu, cuda[:N] or cuda-emu (measure too)")
      ->default_val("meta");
  cmd->add_option("--json", o->json, "Write a machine-readable report");
  cmd->add_option("--trace", o->trace, "Write a Chrome Trace Event file (Perfetto, chrome://tracing)");
  cmd->add_option("--svg", o->svg, "Write a plot of memory over the step, one line per policy");
  cmd->add_flag("--layers", o->layers, "Print the per-layer table of each policy");
  return [cmd, o]() -> int {
    if (!cmd->parsed()) return -1;
    Config cfg = load_config(o->config);
    if (o->batch == 0 || o->batch < -1) REMAT_THROW("--batch must be positive, got ", o->batch);
    const int64_t batch = o->batch > 0 ? o->batch : cfg.training.batch;
    if (o->seq < 0) REMAT_THROW("--seq must be positive, got ", o->seq);
    const Device dev = Device::parse(o->device);
    require_available(dev);
    Graph g = build_config_graph(cfg, batch, o->seq);
    std::vector<StepProfile> predicted, measured;
    for (const std::string& pol : split_policies(o->policies)) {
      CheckpointPlan plan = resolve_policy(cfg, g, pol, dev.is_meta() ? nullptr : &backend_for(dev));
      // predicted on meta with the measured device's workspace sizes
      predicted.push_back(
          profile_step(cfg, g, plan, Device::meta(), true, dev.is_meta() ? nullptr : &backend_for(dev)));
      if (!dev.is_meta()) measured.push_back(profile_step(cfg, g, plan, dev));
    }
    std::printf("remat memprof %s: %s, batch %lld, %lld parameters, device %s\n\n", o->config.c_str(), cfg.name.c_str(),
                static_cast<long long>(batch), static_cast<long long>(g.parameter_count()), dev.str().c_str());
    std::printf("%s", profile_table(predicted, dev.is_meta() ? nullptr : &measured).c_str());
    if (o->layers)
      for (const auto& p : dev.is_meta() ? predicted : measured) std::printf("\n%s", layer_table(p).c_str());
    const auto& shown = dev.is_meta() ? predicted : measured;
    if (!o->json.empty())
      write_file_atomic(o->json, profile_json(predicted, dev.is_meta() ? nullptr : &measured).dump(2) + "\n");
    if (!o->trace.empty()) write_file_atomic(o->trace, chrome_trace(shown).dump() + "\n");
    if (!o->svg.empty())
      write_file_atomic(o->svg, memory_svg(shown, cfg.name + ", batch " + std::to_string(batch) +
                                                      ": allocated memory over one training step"));
    if (!dev.is_meta())
      for (size_t i = 0; i < predicted.size(); ++i)
        if (predicted[i].peak_bytes != measured[i].peak_bytes) {
          std::fprintf(stderr, "remat: error: policy %s: measured peak %lld differs from the predicted %lld\n",
                       predicted[i].policy.c_str(), static_cast<long long>(measured[i].peak_bytes),
                       static_cast<long long>(predicted[i].peak_bytes));
          return 1;
        }
    return 0;
  };
}

Runner add_plan_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("plan", "Find the cheapest checkpoint plan that fits a memory budget; print the Pareto front");
  struct Opts {
    std::string config, budget, svg, device = "cpu";
    int64_t batch = -1, seq = 0;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("config", o->config, "Model config (models/*.json)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--budget", o->budget, "Memory budget, e.g. 8GiB, 512MiB, 12GB");
  cmd->add_option("--device", o->device,
                  "Plan for this device's workspace sizes: cpu, cuda[:N] or cuda-emu (simulated on meta either way)")
      ->default_val("cpu");
  cmd->add_option("--batch", o->batch, "Batch size (default: the config's)");
  cmd->add_option("--seq", o->seq, "Sequence length for token models (default: the config's)");
  cmd->add_option("--svg", o->svg, "Write the Pareto front (peak vs recompute FLOPs) as a plot");
  return [cmd, o]() -> int {
    if (!cmd->parsed()) return -1;
    Config cfg = load_config(o->config);
    if (o->batch == 0 || o->batch < -1) REMAT_THROW("--batch must be positive, got ", o->batch);
    if (o->seq < 0) REMAT_THROW("--seq must be positive, got ", o->seq);
    const int64_t batch = o->batch > 0 ? o->batch : cfg.training.batch;
    Graph g = build_config_graph(cfg, batch, o->seq);
    const int64_t budget = o->budget.empty() ? 0 : parse_size(o->budget);
    const Device dev = Device::parse(o->device);
    REMAT_CHECK(!dev.is_meta(), "plan --device meta: name the device to plan for (cpu, cuda, cuda-emu)");
    require_available(dev);
    Backend* ws = &backend_for(dev);
    std::vector<PlanCandidate> all = plan_candidates(cfg, g, ws);
    std::vector<PlanCandidate> front = pareto_front(all);
    std::printf("remat plan %s: %s, batch %lld: %zu candidate plans simulated on meta\n\n", o->config.c_str(),
                cfg.name.c_str(), static_cast<long long>(batch), all.size());
    std::printf("Pareto front (peak vs recompute FLOPs):\n%-24s %14s %18s\n", "plan", "peak", "recompute GFLOP");
    for (const auto& c : front)
      std::printf("%-24s %14s %18.3f\n", c.name.c_str(), format_bytes(c.peak_bytes).c_str(), c.recompute_flops / 1e9);
    if (!o->svg.empty())
      write_file_atomic(o->svg,
                        pareto_svg(all, front, cfg.name + ", batch " + std::to_string(batch) + ": checkpoint plans"));
    if (budget > 0) {
      PlanCandidate best = plan_for_budget(cfg, g, budget, ws);
      std::printf("\nbudget %s: plan %s, peak %s, recompute %.3f GFLOP\n  %s\n", format_bytes(budget).c_str(),
                  best.name.c_str(), format_bytes(best.peak_bytes).c_str(), best.recompute_flops / 1e9,
                  best.plan.describe(g).c_str());
    }
    return 0;
  };
}

}  // namespace remat::cli
