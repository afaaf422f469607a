// One training step under a plan, profiled; and the budget planner built on it.
#include "remat/profile.h"

#include "remat/chain_planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "remat/chain_planner.h"
#include "remat/data.h"
#include "remat/error.h"
#include "remat/executor.h"
#include "remat/log.h"
#include "remat/optim.h"

namespace remat {

Graph build_config_graph(const Config& cfg, int64_t batch, int64_t seq) {
  nlohmann::json model = cfg.model;
  if (seq > 0)
    REMAT_CHECK(set_token_seq_len(model, seq) > 0, cfg.source, ": --seq applies to models with token inputs only");
  std::map<std::string, int64_t> vars;
  // The tokenizer of a translation corpus has data.vocab pieces (checked when it loads).
  if (cfg.data.dataset == "synthetic_text" || cfg.data.dataset == "translation") vars["vocab"] = cfg.data.vocab;
  if (cfg.data.dataset == "text" && model.dump().find("\"$vocab\"") != std::string::npos) {
    TextDataset t;
    if (cfg.data.path.empty())
      t = load_text_corpus(default_text_corpus_dir());
    else if (std::filesystem::is_directory(cfg.data.path))
      t = load_text_corpus(cfg.data.path);
    else
      t = load_text(cfg.data.path);
    vars["vocab"] = t.vocab_size();
  }
  return build_graph(model, batch, cfg.source, vars);
}

namespace {

// A batch of random values for every model input, drawn in the order the model declares
// them: f32 inputs uniform in [-1, 1), i32 inputs ids below the smallest bound their
// readers state (Layer::input_id_range: an embedding's vocabulary, a loss's classes) and
// at least the largest least value (Layer::input_id_min: attention's key lengths, 1).
Batch synthetic_batch(const Graph& g, Device d, uint64_t seed) {
  TagScope scope(MemoryCategory::input, "data", Phase::setup);
  Batch b;
  std::mt19937_64 rng(seed);
  for (int id : g.input_ids) {
    const Layer& in = g.layer(id);
    if (d.is_meta()) {
      b.set(in.name, Tensor::empty(in.out_shape, d, in.out_dtype));
      continue;
    }
    if (in.out_dtype == DType::i32) {
      int64_t range = 0, lo = 0;  // the ids every reader of the input accepts (range 0: no bound stated)
      for (int i = 0; i < g.size(); ++i)
        for (size_t k = 0; k < g.layer(i).inputs.size(); ++k) {
          if (g.layer(i).inputs[k] != id) continue;
          if (const int64_t r = g.layer(i).input_id_range(static_cast<int>(k)); r > 0)
            range = range > 0 ? std::min(range, r) : r;
          lo = std::max(lo, g.layer(i).input_id_min(static_cast<int>(k)));
        }
      range = std::max<int64_t>(range, lo + 1);
      std::vector<int32_t> ids(static_cast<size_t>(in.out_shape.numel()));
      for (auto& x : ids)
        x = static_cast<int32_t>(lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(range - lo)));
      b.set(in.name, Tensor::from_ints(ids, in.out_shape, d));
    } else {
      std::vector<float> v(static_cast<size_t>(in.out_shape.numel()));
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      for (auto& x : v) x = u(rng);
      b.set(in.name, Tensor::from_vector(v, in.out_shape, d));
    }
  }
  return b;
}

// Gradient accumulation on one rank: the running sum of the micro-batches' gradients lives
// through the step beside the gradients (src/train/grad_reduce.cpp); the profiled graph is
// that of one micro-batch. Under device collectives, the device exchange of the ordered
// reduction (NCCL): the flat gradient sent and received, and this rank's shard of the
// running sum, as GradReducer makes them.
std::vector<Tensor> reduction_buffers(const Config& cfg, const ParamStore& params, Device device, int ranks) {
  std::vector<Tensor> accumulation;
  if (cfg.training.device_collectives) {
    TagScope scope(MemoryCategory::gradient, "reduction", Phase::setup);
    const FlatLayout layout(params, ranks);
    accumulation.push_back(Tensor::zeros(Shape{layout.size}, device));
    accumulation.push_back(Tensor::zeros(Shape{layout.size}, device));
    accumulation.push_back(Tensor::zeros(Shape{layout.shard}, device));
  } else if (cfg.training.micro_batches() > 1 && ranks == 1) {
    TagScope scope(MemoryCategory::gradient, "accumulation", Phase::setup);
    for (const Tensor& gr : params.grads)
      if (gr.defined()) accumulation.push_back(Tensor::empty(gr.shape(), gr.device()));
  }
  return accumulation;
}

// Runs one step as the trainer does (parameters, optimizer, reduction buffers, a synthetic
// batch, forward + backward, the optimizer's update) and records its time and FLOPs in p;
// with keep_events, each layer's span of allocator events in `spans`. Then a second step,
// unrecorded, for the bytes a run reserves from its second step on.
void run_step(const Config& cfg, const Graph& g, const CheckpointPlan& plan, Device device, Backend& be,
              bool keep_events, StepProfile& p, std::vector<LayerSpan>& spans) {
  CachingAllocator& alloc = allocator_for(device);
  ParamStore params(g, device, cfg.training.seed);
  // As the trainer makes it: rank 0's shard (all shards are the same size) under ZeRO-1.
  Optimizer opt(cfg.optimizer, params, be, 0, cfg.training.shard_optimizer ? p.ranks : 0);
  const std::vector<Tensor> accumulation = reduction_buffers(cfg, params, device, p.ranks);
  Batch batch = synthetic_batch(g, device, cfg.training.seed);
  ExecOptions eo;
  eo.read_loss = false;  // as the trainer: the loss tensor lives to the step's end
  bool first_step = true;
  if (keep_events) {
    eo.on_layer = [&](int i, Phase ph, bool begin) {
      if (!first_step) return;
      if (begin)
        spans.push_back({i, ph, alloc.event_count(), 0});
      else
        spans.back().end = alloc.event_count();
    };
  }
  Executor ex(g, params, be, plan, eo);
  CachingAllocator* host = keep_events ? ex.host_pool() : nullptr;
  if (host) {  // the host tier's events, on the device's timeline
    host->set_event_clock(&alloc);
    host->set_event_logging(true);
  }
  RngGenerator gen(cfg.training.seed);
  const auto t0 = std::chrono::steady_clock::now();
  StepStats st = ex.train_step(batch, gen);
  opt.step(cfg.optimizer.lr);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!device.is_meta()) p.step_ms = ms;
  p.forward_flops = st.forward_flops;
  p.backward_flops = st.backward_flops;
  p.recompute_flops = st.recompute_flops;
  p.recomputed_layers = st.recomputed_layers;
  if (const CachingAllocator* pool = ex.host_pool()) {
    const MemoryStats hs = pool->stats();
    p.host_peak_bytes = hs.peak_allocated;
    p.host_reserved_bytes = hs.peak_reserved;
  }
  if (host) {
    p.host_events = host->events();
    p.host_owners = host->owner_names();
    host->set_event_logging(false);
    host->set_event_clock(nullptr);
  }
  // A second step, not recorded: a run's later steps start from the blocks the first left
  // cached, which the allocator may split otherwise than the first step's fresh segments,
  // so they can reserve more (from the second step on, the same each step; docs/memory.md,
  // "Reserved memory"). The reserved peaks are what a run holds from then on.
  first_step = false;
  alloc.set_event_logging(false);
  st = StepStats{};  // as the trainer's: the step's loss and batch freed, the next batch made
  batch = Batch{};
  batch = synthetic_batch(g, device, cfg.training.seed);
  st = ex.train_step(batch, gen);
  opt.step(cfg.optimizer.lr);
  if (const CachingAllocator* pool = ex.host_pool()) {
    const MemoryStats hs = pool->stats();
    p.host_peak_bytes = std::max(p.host_peak_bytes, hs.peak_allocated);
    p.host_reserved_bytes = std::max(p.host_reserved_bytes, hs.peak_reserved);
  }
  p.optimizer_flops = (cfg.optimizer.type == "adamw" ? 12.0 : 4.0) * static_cast<double>(g.parameter_count());
}

// The step's peaks, counted from the base (what the allocator held before the step): over
// run_step's two steps, which allocate alike; the reserved peak is the second's (reserved
// bytes are never given back within a run).
void record_peaks(StepProfile& p, const MemoryStats& base, const MemoryStats& s) {
  p.base_bytes = base.allocated;
  p.base_reserved_bytes = base.reserved;
  p.peak_bytes = s.peak_allocated - base.allocated;
  for (int c = 0; c < kNumMemoryCategories; ++c)
    p.peak_by_category.bytes[static_cast<size_t>(c)] =
        s.by_category_at_peak.bytes[static_cast<size_t>(c)] - base.by_category.bytes[static_cast<size_t>(c)];
  for (int c = 0; c < kNumMemoryCategories; ++c)  // reset_peak() started each at the base's bytes
    p.category_peaks.bytes[static_cast<size_t>(c)] =
        s.peak_by_category.bytes[static_cast<size_t>(c)] - base.by_category.bytes[static_cast<size_t>(c)];
  p.peak_reserved_bytes = s.peak_reserved - base.reserved;
}

// Per layer: its plan flags, its FLOPs and what its forward allocated and still holds when
// the forward pass ends (from the recorded events and spans; 0 without them).
void record_layers(StepProfile& p, const Graph& g, const CheckpointPlan& plan) {
  uint64_t forward_end = 0;
  for (const auto& sp : p.spans)
    if (sp.phase == Phase::forward) forward_end = std::max(forward_end, sp.end);
  std::map<uint64_t, uint64_t> freed_at;
  for (const auto& e : p.events)
    if (e.kind == MemoryEvent::Kind::free) freed_at[e.alloc_id] = e.seq;
  std::map<std::string, int64_t> saved;
  for (const auto& e : p.events) {
    if (e.kind != MemoryEvent::Kind::alloc || e.phase != Phase::forward || e.seq >= forward_end) continue;
    auto it = freed_at.find(e.alloc_id);
    if (it == freed_at.end() || it->second >= forward_end) saved[p.owners[e.owner]] += e.bytes;
  }
  for (int i = 0; i < g.size(); ++i) p.layer_names.push_back(g.layer(i).name);
  for (int i = 0; i < g.size(); ++i) {
    const Layer& l = g.layer(i);
    if (l.kind() == LayerKind::input) continue;
    p.layers.push_back({l.name, l.type, layer_kind_name(l.kind()), static_cast<bool>(plan.keep[static_cast<size_t>(i)]),
                        static_cast<bool>(plan.keep_extras[static_cast<size_t>(i)]),
                        saved.count(l.name) ? saved[l.name] : 0, l.forward_flops()});
  }
}

}  // namespace

StepProfile profile_step(const Config& cfg, const Graph& g, const CheckpointPlan& plan, Device device, bool keep_events,
                         Backend* workspace_model) {
  const int ranks = cfg.training.ranks;
  REMAT_CHECK(ranks >= 1, "profile: ", ranks, " ranks");
  StepProfile p;
  p.ranks = ranks;
  p.shard_optimizer = cfg.training.shard_optimizer;
  p.policy = plan.policy;
  p.device = device;
  p.precision = cfg.training.precision;
  std::unique_ptr<Backend> modelled;
  if (device.is_meta() && workspace_model) modelled = make_meta_backend(workspace_model);
  Backend& be = modelled ? *modelled : backend_for(device);
  REMAT_CHECK(p.precision == "fp32" || be.supports_bf16(), "training.precision ", p.precision,
              ": not yet supported on ", device.str(), " (its kernels are fp32 only; predict it on meta)");
  if (p.precision == "bf16" && !device.is_meta())
    if (const std::string e = bf16_layer_error(g); !e.empty())
      REMAT_THROW(cfg.source, ": training.precision bf16: ", e);
  CachingAllocator& alloc = allocator_for(device);
  alloc.empty_cache();
  const MemoryStats base = alloc.stats();
  alloc.clear_events();
  alloc.set_event_logging(keep_events);
  alloc.reset_peak();
  std::vector<LayerSpan> spans;
  ActivationDTypeScope precision(p.precision == "bf16" ? DType::bf16 : DType::f32);
  try {
    run_step(cfg, g, plan, device, be, keep_events, p, spans);
  } catch (...) {
    alloc.set_event_logging(false);
    alloc.clear_events();
    throw;
  }
  record_peaks(p, base, alloc.stats());
  if (keep_events) {
    p.events = alloc.events();
    p.owners = alloc.owner_names();
    p.shapes = alloc.shape_names();
    p.spans = spans;
  }
  alloc.set_event_logging(false);
  alloc.clear_events();
  record_layers(p, g, plan);
  return p;
}

int64_t parse_size(const std::string& s) {
  auto bad = [&]() -> int64_t {
    REMAT_THROW("malformed size \"", s,
                "\" (expected a number with an optional unit: B, K, M, G, T, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  };
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    return bad();
  }
  if (!(v >= 0) || !std::isfinite(v)) return bad();
  std::string unit = s.substr(pos);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  static const std::map<std::string, double> units{{"", 1},
                                                   {"B", 1},
                                                   {"K", 1024.0},
                                                   {"M", 1048576.0},
                                                   {"G", 1073741824.0},
                                                   {"T", 1099511627776.0},
                                                   {"KiB", 1024.0},
                                                   {"MiB", 1048576.0},
                                                   {"GiB", 1073741824.0},
                                                   {"TiB", 1099511627776.0},
                                                   {"KB", 1e3},
                                                   {"MB", 1e6},
                                                   {"GB", 1e9},
                                                   {"TB", 1e12}};
  auto it = units.find(unit);
  if (it == units.end()) return bad();
  const double bytes = v * it->second;
  if (bytes > 9e18) return bad();
  return static_cast<int64_t>(bytes);
}

namespace {

PlanCandidate simulate(const Config& cfg, const Graph& g, const std::string& name, const CheckpointPlan& plan,
                       Backend* ws, const OffloadModel* om = nullptr) {
  StepProfile p = profile_step(cfg, g, plan, Device::meta(), /*keep_events=*/false, ws);
  CheckpointPlan named = plan;
  named.policy = name;
  PlanCandidate c{name, named, p.peak_bytes, p.recompute_flops};
  c.reserved_bytes = p.peak_reserved_bytes;
  c.host_peak_bytes = p.host_peak_bytes;
  c.forward_flops = p.forward_flops;
  c.backward_flops = p.backward_flops;
  c.step_flops = p.step_flops();
  if (om) c.modelled_ms = om->step_ms(c);
  return c;
}

// The same plan with what it keeps offloaded (add_offload), simulated; nullopt where it
// offloads nothing (one unit).
std::optional<PlanCandidate> simulate_offloaded(const Config& cfg, const Graph& g, const PlanCandidate& c, Backend* ws,
                                                const OffloadModel* om) {
  CheckpointPlan p = c.plan;
  add_offload(g, p);
  if (!p.offloads()) return std::nullopt;
  return simulate(cfg, g, c.name + "+offload", p, ws, om);
}

// A plan the unit program chose, simulated, named by how many units each mode has and, up
// to 24 units, the plan's layout (CheckpointPlan::unit_layout), e.g. "units: 2 full (1
// segment), 4 selective [sss sRR]"; with its first `offloaded` units offloaded where
// that is positive ("... +offload:3").
PlanCandidate simulate_unit_modes(const Config& cfg, const Graph& g, const std::vector<UnitModeSpec>& modes,
                                  Backend* ws, const OffloadModel* om = nullptr, int offloaded = 0) {
  int count[3] = {0, 0, 0}, segments = 0;
  for (size_t u = 0; u < modes.size(); ++u) {
    ++count[modes[u].mode];
    segments += modes[u].mode == 2 && (u == 0 || modes[u - 1].mode != 2 || modes[u - 1].group != modes[u].group);
  }
  std::string name = "units:";
  if (count[2] > 0)
    name += " " + std::to_string(count[2]) + " full (" + std::to_string(segments) +
            (segments == 1 ? " segment)" : " segments)");
  if (count[1] > 0) name += std::string(count[2] ? "," : "") + " " + std::to_string(count[1]) + " selective";
  if (count[0] > 0) name += std::string(count[2] || count[1] ? "," : "") + " " + std::to_string(count[0]) + " kept";
  CheckpointPlan plan = plan_from_unit_modes(g, "units", modes);
  if (modes.size() <= 24) name += " [" + plan.unit_layout(g) + "]";  // tells apart plans of the same counts
  if (offloaded > 0) {
    add_offload(g, plan, offloaded);
    name += " +offload:" + std::to_string(offloaded);
  }
  return simulate(cfg, g, name, plan, ws, om);
}

// The longest segment the unit program tries: any up to 64 units; on longer chains 2√n (a
// recomputed segment longer than that holds more than the √n plan's whole peak).
int unit_program_longest_segment(int64_t n) {
  return n <= 64 ? 0 : static_cast<int>(2 * std::ceil(std::sqrt(static_cast<double>(n))));
}

}  // namespace

CheckpointPlan plan_from_unit_modes(const Graph& g, const std::string& name, const std::vector<UnitModeSpec>& modes) {
  const std::vector<Segment> us = plan_units(g);
  REMAT_CHECK(modes.size() == us.size(), "plan: ", modes.size(), " unit modes for ", us.size(), " units");
  std::vector<bool> keep(static_cast<size_t>(g.size()), true), keep_extras = keep;
  std::vector<Segment> segs;
  for (size_t u = 0; u < us.size(); ++u) {
    const UnitModeSpec& m = modes[u];
    if (m.mode == 0) continue;
    if (m.mode == 1) {
      keep_selective(g, us[u], keep, keep_extras);
    } else {
      for (int i = us[u].begin; i < us[u].end; ++i)
        keep[static_cast<size_t>(i)] = keep_extras[static_cast<size_t>(i)] = false;
    }
    // A full unit joins the previous segment when both belong to the same group.
    if (m.mode == 2 && u > 0 && modes[u - 1].mode == 2 && modes[u - 1].group == m.group && !segs.empty() &&
        segs.back().end == us[u].begin)
      segs.back().end = us[u].end;
    else
      segs.push_back({us[u].begin, us[u].end, true});
  }
  return make_plan_from_segments(g, name, segs, keep, keep_extras);
}

double OffloadModel::step_ms(const PlanCandidate& c) const {
  REMAT_CHECK(flops_per_s > 0 && d2h_bytes_per_s > 0 && h2d_bytes_per_s > 0, "offload model \"", name,
              "\": the FLOP rate and both link bandwidths must be positive");
  const double forward_s = c.forward_flops / flops_per_s;
  const double backward_s = (c.step_flops - c.forward_flops) / flops_per_s;  // backward, recompute, optimizer
  const auto bytes = static_cast<double>(c.host_peak_bytes);  // every offloaded byte goes out and back once
  const double exposed =
      std::max(0.0, bytes / d2h_bytes_per_s - forward_s) + std::max(0.0, bytes / h2d_bytes_per_s - backward_s);
  return 1e3 * (forward_s + backward_s + exposed);
}

OffloadModel declared_offload_model(const std::string& kind, const std::string& precision) {
  REMAT_CHECK(kind == "h100", "unknown device model \"", kind, "\" (known: h100)");
  REMAT_CHECK(precision == "fp32" || precision == "bf16", "offload model: precision \"", precision,
              "\" (expected fp32 or bf16)");
  OffloadModel m;
  m.name = "h100 (declared: " + precision + " at half of " + (precision == "bf16" ? "989" : "67") +
           " TFLOP/s, PCIe Gen5 x16 at 50 GB/s each way)";
  m.flops_per_s = 0.5 * (precision == "bf16" ? 989e12 : 67e12);
  m.d2h_bytes_per_s = m.h2d_bytes_per_s = 50e9;
  return m;
}

namespace {
std::vector<PlanCandidate> plain_candidates(const Config& cfg, const Graph& g, Backend* ws);
}

std::vector<PlanCandidate> plan_candidates(const Config& cfg, const Graph& g, Backend* ws_in, const OffloadModel* om) {
  std::vector<PlanCandidate> out = plain_candidates(cfg, g, ws_in);
  if (!om) return out;
  const size_t plain = out.size();
  for (size_t i = 0; i < plain; ++i) {
    out[i].modelled_ms = om->step_ms(out[i]);
    if (auto c = simulate_offloaded(cfg, g, out[i], ws_in, om)) out.push_back(*c);
  }
  if (om->host_budget > 0)  // what the host cannot hold is no candidate
    out.erase(std::remove_if(out.begin(), out.end(),
                             [&](const PlanCandidate& c) { return c.host_peak_bytes > om->host_budget; }),
              out.end());
  return out;
}

namespace {

// The candidates without offload (plan_candidates' list).
std::vector<PlanCandidate> plain_candidates(const Config& cfg, const Graph& g, Backend* ws) {
  std::vector<PlanCandidate> out;
  out.push_back(simulate(cfg, g, "none", make_plan(g, "none"), ws));
  out.push_back(simulate(cfg, g, "selective", make_plan(g, "selective"), ws));
  const std::vector<Segment> us = plan_units(g);
  const auto n = static_cast<int64_t>(us.size());
  // Plans of one mode per unit (every:K, the mixed ones) are read off the unit chain's
  // model, which equals their simulation to the byte and the FLOP (chain_planner.h; tested
  // on every such plan of differing chains and on these candidates of a deep one): four
  // simulations instead of one per candidate, which on deep chains is most of the report's
  // time (1024 blocks: ~100 candidates).
  if (n == 0) return out;
  const UnitChainModel model = measure_unit_chain(cfg, g, ws);
  const PlanCandidate none = out.front();  // nothing re-run: the step's plan-independent FLOPs (a copy: out grows)
  auto unit_plan = [&](const std::string& name, const std::vector<UnitModeSpec>& modes) {
    PlanCandidate c{name, plan_from_unit_modes(g, name, modes), modelled_peak(model, modes),
                    modelled_recompute_flops(model, modes)};
    c.plan.policy = name;
    c.forward_flops = none.forward_flops;
    c.backward_flops = none.backward_flops;
    c.step_flops = none.step_flops + c.recompute_flops;
    return c;
  };
  // The sizes tried: every one up to 24 units, beyond that 1-8, then steps of a quarter,
  // the round square root and its neighbours, and n: about 4 log n of them, since each
  // candidate is a simulation as long as the model (1024 blocks: ~0.1 s each).
  std::vector<int64_t> sizes;
  for (int64_t k = 1; k <= n; k = k < 8 || n <= 24 ? k + 1 : std::max(k + 1, k + k / 4)) sizes.push_back(k);
  const auto root = std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(n))));
  for (int64_t k : {root - 1, root, root + 1, n})
    if (k >= 1 && k <= n) sizes.push_back(k);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  // Uniform segmentations: segments of K units, recomputed in full or keeping GEMM/conv
  // outputs inside.
  for (int64_t k : sizes) {
    std::vector<UnitModeSpec> full(static_cast<size_t>(n));
    for (int64_t u = 0; u < n; ++u) full[static_cast<size_t>(u)] = {2, static_cast<int>(u / k)};
    const std::string name = "every:" + std::to_string(k);
    out.push_back(unit_plan(name, full));
    // every:K+selective: the segments' GEMM/conv outputs are kept.
    std::vector<Segment> segs;
    for (int64_t i = 0; i < n; i += k)
      segs.push_back({us[static_cast<size_t>(i)].begin, us[static_cast<size_t>(std::min(n, i + k) - 1)].end, true});
    std::vector<bool> keep(static_cast<size_t>(g.size()), true), keep_extras = keep;
    for (const auto& s : segs) keep_selective(g, s, keep, keep_extras);
    out.push_back(simulate(cfg, g, name + "+selective",
                           make_plan_from_segments(g, name + "+selective", segs, keep, keep_extras), ws));
  }
  // Nested recompute with few slots: below every one-level plan's peak.
  for (int64_t slots : {1, 2, 3, 4, 6, 8}) {
    if (slots >= n) break;
    if (slots == 1 && n > 64) continue;  // n^2/2 unit re-runs to simulate
    const std::string name = "revolve:" + std::to_string(slots);
    out.push_back(simulate(cfg, g, name, make_plan(g, name), ws));
  }
  // Mixed plans: the first m units recomputed in full (one segment each), the rest
  // selective, or the rest kept; they fill the gaps between the uniform plans.
  for (int64_t m : sizes) {
    if (m >= n) break;
    std::vector<UnitModeSpec> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    for (int64_t u = 0; u < n; ++u) {
      a[static_cast<size_t>(u)] = u < m ? UnitModeSpec{2, static_cast<int>(u)} : UnitModeSpec{1, 0};
      b[static_cast<size_t>(u)] = u < m ? UnitModeSpec{2, static_cast<int>(u)} : UnitModeSpec{0, 0};
    }
    const std::string tag = std::to_string(m) + "/" + std::to_string(n);
    out.push_back(unit_plan("first " + tag + " full, rest selective", a));
    out.push_back(unit_plan("first " + tag + " full, rest kept", b));
  }
  // The unit program's cheapest plan at each peak of the front so far (chain_planner.h):
  // on chains of differing units it lies below the families' front. Up to 64 units (a
  // program on a deeper chain takes seconds; the budget search still runs it once).
  if (n > 64) return out;
  std::set<std::string> seen;
  for (const PlanCandidate& c : pareto_front(out)) {
    const auto modes = cheapest_unit_modes(model, c.peak_bytes, unit_program_longest_segment(n));
    if (!modes) continue;
    std::string key;
    for (const UnitModeSpec& u : *modes) key += std::to_string(u.mode) + ":" + std::to_string(u.group) + " ";
    if (!seen.insert(key).second) continue;
    PlanCandidate u = simulate_unit_modes(cfg, g, *modes, ws);
    // A plan of the families with the same peak and cost keeps its (regular) name.
    const bool known = std::any_of(out.begin(), out.end(), [&](const PlanCandidate& o) {
      return o.peak_bytes == u.peak_bytes && o.recompute_flops == u.recompute_flops;
    });
    if (!known) out.push_back(u);
  }
  return out;
}

}  // namespace

int64_t unit_count(const Graph& g) { return static_cast<int64_t>(plan_units(g).size()); }

std::vector<PlanCandidate> pareto_front(std::vector<PlanCandidate> c) {
  std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) {
    return a.peak_bytes != b.peak_bytes ? a.peak_bytes < b.peak_bytes : a.cost() < b.cost();
  });
  std::vector<PlanCandidate> front;
  double best = INFINITY;
  for (auto& p : c) {
    if (p.cost() < best) {
      best = p.cost();
      front.push_back(p);
    }
  }
  return front;
}

namespace {

// The plan family the budget solver searches: units in forward order are
//   [m_full units recomputed in full, in segments of k] [m_sel selective] [the rest kept].
// Recomputed units come first: their recompute then happens last in backward, after the
// later units' activations have been freed, which keeps the peak lowest.
PlanCandidate ordered_plan(const Config& cfg, const Graph& g, int64_t n, int64_t m_full, int64_t k, int64_t m_sel,
                           Backend* ws, const OffloadModel* om, bool offload) {
  std::vector<UnitModeSpec> modes(static_cast<size_t>(n));
  for (int64_t u = 0; u < n; ++u) {
    if (u < m_full)
      modes[static_cast<size_t>(u)] = {2, static_cast<int>(u / k)};
    else if (u < m_full + m_sel)
      modes[static_cast<size_t>(u)] = {1, 0};
    else
      modes[static_cast<size_t>(u)] = {0, 0};
  }
  std::string name = m_full == 0 && m_sel == 0 ? "none" : "";
  if (m_full > 0) name += std::to_string(m_full) + " full (every:" + std::to_string(k) + ")";
  if (m_sel > 0) name += (name.empty() ? "" : " + ") + std::to_string(m_sel) + " selective";
  if (n - m_full - m_sel > 0 && !(m_full == 0 && m_sel == 0))
    name += " + " + std::to_string(n - m_full - m_sel) + " kept";
  CheckpointPlan plan = plan_from_unit_modes(g, name, modes);
  if (offload) {
    add_offload(g, plan);
    name += " +offload";
  }
  return simulate(cfg, g, name, plan, ws, om);
}

}  // namespace

namespace {

struct BudgetSearch {
  std::optional<PlanCandidate> best;  // the least cost() that fits, if any
  PlanCandidate smallest;             // the lowest peak seen
};

// One pass of the search over the plans without offload, or (offload) each with what it
// keeps offloaded; `best` and `smallest` carry over from an earlier pass.
void search_budget_pass(const Config& cfg, const Graph& g, int64_t budget, Backend* ws, const OffloadModel* om,
                        bool offload, std::optional<PlanCandidate>& best, std::optional<PlanCandidate>& smallest,
                        std::map<std::string, int64_t>& plain_peaks, std::optional<UnitChainModel>& model,
                        BudgetOf of) {
  const int64_t n = unit_count(g);
  const int64_t host_budget = om && om->host_budget > 0 ? om->host_budget : INT64_MAX;
  // plain_peaks' key: the plan's name without its offload suffix and its unit layout (names
  // of the unit program's plans beyond 24 units give counts only, not which unit does what).
  auto plain_key = [&](const PlanCandidate& c) {
    const size_t at = c.name.rfind("+offload");
    const std::string base =
        at == std::string::npos ? c.name : c.name.substr(0, c.name.find_last_not_of(' ', at - 1) + 1);
    return base + " " + c.plan.unit_layout(g);
  };
  auto record = [&](const PlanCandidate& c) {
    if (!c.plan.offloads()) plain_peaks.emplace(plain_key(c), c.peak_bytes);
    if (c.host_peak_bytes > host_budget) return;
    if (!smallest || c.peak(of) < smallest->peak(of) ||
        (c.peak(of) == smallest->peak(of) && c.cost() < smallest->cost()))
      smallest = c;
    // Ties (offload the model hides entirely): the least host memory, then the least peak.
    if (c.peak(of) <= budget &&
        (!best || c.cost() < best->cost() ||
         (c.cost() == best->cost() && (c.host_peak_bytes < best->host_peak_bytes ||
                                       (c.host_peak_bytes == best->host_peak_bytes && c.peak(of) < best->peak(of))))))
      best = c;
  };
  // Whether c fits the device budget (the host budget is a filter above: a plan over it is
  // treated as not fitting, so the searches move on to more recompute).
  auto fits = [&](const PlanCandidate& c) { return c.peak(of) <= budget && c.host_peak_bytes <= host_budget; };
  // An offloading plan that fits the device budget may fit with fewer units offloaded: less
  // pinned host memory and fewer copies, so never a longer modelled step. Its trimmed form
  // offloads the fewest leading units that still fit (binary search, each simulated; the
  // full offload fits, so the search always ends on a simulated fitting plan). Trimmed
  // only where that can matter: the host budget is exceeded, or the least copying any
  // trimmed form needs would beat the best so far. That least: offload lowers the device
  // peak by at most what the host holds, so a form that fits holds at least the same plan's
  // peak without offload less the budget (bytes that go out and back once). record() sees
  // both forms; consider() returns the one the searches go on with.
  const int most = static_cast<int>(offload_units(g).size()) - 1;
  auto plain_peak = [&](const PlanCandidate& c) {
    const std::string key = plain_key(c);
    if (auto it = plain_peaks.find(key); it != plain_peaks.end()) return it->second;
    CheckpointPlan p = c.plan;
    p.offload.clear(), p.prefetch_at.clear(), p.need_at.clear();
    const int64_t peak = simulate(cfg, g, key, p, ws).peak_bytes;
    plain_peaks.emplace(key, peak);
    return peak;
  };
  auto copies_free_ms = [&](PlanCandidate c) {
    c.host_peak_bytes = 0;
    return om->step_ms(c);
  };
  auto least_copying_ms = [&](PlanCandidate c) {
    c.host_peak_bytes = std::max<int64_t>(0, plain_peak(c) - budget);
    return om->step_ms(c);
  };
  auto trimmed = [&](const PlanCandidate& c) {
    const OffloadSuffix o = split_offload_suffix(c.plan.policy);
    int lo = 1, hi = o.units == -1 ? most : o.units;
    PlanCandidate best_fit = c;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      CheckpointPlan p = c.plan;
      p.policy = o.base;
      add_offload(g, p, mid);
      const std::string suffix = c.name.substr(c.name.rfind("+offload"));
      PlanCandidate t = simulate(
          cfg, g, c.name.substr(0, c.name.size() - suffix.size()) + "+offload:" + std::to_string(mid), p, ws, om);
      if (t.peak(of) <= budget) {
        best_fit = t;
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return best_fit;
  };
  auto consider = [&](const PlanCandidate& c) {
    record(c);
    if (!offload || !c.plan.offloads() || c.peak(of) > budget) return c;
    const bool host_over = c.host_peak_bytes > host_budget;
    if (!host_over && best && c.cost() >= best->cost() && c.cost() == copies_free_ms(c)) return c;  // nothing to gain
    const int64_t least_host = std::max<int64_t>(0, plain_peak(c) - budget);
    if (least_host > host_budget) return c;  // no trimmed form fits the host
    const double floor_ms = least_copying_ms(c);
    const bool could_win = c.cost() > floor_ms && (!best || floor_ms < best->cost());
    if (!host_over && !could_win) return c;
    const PlanCandidate t = trimmed(c);
    record(t);
    return t;
  };
  // Nested recompute (revolve:S) reaches below the family below; its peak grows and its
  // re-runs fall with S: the largest S that fits is its cheapest fitting plan. Searched
  // first: a fitting plan early bounds the search below.
  if (n > 2) {
    int64_t lo = 0, hi = n - 1;  // the largest S that fits lies in [lo, hi]; 0: none
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      const std::string name = "revolve:" + std::to_string(mid) + (offload ? "+offload" : "");
      const PlanCandidate c = consider(simulate(cfg, g, name, make_plan(g, name), ws, om));
      if (fits(c))
        lo = mid;
      else
        hi = mid - 1;
    }
  }
  // A lower bound on the cost of a plan of the family with m_full units recomputed: their
  // re-runs in segments of one unit (larger segments and selective units only add), the
  // plain step's FLOPs besides. Costs grow with m_full, so once the bound reaches the best
  // fitting plan's cost no larger m_full can win.
  const std::vector<Segment> us = plan_units(g);
  const CheckpointPlan per_unit = make_plan(g, "all");
  std::vector<double> rerun_prefix(static_cast<size_t>(n) + 1, 0.0);
  for (int64_t u = 0; u < n; ++u) {
    double f = 0.0;
    for (int i = us[static_cast<size_t>(u)].begin; i < us[static_cast<size_t>(u)].end; ++i)
      if (per_unit.rerun[static_cast<size_t>(i)]) f += g.layer(i).forward_flops();
    rerun_prefix[static_cast<size_t>(u) + 1] = rerun_prefix[static_cast<size_t>(u)] + f;
  }
  std::optional<PlanCandidate> plain;  // the plain step, for the modelled bound
  auto lower_bound = [&](int64_t m_full) {
    const double rerun = rerun_prefix[static_cast<size_t>(m_full)];
    if (!om) return rerun;
    if (!plain) plain = simulate(cfg, g, "none", make_plan(g, "none"), ws, om);
    PlanCandidate c = *plain;
    c.step_flops += rerun;
    c.host_peak_bytes = 0;
    return om->step_ms(c);
  };
  // Every m_full up to 64 units; on deeper chains the candidates' grid (1-8, then steps of
  // a quarter, the square root and its neighbours, n: about 4 log n values), so that a
  // 1024-unit chain plans in minutes; each plan is still simulated exactly.
  std::vector<int64_t> m_grid;
  if (n <= 64) {
    for (int64_t m = 0; m <= n; ++m) m_grid.push_back(m);
  } else {
    m_grid.push_back(0);
    for (int64_t k = 1; k <= n; k = k < 8 ? k + 1 : std::max(k + 1, k + k / 4)) m_grid.push_back(k);
    const auto root = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(n))));
    for (int64_t k : {root - 1, root, root + 1, n}) m_grid.push_back(k);
    std::sort(m_grid.begin(), m_grid.end());
    m_grid.erase(std::unique(m_grid.begin(), m_grid.end()), m_grid.end());
  }
  for (int64_t m_full : m_grid) {
    if (best && lower_bound(m_full) >= best->cost()) break;
    std::vector<int64_t> ks{1};
    if (m_full > 1) {
      const auto r = std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(m_full))));
      for (int64_t k : {int64_t{2}, int64_t{3}, int64_t{4}, r - 1, r, r + 1, m_full})
        if (k > 1 && k <= m_full && std::find(ks.begin(), ks.end(), k) == ks.end()) ks.push_back(k);
    }
    for (int64_t k : ks) {
      // Peak falls as kept units become selective: find the fewest selective units that
      // fit (binary search), which is the cheapest plan of this (m_full, k).
      const int64_t rest = n - m_full;
      const PlanCandidate hi = consider(ordered_plan(cfg, g, n, m_full, k, rest, ws, om, offload));
      if (!fits(hi)) continue;
      int64_t lo_sel = 0, hi_sel = rest;
      while (lo_sel < hi_sel) {
        const int64_t mid = (lo_sel + hi_sel) / 2;
        const PlanCandidate c = consider(ordered_plan(cfg, g, n, m_full, k, mid, ws, om, offload));
        if (fits(c))
          hi_sel = mid;
        else
          lo_sel = mid + 1;
      }  // lo_sel's plan was simulated: the last fitting mid, or the all-selective one
    }
  }
  // The chosen offloading plan with the fewest units offloaded that fit: the same modelled
  // time where copies hide behind compute, less pinned memory and link traffic.
  if (offload && best && best->plan.offloads()) record(trimmed(*best));
  // The dynamic program over the units (remat/chain_planner.h): the cheapest plan of one
  // mode per unit, exact over those plans where its model is (tests/test_profile.cpp);
  // on chains of differing units it beats the family above. Last, so that a tie keeps the
  // family's regular plan. Its plan is simulated; should the simulation exceed the budget,
  // the program runs again under the budget less the excess.
  if (n == 0) return;
  if (!model) model = measure_unit_chain(cfg, g, ws);
  const int longest = unit_program_longest_segment(n);
  if (!offload) {
    int64_t target = budget;
    for (int attempt = 0; attempt < 4 && target > 0; ++attempt) {
      const auto modes = cheapest_unit_modes(*model, target, longest);
      if (!modes) break;
      const PlanCandidate c = simulate_unit_modes(cfg, g, *modes, ws, om);
      record(c);
      if (c.peak(of) <= budget) break;
      target -= c.peak(of) - budget;  // the model predicts allocated bytes: aim below by the excess
    }
    return;
  }
  // With offload, a plan of one mode per unit that does not fit as it is may fit with
  // what its first units keep offloaded, and on chains of differing units the cheapest of
  // those need not be in the family above: which units to recompute depends on which keep
  // their bytes on the device. For each number J of offloaded units the program runs on
  // the model with the first J units' kept bytes off the device (offloaded_items); its plan
  // is offloaded that far, simulated and trimmed (consider()), and as above run again under
  // the budget less any excess. A J is left where even a copy-free step of its plan's
  // recompute cannot beat the best so far. Tested against brute force on chains of
  // differing units (tests/test_profile.cpp).
  const int units_offloadable = static_cast<int>(offload_units(g).size()) - 1;
  if (units_offloadable < 1 || model->units() != units_offloadable + 1) return;
  std::vector<int> js;  // every J up to 64 units; on deeper chains a grid of about 4 log n
  for (int j = 1; j <= units_offloadable; j = j < 8 || units_offloadable <= 64 ? j + 1 : j + j / 4) js.push_back(j);
  if (js.back() != units_offloadable) js.push_back(units_offloadable);
  if (!plain) plain = simulate(cfg, g, "none", make_plan(g, "none"), ws, om);
  for (int j : js) {
    UnitChainModel mj = *model;
    mj.offloaded_items = static_cast<size_t>(model->unit_item[static_cast<size_t>(j)]);
    int64_t target = budget;
    for (int attempt = 0; attempt < 4 && target > 0; ++attempt) {
      const auto modes = cheapest_unit_modes(mj, target, longest);
      if (!modes) break;
      PlanCandidate bound{"", {}, 0, modelled_recompute_flops(mj, *modes)};
      bound.forward_flops = plain->forward_flops;
      bound.step_flops = plain->step_flops + bound.recompute_flops;
      if (best && om->step_ms(bound) >= best->cost()) break;
      const PlanCandidate c = consider(simulate_unit_modes(cfg, g, *modes, ws, om, j));
      if (c.peak(of) <= budget) break;
      target -= c.peak(of) - budget;  // the model is not exact: aim below by the excess
    }
  }
}

BudgetSearch search_budget(const Config& cfg, const Graph& g, int64_t budget, Backend* ws, const OffloadModel* om,
                           BudgetOf of) {
  REMAT_CHECK(budget > 0, "the memory budget must be positive");
  std::optional<PlanCandidate> best, smallest;
  std::map<std::string, int64_t> plain_peaks;  // by plan name and layout: the peaks without offload
  std::optional<UnitChainModel> model;         // measured once, for both passes
  search_budget_pass(cfg, g, budget, ws, om, false, best, smallest, plain_peaks, model, of);
  if (om) search_budget_pass(cfg, g, budget, ws, om, true, best, smallest, plain_peaks, model, of);
  REMAT_CHECK(smallest, "no plan holds within the host budget of ", format_bytes(om ? om->host_budget : 0));
  return {best, *smallest};
}

[[noreturn]] void throw_nothing_fits(int64_t budget, const PlanCandidate& smallest, const std::string& where,
                                     const std::string& reached, BudgetOf of) {
  const char* what = of == BudgetOf::reserved ? " reserved" : "";
  REMAT_THROW("no plan fits the budget of ", format_bytes(budget), " (", budget, " bytes", what, ")", where,
              ": the smallest achievable peak is ", format_bytes(smallest.peak(of)), " (", smallest.peak(of), " bytes",
              what, "), reached", reached, " by plan ", smallest.name);
}

}  // namespace

PlanCandidate plan_for_budget(const Config& cfg, const Graph& g, int64_t budget, Backend* ws, const OffloadModel* om,
                              BudgetOf of) {
  BudgetSearch r = search_budget(cfg, g, budget, ws, om, of);
  if (!r.best) throw_nothing_fits(budget, r.smallest, " at batch " + std::to_string(g.batch), "", of);
  return *r.best;
}

// The largest micro-batch at which some plan fits, the cheapest plan there. When nothing
// fits at any micro-batch, the error names the lowest peak over all of them (a smaller
// micro-batch is not always lower: its accumulation buffer can cost more than it saves).
MicroBatchPlan plan_micro_batch_for_budget(const Config& cfg, int64_t budget, int64_t seq, Backend* ws,
                                           const OffloadModel* om, BudgetOf of) {
  const int64_t batch = cfg.training.batch;
  const int ranks = cfg.training.ranks;
  REMAT_CHECK(batch % ranks == 0, cfg.source, ": /training/batch ", batch, " does not split over ", ranks, " ranks");
  std::optional<PlanCandidate> smallest;
  int64_t smallest_at = 0;
  for (int64_t b = batch; b >= 1; --b) {
    if (batch % b != 0 || (batch / b) % ranks != 0) continue;  // each rank the same micro-batches
    MicroBatchPlan r;
    r.micro_batch = b;
    r.config = cfg;
    r.config.training.micro_batch = b == batch ? 0 : b;
    r.graph = build_config_graph(r.config, b, seq);
    BudgetSearch found = search_budget(r.config, r.graph, budget, ws, om, of);
    if (found.best) {
      r.best = *found.best;
      return r;
    }
    if (!smallest || found.smallest.peak(of) < smallest->peak(of)) smallest = found.smallest, smallest_at = b;
  }
  throw_nothing_fits(budget, *smallest, " at batch " + std::to_string(batch) + " with any micro-batch",
                     " at micro-batch " + std::to_string(smallest_at), of);
}

CheckpointPlan resolve_policy(const Config& cfg, const Graph& g, const std::string& policy, Backend* ws) {
  if (policy.rfind("budget:", 0) == 0) {
    const OffloadSuffix o = split_offload_suffix(policy);
    REMAT_CHECK(o.units == -1, "policy \"", policy,
                "\": a budget plan chooses how many units to offload itself; write budget:SIZE+offload");
    const int64_t budget = parse_size(o.base.substr(7));
    const OffloadModel om = declared_offload_model("h100", cfg.training.precision);
    PlanCandidate c = plan_for_budget(cfg, g, budget, ws, o.offload ? &om : nullptr, BudgetOf::reserved);
    c.plan.policy = policy + " -> " + c.name;
    return c.plan;
  }
  CheckpointPlan plan = make_plan(g, policy);
  // A policy that asked for recompute and got none: say why instead of profiling or
  // training a plain step under its name.
  if (split_offload_suffix(policy).base != "none" && plan.recomputed_layers() == 0)
    log().warn("policy {} recomputes nothing in this model: {}", policy,
               g.num_units > 0 ? std::string("every product it would free is read across its segments")
                               : std::string("it has no repeat blocks, so each layer is its own unit and each output "
                                             "its own checkpoint; every:K or sqrt group layers into segments"));
  return plan;
}

}  // namespace remat
