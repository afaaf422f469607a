// The memory profiler and the budget planner.
//
// profile_step runs one full training step (parameters, gradients, optimizer state, a
// batch, forward, backward with recompute, optimizer update) of a config under a plan on
// a device, with the allocator's event log on. On `meta` nothing is computed and the
// figures are the plan's exact prediction; on cpu/cuda the step runs for real and the
// measured figures must equal the prediction to the byte.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "remat/config.h"
#include "remat/memory.h"
#include "remat/plan.h"

namespace remat {

struct LayerProfile {
  std::string name, type, kind;
  bool keep = true;         // the plan keeps its output (false: recomputed)
  bool keep_extras = true;  // ... and its extras (false with keep: re-run for them)
  int64_t saved_bytes = 0;  // its forward allocations still held when forward ends
  double forward_flops = 0.0;
};

struct LayerSpan {
  int layer = -1;
  Phase phase = Phase::forward;
  uint64_t begin = 0, end = 0;  // allocator event indices
};

struct StepProfile {
  std::string policy;
  std::string precision = "fp32";  // the config's training.precision (bf16 where the backend supports_bf16)
  Device device;
  int64_t base_bytes = 0;           // allocated before the step (not counted below)
  int64_t base_reserved_bytes = 0;  // reserved before the step
  int ranks = 1;                    // data-parallel ranks: the figures are one rank's
  bool shard_optimizer = false;     // ZeRO-1 optimizer state
  int64_t peak_bytes = 0;           // peak allocated during the step
  CategoryCounts peak_by_category;  // split of that peak
  CategoryCounts category_peaks;    // each category's own high-water mark in the step (e.g. activations)
  int64_t peak_reserved_bytes = 0;
  // Activation offload (the plan offloads): the pinned host pool's peak allocated and the
  // bytes it reserved from the system (Executor::host_pool); 0 without offload.
  int64_t host_peak_bytes = 0;
  int64_t host_reserved_bytes = 0;
  double forward_flops = 0, backward_flops = 0, recompute_flops = 0, optimizer_flops = 0;
  double step_flops() const { return forward_flops + backward_flops + recompute_flops + optimizer_flops; }
  int64_t recomputed_layers = 0;
  std::optional<double> step_ms;  // measured on real devices
  std::vector<LayerProfile> layers;
  std::vector<MemoryEvent> events;
  std::vector<std::string> owners;  // names for MemoryEvent::owner
  std::vector<std::string> shapes;  // names for MemoryEvent::shape ("[2, 64] f32")
  std::vector<LayerSpan> spans;
  std::vector<std::string> layer_names;  // by graph layer id (for spans)
  // With events and offload: the pinned host pool's events, each numbered by the device's
  // (seq: the device event it came just before; CachingAllocator::set_event_clock), and
  // the names of their owners (the layers whose products they hold).
  std::vector<MemoryEvent> host_events;
  std::vector<std::string> host_owners;
};

struct ProfileInput {
  const Config* config = nullptr;
  int64_t batch = 0;
  int64_t seq = 0;  // 0 = the config's
};

// The model of a config at a batch (and sequence length), "$vocab" resolved from the data
// the config names (the text corpus is read for its vocabulary; synthetic sets use data.vocab).
Graph build_config_graph(const Config& cfg, int64_t batch, int64_t seq);

// On meta, `workspace_model` (a real backend) answers the workspace queries, so the
// prediction is for that backend (default: the cpu's).
// cfg.training.ranks > 1: the step of one of that many data-parallel ranks (g is then the
// graph of the rank's micro-batch): no device accumulation buffer (the ordered reduction
// sums in host memory, docs/distributed.md). training.shard_optimizer: the optimizer
// state of one rank's shard (ZeRO-1; every rank's shard has the same size).
StepProfile profile_step(const Config& cfg, const Graph& g, const CheckpointPlan& plan, Device device,
                         bool keep_events = true, Backend* workspace_model = nullptr);

// Parses a byte size: "123", "512MiB", "12GiB", "1.5G" (K/M/G/T and KiB/MiB/GiB/TiB are
// powers of 1024; KB/MB/GB/TB powers of 1000). Throws a clear error otherwise.
int64_t parse_size(const std::string& s);

// What a memory budget bounds: the bytes allocated at the step's peak, or the bytes the
// caching allocator reserves from the device at its peak — allocated plus the free blocks
// it caches, what runs out on a GPU. Both are predicted on meta exactly (the same allocator
// runs over a meta raw allocator).
enum class BudgetOf { allocated, reserved };

struct PlanCandidate {
  std::string name;
  CheckpointPlan plan;
  int64_t peak_bytes = 0;
  double recompute_flops = 0.0;
  int64_t reserved_bytes = 0;  // the allocator's peak reserved bytes
  int64_t peak(BudgetOf of) const { return of == BudgetOf::reserved ? reserved_bytes : peak_bytes; }
  int64_t host_peak_bytes = 0;  // pinned host memory of an offloading plan (0: none)
  double forward_flops = 0.0, backward_flops = 0.0, step_flops = 0.0;
  double modelled_ms = 0.0;  // under the planner's OffloadModel; 0 without one
  // What the planner ranks by: modelled_ms where modelled, else recompute FLOPs.
  double cost() const { return modelled_ms > 0.0 ? modelled_ms : recompute_flops; }
};

// What the planner weighs offload with (docs/memory.md, "Planning with offload"): the
// device's sustained FLOP rate and the host link's bandwidth each way, and the pinned host
// memory a plan may hold. A step is modelled as its FLOPs at that rate plus the copies'
// time that compute cannot hide: the copies out overlap forward, the copies back overlap
// backward and recompute, each beyond them adds.
struct OffloadModel {
  std::string name;  // what the figures are, e.g. "h100 (declared)"
  double flops_per_s = 0.0;
  double d2h_bytes_per_s = 0.0, h2d_bytes_per_s = 0.0;
  int64_t host_budget = 0;  // 0: no limit
  double step_ms(const PlanCandidate& c) const;
};
// The declared model of a device kind: "h100" (FACTS: H100 SXM; sustained at half the
// dense peak of the precision, fp32 67 and bf16 989 TFLOP/s; its PCIe Gen5 x16 host link
// at 50 GB/s each way of 64). Throws naming the kinds known.
OffloadModel declared_offload_model(const std::string& kind, const std::string& precision);

// A plan from a mode per unit: 0 keep, 1 selective (GEMM/conv/embedding outputs kept, the
// rest recomputed), 2 full recompute; consecutive full units with the same group form one
// segment.
struct UnitModeSpec {
  int mode = 0;
  int group = 0;
};
CheckpointPlan plan_from_unit_modes(const Graph& g, const std::string& name, const std::vector<UnitModeSpec>& modes);
int64_t unit_count(const Graph& g);

// Candidate plans, each simulated exactly on meta: none, selective, for each K segments of
// K units recomputed in full ("every:K") or keeping GEMM/conv outputs inside the segments
// ("every:K+selective"), the first m units recomputed and the rest selective or kept, and
// revolve:S for S in 1 (up to 64 units), 2, 3, 4, 6, 8. K and m take every value up to 24 units; on deeper
// models 1-8, then steps of a quarter, √n and its neighbours, and n (about 4 log n values).
// `workspace_model` (here and below): the backend whose workspace sizes the simulation
// uses (default: cpu's); pass the target device's backend to plan for a GPU.
// With `offload`, each candidate also with "+offload" (add_offload), every one ranked by
// its modelled step time.
std::vector<PlanCandidate> plan_candidates(const Config& cfg, const Graph& g, Backend* workspace_model = nullptr,
                                           const OffloadModel* offload = nullptr);
// The Pareto front (peak vs cost(): modelled time, or recompute FLOPs) of the candidates,
// by increasing peak.
std::vector<PlanCandidate> pareto_front(std::vector<PlanCandidate> c);
// The candidate of least cost() whose peak fits (and, with `offload`, whose pinned host
// peak fits its host budget; the search runs over the plans with and without offload);
// if none fits, an error that gives the smallest achievable peak and the plan that
// reaches it.
// `of`: what the budget bounds (allocated by default here; `remat plan` and budget:SIZE
// plan against reserved).
PlanCandidate plan_for_budget(const Config& cfg, const Graph& g, int64_t budget, Backend* workspace_model = nullptr,
                              const OffloadModel* offload = nullptr, BudgetOf of = BudgetOf::allocated);

// Gradient accumulation as a second lever: the largest micro-batch dividing
// cfg.training.batch (the whole batch first; with cfg.training.ranks R, one that gives a
// multiple of R micro-batches) at which some plan fits the budget, and the
// cheapest plan at it (its peak counts the accumulation buffer, profile_step). If none
// fits even at micro-batch 1, the error of plan_for_budget at micro-batch 1.
struct MicroBatchPlan {
  int64_t micro_batch = 0;
  Config config;  // cfg with training.micro_batch set
  Graph graph;    // at the micro-batch
  PlanCandidate best;
};
MicroBatchPlan plan_micro_batch_for_budget(const Config& cfg, int64_t budget, int64_t seq = 0,
                                           Backend* workspace_model = nullptr, const OffloadModel* offload = nullptr,
                                           BudgetOf of = BudgetOf::allocated);

// A plan for a policy string, including "budget:SIZE" and "budget:SIZE+offload" (the
// latter with declared_offload_model("h100", the config's precision), no host limit); a
// budget bounds the reserved bytes (BudgetOf::reserved).
CheckpointPlan resolve_policy(const Config& cfg, const Graph& g, const std::string& policy,
                              Backend* workspace_model = nullptr);

// Reports.
std::string profile_table(const std::vector<StepProfile>& ps, const std::vector<StepProfile>* measured);
std::string layer_table(const StepProfile& p);
// A table of where the memory of a measured step went, by category, at its peak (what
// `remat train` prints after a run).
std::string memory_report(const MemoryStats& s, const std::string& title);
// What profile_json adds beside the policies: a title, and the planner's candidates and
// Pareto front (the page draws them).
struct ProfileJsonExtras {
  std::string title;
  const std::vector<PlanCandidate>* candidates = nullptr;
  const std::vector<PlanCandidate>* front = nullptr;
};
// Each policy's figures, per-layer table and, when the profile kept its events, its
// "timeline" (step_timeline_json); format "remat-memprof-2" (docs/memory.md).
nlohmann::json profile_json(const std::vector<StepProfile>& predicted, const std::vector<StepProfile>* measured,
                            const ProfileJsonExtras& extras = {});
// Bytes live over the step's allocator events by series (timeline_series(): the memory
// categories with activations split into forward-made and recomputed), merged to at most
// about `max_points` points, each the event of most bytes live in its stretch (so the peak
// is one of them, exact); the `top_k` largest tensors live at each point; every tensor live
// at the peak ("live_at_peak", largest first); phases and layer spans in event indices.
nlohmann::json step_timeline_json(const StepProfile& p, size_t max_points = 1000, size_t top_k = 10);
const std::vector<std::string>& timeline_series();
// The self-contained HTML page of a profile_json report (Chart.js and the data inline, no
// network). Throws, naming the Debian package, when remat was built without Chart.js.
std::string memory_html(const nlohmann::json& report);
bool memory_html_available();
nlohmann::json chrome_trace(const std::vector<StepProfile>& ps);
std::string memory_svg(const std::vector<StepProfile>& ps, const std::string& title);
std::string pareto_svg(const std::vector<PlanCandidate>& all, const std::vector<PlanCandidate>& front,
                       const std::string& title);

}  // namespace remat
