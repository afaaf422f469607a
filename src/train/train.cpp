// The training loop behind `remat train`: a Trainer in named phases (tiny-cuda-nn's
// trainer.h is the model). The constructor sets a run up (config, device, data, graph,
// plan, parameters, optimizer) and resumes it when asked; step() is one training step;
// evaluate(), checkpoint() and sample() are what the loop does between steps; run() is
// the loop.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include <omp.h>

#include "remat/data.h"
#include "remat/dist.h"
#include "remat/error.h"
#include "remat/hash.h"
#include "remat/interop.h"
#include "remat/io.h"
#include "remat/log.h"
#include "remat/philox.h"
#include "remat/profile.h"
#include "remat/train.h"
#include "remat/translate.h"
#include "remat/translation.h"
#include "train/grad_reduce.h"
#include "train/run_data.h"

namespace fs = std::filesystem;

namespace remat {

namespace {

using Clock = std::chrono::steady_clock;

// data.length_buckets: batches are grouped by length within pools of this many batches of
// the epoch's shuffled order (BatchSampler::group_by_length).
constexpr int64_t kBucketPoolBatches = 50;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

std::string format_duration(double seconds) {
  char buf[32];
  const auto s = static_cast<long long>(seconds + 0.5);
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, s / 60 % 60);
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%llds", s);
  return buf;
}

std::string fmt_g(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

Device resolve_device(const std::string& name, const dist::Comm& comm) {
  // Data parallel on GPUs: one device per rank, cuda:<local rank>.
  const int local = comm.size() > 1 ? comm.local_rank() : 0;
  if (name == "auto") return cuda_status().available ? Device::cuda(local) : Device::cpu();
  if (name == "cuda" && comm.size() > 1) {
    require_available(Device::cuda(local));
    return Device::cuda(local);
  }
  Device d = Device::parse(name);
  require_available(d);
  if (d.is_meta()) REMAT_THROW("cannot train on meta (it holds no data); use `remat memprof --device meta`");
  return d;
}

// A data path that does not exist, named with where it was set (`where`: the config and
// field, or --data) before anything is loaded; token shard patterns are matched later.
void check_data_path(const Config& cfg, const std::string& where) {
  const std::string& p = cfg.data.path;
  if (p.empty() || cfg.data.dataset.rfind("synthetic", 0) == 0) return;
  if (cfg.data.dataset == "token_shards" && p.find_first_of("*?[") != std::string::npos) return;
  std::error_code ec;
  if (fs::exists(p, ec)) return;
  std::string hint;
  if (cfg.data.dataset == "translation") hint = " (build a corpus there with `remat corpus --out " + p + "`)";
  if (cfg.data.dataset == "fashion_mnist") hint = " (a folder of the four Fashion-MNIST IDX files)";
  REMAT_THROW(where, ": ", p, ": no such file or folder", hint);
}

// The config with the command line's overrides applied.
Config resolve_config(const TrainOptions& o) {
  Config cfg = load_config(o.config, o.dataset);
  if (!o.data_path.empty() && cfg.data.dataset.rfind("synthetic", 0) == 0)
    REMAT_THROW("--data ", o.data_path, ": the data set of ", o.config, " is ", cfg.data.dataset,
                ", which reads no files; pass --dataset too (token_shards, text, fashion_mnist, translation)");
  if (!o.policy.empty()) cfg.training.policy = o.policy;
  if (!o.precision.empty()) {
    if (const std::string e = precision_error(o.precision); !e.empty()) REMAT_THROW("--precision: ", e);
    cfg.training.precision = o.precision;
  }
  // Set values are checked here too (the command's parser checks them first): a value out
  // of range is an error naming the option, never the config's value in disguise.
  REMAT_CHECK(!o.steps || *o.steps > 0, "--steps ", o.steps.value_or(0), ": must be positive");
  REMAT_CHECK(!o.epochs || *o.epochs > 0, "--epochs ", o.epochs.value_or(0), ": must be positive");
  REMAT_CHECK(!o.batch || *o.batch > 0, "--batch ", o.batch.value_or(0), ": must be positive");
  REMAT_CHECK(!o.micro_batch || *o.micro_batch >= 0, "--micro-batch ", o.micro_batch.value_or(0),
              ": must be 0 (the whole batch) or more");
  REMAT_CHECK(!o.seed || *o.seed >= 0, "--seed ", o.seed.value_or(0), ": must be 0 or more");
  if (o.steps) cfg.training.steps = *o.steps;
  if (o.epochs) {
    cfg.training.epochs = *o.epochs;
    if (!o.steps) cfg.training.steps = 0;
  }
  if (o.batch) cfg.training.batch = *o.batch;
  if (o.micro_batch) cfg.training.micro_batch = *o.micro_batch;
  if (o.shard_optimizer) cfg.training.shard_optimizer = true;
  check_micro_batch(cfg);
  REMAT_CHECK(o.reduce == "ordered" || o.reduce == "fast", "--reduce ", o.reduce, ": expected ordered or fast");
  if (o.seed) cfg.training.seed = static_cast<uint64_t>(*o.seed);
  if (!o.data_path.empty()) cfg.data.path = o.data_path;
  check_data_path(cfg, o.data_path.empty() ? o.config + ": /data/path" : std::string("--data"));
  return cfg;
}

// The trainer reads each step's loss after the step's end-of-step synchronisation.
ExecOptions deferred_loss(bool verify_recompute) {
  ExecOptions o(verify_recompute);
  o.read_loss = false;
  return o;
}

int64_t largest_divisor_at_most(int64_t n, int64_t cap) {
  for (int64_t b = std::min(n, cap); b > 1; --b)
    if (n % b == 0) return b;
  return 1;
}

// Philox words one micro-batch's forward reserves (each random layer a whole block).
uint64_t rng_words_per_micro_batch(const Graph& g) {
  uint64_t w = 0;
  for (int i = 0; i < g.size(); ++i)
    if (const uint64_t n = g.layer(i).rng_words()) w += (n + 3) / 4 * 4;
  return w;
}

}  // namespace

// Everything a run holds, in the order it is set up.
struct Trainer::State {
  dist::Comm& comm;
  TrainOptions opt;
  Config cfg;
  Device dev;
  Backend& be;
  RunData data;
  std::map<std::string, int64_t> vars;  // "$vocab" of text models
  Graph graph;
  CheckpointPlan plan;
  int64_t n_train = 0;
  BatchSampler sampler;
  int64_t total = 0;           // steps of the whole run
  int64_t schedule_total = 0;  // the learning-rate schedule's length (total, or a resumed run's)
  ParamStore params;
  Optimizer optimizer;
  Executor executor;
  RngGenerator gen;
  Graph eval_graph;
  // The loss's ignored class (accuracy leaves those rows out); empty for a loss without
  // classes, which has no accuracy.
  std::optional<int> ignore_index;
  int64_t micro = 0;                     // samples per micro-batch
  int64_t micros = 1;                    // micro-batches per step (all ranks)
  uint64_t rng_words = 0;                // Philox words per micro-batch
  std::unique_ptr<GradReducer> reducer;  // micro-batches or ranks: the step's reduction
  // data.length_buckets: a graph, plan and executor per bucket length below the model's,
  // sharing the parameters, made at the first batch of that length; the batches each ran.
  struct Bucket {
    Graph graph;
    CheckpointPlan plan;
    Executor executor;
    uint64_t rng_words;
    Bucket(Graph g, State& s)
        : graph(std::move(g)),
          plan(resolve_policy(s.cfg, graph, s.cfg.training.policy, &s.be)),
          executor(graph, s.params, s.be, plan, deferred_loss(s.opt.verify_recompute)),
          rng_words(rng_words_per_micro_batch(graph)) {}
  };
  std::map<int64_t, std::unique_ptr<Bucket>> buckets;
  std::map<int64_t, int64_t> bucket_batches;  // by length (the model's: 0)

  int64_t step = 0;   // steps done, including those before a resume
  int64_t first = 0;  // the step this call started from
  std::string out_dir;
  std::ofstream metrics;
  double time_ms = 0;  // of the steps of this call
  TrainResult result;

  State(dist::Comm& cm, const TrainOptions& o, Config c, Device d, RunData rd, std::map<std::string, int64_t> v,
        Graph g)
      : comm(cm),
        opt(o),
        cfg(std::move(c)),
        dev(d),
        be(backend_for(d)),
        data(std::move(rd)),
        vars(std::move(v)),
        graph(std::move(g)),
        plan(resolve_policy(cfg, graph, cfg.training.policy, &be)),  // budgets with this device's workspace sizes
        n_train(data.train_size()),
        sampler(checked_train_size(), cfg.training.batch, cfg.training.seed, cfg.data.shuffle),
        total(cfg.training.steps > 0 ? cfg.training.steps : cfg.training.epochs * sampler.batches_per_epoch()),
        schedule_total(total),
        params(graph, dev, cfg.training.seed, /*initialise=*/o.init_from.empty()),  // init_from sets them
        // ZeRO-1: each rank keeps the optimizer state of its shard (docs/distributed.md).
        optimizer(cfg.optimizer, params, be, cm.rank(), cfg.training.shard_optimizer ? cm.size() : 0),
        executor(graph, params, be, plan, deferred_loss(o.verify_recompute)),
        gen(cfg.training.seed),
        eval_graph(build_graph(
            cfg.model,
            data.translation
                ? std::min(data.eval_size(), cfg.training.batch)  // whole batches; the rest unread
                : largest_divisor_at_most(std::max<int64_t>(data.eval_size(), 1), data.text ? cfg.training.batch : 500),
            cfg.source, vars)),
        ignore_index(graph.layer(graph.loss_id).ignore_index()),
        micro(cfg.training.micro()),
        micros(cfg.training.micro_batches()),
        rng_words(rng_words_per_micro_batch(graph)) {
    REMAT_CHECK(total > 0, cfg.source, ": /training: set steps or epochs (or pass --steps / --epochs)");
    REMAT_CHECK(micros % comm.size() == 0, cfg.source, ": /training: batch ", cfg.training.batch, " / micro_batch ",
                micro, " = ", micros, " micro-batches per step, not a multiple of the ", comm.size(),
                " ranks (each rank runs the same number of micro-batches)");
    if (micros > 1 || comm.size() > 1) {
      ReduceOptions ro;
      ro.ordered = opt.reduce == "ordered";
      ro.overlap = opt.overlap;
      ro.bucket_bytes = opt.bucket_kib * 1024;
      // GPU ranks of an MPI launch reduce with NCCL on the backend's stream (set_up decided).
      std::unique_ptr<dist::DeviceComm> device_comm;
      if (cfg.training.device_collectives) device_comm = dist::make_nccl_comm(comm, dev.index);
      reducer = std::make_unique<GradReducer>(params, be, comm, ro, std::move(device_comm));
      if (reducer->overlapped())
        executor.set_on_grads_final([this](const std::vector<int>& ps) { reducer->grads_final(ps); });
    }
    if (!data.length_buckets.empty()) sampler.group_by_length(data.train_lengths(), kBucketPoolBatches);
  }

  // The executor that runs a batch cut to `length` (RunData::bucket_length; 0: the model's
  // lengths), and the random words one micro-batch of it draws.
  std::pair<Executor*, uint64_t> executor_for(int64_t length) {
    ++bucket_batches[length];
    if (length == 0) return {&executor, rng_words};
    std::unique_ptr<Bucket>& b = buckets[length];
    if (!b) {
      // The inputs' lengths as the model's graph has them (a config may write "$seq_len").
      nlohmann::json model = cfg.model;
      for (auto& in : model["inputs"]) {
        const std::string name = in.value("name", "");
        if (name == kSourceName || name == kTargetInName || name == kTargetsName)
          in["seq_len"] = std::min(length, graph.layer(graph.require_input(name, cfg.source)).out_shape[1]);
      }
      // Only the inputs change: a parameter sized by "$seq_len" keeps the model's size.
      b = std::make_unique<Bucket>(build_graph(model, micro, cfg.source, vars), *this);
      if (reducer && reducer->overlapped())
        b->executor.set_on_grads_final([this](const std::vector<int>& ps) { reducer->grads_final(ps); });
    }
    return {&b->executor, b->rng_words};
  }

  // What this step's collectives moved and took: the host Comm's and the device's.
  dist::CommStats comm_stats() const {
    dist::CommStats c = comm.stats();
    if (reducer) c += reducer->device_stats();
    return c;
  }
  void reset_comm_stats() {
    comm.reset_stats();
    if (reducer) reducer->reset_device_stats();
  }

  int64_t checked_train_size() const {
    REMAT_CHECK(n_train >= cfg.training.batch, cfg.source, ": the training set has ", n_train,
                " samples, fewer than one batch of ", cfg.training.batch);
    return n_train;
  }

  void write_metrics(const nlohmann::json& j) {
    if (metrics.is_open()) {
      metrics << j.dump() << "\n";
      metrics.flush();
    }
  }
};

// ---- setup --------------------------------------------------------------------------------

namespace {

// Every rank must train the same run: the hash of the resolved config and the options that
// change the numbers, compared before the first step.
void check_same_run(dist::Comm& comm, const Config& cfg, const TrainOptions& o) {
  if (comm.size() == 1) return;
  const uint64_t h = fnv1a64(cfg.resolved().dump() + "|" + o.reduce + "|" + o.init_from + "|" + o.resume + "|" +
                             (o.overlap ? "overlap " : "no overlap ") + std::to_string(o.bucket_kib) +
                             (o.reschedule ? " reschedule" : ""));
  std::vector<uint64_t> all(static_cast<size_t>(comm.size()));
  comm.allgather(&h, all.data(), 1);
  for (int r = 1; r < comm.size(); ++r)
    REMAT_CHECK(all[static_cast<size_t>(r)] == all[0], "data parallel: rank ", r, "'s config and options (hash ",
                all[static_cast<size_t>(r)], ") differ from rank 0's (hash ", all[0], "); every rank must run ",
                "the same config with the same options");
}

// The loss of a step run with ExecOptions::read_loss off: read back once the caller is ready
// to wait for the device (0 on meta, which computes nothing).
float read_step_loss(StepStats& st) {
  if (!st.loss_value.defined()) return st.loss;
  const float loss = st.loss_value.device().is_meta() ? 0.0f : st.loss_value.to_vector()[0];
  st.loss_value = Tensor();
  return loss;
}

// --out DIR: a folder that already holds a run (a checkpoint or metrics.jsonl) is not
// overwritten by accident; --resume DIR continues it, --overwrite starts it over (its
// checkpoint removed, metrics.jsonl truncated when the run folder opens). Rank 0 creates
// the folder here, before any data is read, so that a path that cannot be one fails first.
void prepare_out_folder(const TrainOptions& o, bool rank0) {
  if (o.out.empty()) return;
  REMAT_CHECK(!o.overwrite || o.resume.empty(), "--overwrite and --resume exclude each other");
  const fs::path dir(o.out);
  std::error_code ec;
  if (!o.resume.empty() && fs::equivalent(dir, o.resume, ec)) return;  // --resume DIR --out DIR
  std::vector<std::string> held;
  for (const char* name : {"checkpoint", "checkpoint.new", "checkpoint.old", "metrics.jsonl"})
    if (fs::exists(dir / name, ec)) held.push_back(name);
  if (!held.empty() && !o.overwrite) {
    std::string names;
    for (const std::string& h : held) names += (names.empty() ? "" : ", ") + h;
    REMAT_THROW("--out ", o.out, ": the folder holds a run (", names, "); pass --resume ", o.out,
                " to continue it, or --overwrite to start it over (its checkpoint and metrics.jsonl are replaced), ",
                "or choose another folder");
  }
  if (!rank0) return;
  for (const std::string& h : held)
    if (h != "metrics.jsonl") {
      fs::remove_all(dir / h, ec);
      REMAT_CHECK(!ec, "--out ", o.out, ": cannot remove ", (dir / h).string(), ": ", ec.message());
    }
  fs::create_directories(dir, ec);
  REMAT_CHECK(!ec && fs::is_directory(dir, ec), "--out ", o.out, ": cannot create the run folder",
              ec ? ": " + ec.message() : std::string(": a file of that name exists"));
}

std::unique_ptr<Trainer::State> set_up(TrainOptions o) {
  dist::Comm& comm = dist::world();
  if (comm.rank() != 0) o.quiet = true;  // rank 0 logs and writes the run folder
  prepare_out_folder(o, comm.rank() == 0);
  Config cfg = resolve_config(o);
  check_same_run(comm, cfg, o);
  if (comm.size() > 1 && cfg.training.micro_batch == 0) {
    // N ranks and no micro-batch asked for: each rank takes batch / N samples.
    REMAT_CHECK(cfg.training.batch % comm.size() == 0, cfg.source, ": /training/batch ", cfg.training.batch,
                " does not split over ", comm.size(), " ranks; set training.micro_batch (--micro-batch)");
    cfg.training.micro_batch = cfg.training.batch / comm.size();
  }
  cfg.training.ranks = comm.size();  // memory figures and budget: plans are one rank's
  if (comm.size() > 1 && !std::getenv("OMP_NUM_THREADS"))
    omp_set_num_threads(std::max(1, omp_get_num_procs() / std::max(1, comm.local_size())));  // cpu threads split
  const Device dev = resolve_device(o.device, comm);
  // GPU ranks of an MPI launch (even one) reduce gradients with NCCL when remat has it;
  // REMAT_NCCL=0 sends them through host memory over MPI instead.
  const char* nccl_env = std::getenv("REMAT_NCCL");
  const bool nccl_off = nccl_env && std::string(nccl_env) == "0";
  cfg.training.device_collectives = dev.is_cuda() && comm.engine() == "mpi" && dist::built_with_nccl() && !nccl_off &&
                                    (comm.size() > 1 || cfg.training.micro_batches() > 1);
  // Which backends compute in bf16 (Backend::supports_bf16); which layers do is checked on
  // the graph below.
  if (cfg.training.precision != "fp32" && !backend_for(dev).supports_bf16())
    REMAT_THROW(cfg.source, ": training.precision ", cfg.training.precision, ": not yet supported on ", dev.str(),
                " (its kernels are fp32 only; train on --device cpu, or predict the memory with `remat memprof ",
                "--precision ", cfg.training.precision, "`)");
  RunData data = load_run_data(cfg, cfg.model);
  std::map<std::string, int64_t> vars;
  if (data.text) vars["vocab"] = data.shards || data.translation ? cfg.data.vocab : data.train_text.vocab_size();
  Graph g = build_graph(cfg.model, cfg.training.micro(), cfg.source, vars);  // one micro-batch
  if (cfg.training.precision == "bf16")
    if (const std::string e = bf16_layer_error(g); !e.empty())
      REMAT_THROW(cfg.source, ": training.precision bf16: ", e);
  fit_data_to_model(data, g, cfg);  // before any step: a mismatch is named here, not mid-step
  // The parameters' working copies are made under the run's precision (ParamStore).
  ActivationDTypeScope precision(precision_dtype(cfg.training.precision));
  return std::make_unique<Trainer::State>(comm, o, std::move(cfg), dev, std::move(data), std::move(vars), std::move(g));
}

}  // namespace

Trainer::Trainer(const TrainOptions& o) : s_(set_up(o)) {
  if (!o.init_from.empty()) init_weights();
  // A translation run resumes on the tokenizer it was trained with (its ids are the model's).
  if (!o.resume.empty() && s_->data.translation) check_run_tokenizer(o.resume, *s_->data.translation);
  if (!o.resume.empty()) resume();
  s_->first = s_->step;
  open_run_folder();
}

Trainer::~Trainer() = default;

int64_t Trainer::steps_done() const { return s_->step; }
int64_t Trainer::total_steps() const { return s_->total; }

// --init-from: the weights of a Hugging Face GPT-2 checkpoint or another remat run.
void Trainer::init_weights() {
  State& s = *s_;
  REMAT_CHECK(s.opt.resume.empty(), "--init-from and --resume exclude each other (a resumed run has its weights)");
  const InitFromReport r = init_from(s.opt.init_from, s.cfg, s.params, s.opt.init_from_partial);
  if (!s.opt.quiet) std::printf("%s\n", r.describe().c_str());
}

void Trainer::resume() {
  State& s = *s_;
  const TrainingConfig& tc = s.cfg.training;
  // A checkpoint holds the whole optimizer state whatever the rank count; a sharded
  // optimizer takes its shard of it.
  const NamedTensors state = s.optimizer.checkpoint_state();
  const CheckpointState c = load_checkpoint((fs::path(s.opt.resume) / "checkpoint").string(), s.params, state);
  if (s.optimizer.sharded()) s.optimizer.scatter_state(state);
  s.optimizer.set_steps_taken(c.optimizer_steps);
  if (c.config_name != s.cfg.name)
    REMAT_THROW(s.opt.resume, ": the checkpoint is of config \"", c.config_name, "\", not \"", s.cfg.name, "\"");
  REMAT_CHECK(c.seed == tc.seed, s.opt.resume, ": the checkpoint was made with seed ", c.seed, ", not ", tc.seed);
  REMAT_CHECK(c.batch == tc.batch && c.train_size == s.n_train, s.opt.resume, ": the checkpoint was made with batch ",
              c.batch, " over ", c.train_size, " training samples, this run has batch ", tc.batch, " over ", s.n_train,
              "; resuming would not continue the same run");
  s.gen.set_state({c.seed, c.rng_offset});
  s.sampler.seek(c.epoch, c.position);
  s.step = c.step;
  if (!s.opt.quiet) std::printf("resumed %s at step %lld\n", s.opt.resume.c_str(), static_cast<long long>(s.step));
  resume_schedule(c.schedule_steps);
}

// A resumed run keeps the learning-rate schedule recorded in its checkpoint, so that
// --steps N extends the run rather than redrawing its rates; --reschedule fits the
// schedule to the new length instead. One line says which.
void Trainer::resume_schedule(int64_t recorded) {
  State& s = *s_;
  const ScheduleConfig& sc = s.cfg.schedule;
  const auto lr_at = [&](int64_t step, int64_t length) { return scheduled_lr(s.cfg.optimizer, sc, step, length); };
  const long long total = s.total;
  std::string line;
  if (recorded <= 0) {
    s.schedule_total = s.total;  // a checkpoint older than the record: what every resume did then
    line = "the checkpoint records no schedule length: " + sc.type + " schedule over this run's " +
           std::to_string(total) + " steps";
  } else if (s.opt.reschedule) {
    s.schedule_total = s.total;
    line = sc.type + " schedule fitted to " + std::to_string(total) + " steps (--reschedule; the run's was " +
           std::to_string(recorded) + ")";
  } else {
    s.schedule_total = recorded;
    line = sc.type + " schedule of the run: " + std::to_string(recorded) + " steps";
    if (sc.type != "cosine") {
      line += " (a " + sc.type + " schedule does not depend on them)";
    } else if (s.total > recorded) {
      char lr[32];
      std::snprintf(lr, sizeof lr, "%.3e", lr_at(recorded, recorded));
      const std::string past = s.total == recorded + 1
                                   ? "step " + std::to_string(total) + " runs"
                                   : "steps " + std::to_string(recorded + 1) + "-" + std::to_string(total) + " run";
      line += "; " + past + " at its final lr " + lr + " (--reschedule fits it to " + std::to_string(total) + " steps)";
    } else if (s.total < recorded) {
      line += "; this run stops before its end (--reschedule fits it to " + std::to_string(total) + " steps)";
    }
  }
  if (!s.opt.quiet) std::printf("schedule: %s\n", line.c_str());
}

void Trainer::open_run_folder() {
  State& s = *s_;
  if (s.comm.rank() != 0) return;  // rank 0 writes the run folder
  s.out_dir = s.opt.out.empty() ? s.opt.resume : s.opt.out;
  if (s.out_dir.empty()) return;
  fs::create_directories(s.out_dir);
  if (s.data.translation) write_run_tokenizer(s.out_dir, *s.data.translation);
  write_file_atomic((fs::path(s.out_dir) / "config.json").string(), s.cfg.resolved().dump(2) + "\n");
  write_memory_page();
  const std::string mpath = (fs::path(s.out_dir) / "metrics.jsonl").string();
  if (!s.opt.resume.empty() && fs::exists(mpath)) {
    // Records of steps after the checkpoint were made by the interrupted run; they are
    // about to be made again.
    std::string kept;
    std::istringstream in(read_file(mpath));
    for (std::string line; std::getline(in, line);) {
      try {
        if (nlohmann::json::parse(line).value("step", int64_t{0}) <= s.step) kept += line + "\n";
      } catch (const nlohmann::json::exception&) {
        // a torn last line from the crash: drop it
      }
    }
    write_file_atomic(mpath, kept);
  }
  // A fresh run (a new folder, or --overwrite) starts metrics.jsonl over; a resumed one
  // appends to the records it kept.
  s.metrics.open(mpath, s.opt.resume.empty() ? std::ios::trunc : std::ios::app);
  REMAT_CHECK(s.metrics.good(), "cannot open ", mpath);
  if (s.opt.resume.empty()) {
    // The initial weights, so that a reference implementation can start from them.
    save_safetensors((fs::path(s.out_dir) / "init.safetensors").string(), s.params.named_values(),
                     {{"format", "remat"}, {"seed", std::to_string(s.cfg.training.seed)}});
  }
}

// memory.html: the step of this run's plan as the profiler predicts it on meta with the
// device's workspace sizes (docs/memory.md). Without Chart.js in the build it is skipped.
void Trainer::write_memory_page() {
  State& s = *s_;
  if (!memory_html_available()) {
    log().info("{}: memory.html not written: remat was built without Chart.js (libjs-chart.js)", s.out_dir);
    return;
  }
  const StepProfile p = profile_step(s.cfg, s.graph, s.plan, Device::meta(), true, &s.be);
  ProfileJsonExtras extras;
  extras.title = s.cfg.name + ", batch " + std::to_string(s.cfg.training.batch) + ", policy " + s.cfg.training.policy +
                 " (predicted for " + s.dev.str() + ")";
  write_file_atomic((fs::path(s.out_dir) / "memory.html").string(), memory_html(profile_json({p}, nullptr, extras)));
}

// ---- the phases of the loop -------------------------------------------------------------------

StepStats Trainer::step() {
  State& s = *s_;
  const Clock::time_point t0 = Clock::now();
  auto& alloc = allocator_for(s.dev);
  alloc.reset_peak();
  s.reset_comm_stats();
  const std::vector<int64_t> idx = s.sampler.next();  // may move the sampler to the next epoch
  const int64_t length = s.data.bucket_length(idx);   // the whole batch's, so every rank's
  const auto [executor, rng_words] = s.executor_for(length);
  auto micro_batch = [&](int64_t m) {
    TagScope scope(MemoryCategory::input, "data", Phase::setup);
    if (s.micros == 1) return s.data.train_batch(idx, s.sampler.epoch(), s.dev, length);
    const std::vector<int64_t> part(idx.begin() + m * s.micro, idx.begin() + (m + 1) * s.micro);
    return s.data.train_batch(part, s.sampler.epoch(), s.dev, length);
  };
  StepStats st;
  if (!s.reducer) {
    const Batch batch = micro_batch(0);
    s.params.zero_grads(s.be);
    st = executor->train_step(batch, s.gen);
    if (s.opt.on_grads) s.opt.on_grads(0, s.params.grads);
  } else {
    // Round j: this rank runs micro-batch m = j N + r, with the random draws micro-batch m
    // makes on one rank (offset base + m W), then the round's gradients are reduced.
    const int n = s.comm.size(), r = s.comm.rank();
    const int64_t rounds = s.micros / n;
    const RngState base = s.gen.state();
    std::vector<float> local(static_cast<size_t>(rounds));
    for (int64_t j = 0; j < rounds; ++j) {
      const int64_t m = j * n + r;
      const Batch batch = micro_batch(m);
      s.params.zero_grads(s.be);
      s.gen.set_state({base.seed, base.offset + static_cast<uint64_t>(m) * rng_words});
      s.reducer->begin_round(j, j + 1 == rounds);
      StepStats sm = executor->train_step(batch, s.gen);
      REMAT_CHECK(s.gen.state().offset == base.offset + static_cast<uint64_t>(m + 1) * rng_words, "micro-batch ", m,
                  ": the model drew another number of random words than its layers say");
      if (s.opt.on_grads) s.opt.on_grads(m, s.params.grads);
      local[static_cast<size_t>(j)] = read_step_loss(sm);  // the ranks' collectives drain the stream anyway
      st.recomputed_layers += sm.recomputed_layers;
      st.recompute_flops += sm.recompute_flops;
      st.forward_flops += sm.forward_flops;
      st.backward_flops += sm.backward_flops;
      s.reducer->add_round(j);
    }
    s.gen.set_state({base.seed, base.offset + static_cast<uint64_t>(s.micros) * rng_words});
    // A sharded optimizer reads only this rank's shard, unless clipping needs the norm.
    s.reducer->finish(1.0f / static_cast<float>(s.micros), !s.optimizer.sharded() || s.cfg.optimizer.grad_clip > 0.0);
    // The step's loss: the micro-batches' losses summed in micro-batch order, over K.
    std::vector<float> all(static_cast<size_t>(s.micros));
    s.comm.allgather(local.data(), all.data(), rounds);  // block r: rank r's rounds
    float sum = 0;
    for (int64_t m = 0; m < s.micros; ++m) sum += all[static_cast<size_t>((m % n) * rounds + m / n)];
    st.loss = sum / static_cast<float>(s.micros);
  }
  if (s.reducer && s.opt.on_grads) s.opt.on_grads(-1, s.params.grads);
  ++s.step;
  const double lr = scheduled_lr(s.cfg.optimizer, s.cfg.schedule, s.step, s.schedule_total);
  s.optimizer.step(lr);
  if (s.optimizer.sharded() && s.reducer) s.reducer->gather_weights();
  s.be.synchronize();  // the step's device work is part of its time
  const double ms = ms_since(t0);
  if (st.loss_value.defined()) st.loss = read_step_loss(st);
  if (!std::isfinite(st.loss)) {
    const bool have_ckpt = !s.out_dir.empty() && fs::exists(fs::path(s.out_dir) / "checkpoint" / "state.json");
    REMAT_THROW("step ", s.step, ": the loss is ", st.loss, "; stopping",
                have_ckpt ? "; the last good checkpoint is in " + s.out_dir + "/checkpoint"
                          : std::string("; no checkpoint was written"));
  }
  s.time_ms += ms;
  const dist::CommStats cs = s.comm_stats();
  s.result.comm_bytes += cs.bytes;
  s.result.comm_ms += cs.ms;
  s.result.comm_wait_ms += cs.wait_ms;
  const MemoryStats now = alloc.stats();
  if (now.peak_allocated >= s.result.peak_bytes) {
    s.result.peak_bytes = now.peak_allocated;
    s.result.peak_stats = now;
  }
  s.result.losses.push_back(st.loss);
  s.result.last_loss = st.loss;
  if (s.opt.on_step) s.opt.on_step(s.step, st.loss);
  const TrainingConfig& tc = s.cfg.training;
  if (s.step % tc.log_every == 0 || s.step == s.total || s.step == s.first + 1) log_step(st, lr, ms, now);
  return st;
}

void Trainer::log_step(const StepStats& st, double lr, double ms, const MemoryStats& mem) {
  State& s = *s_;
  const int64_t peak = mem.peak_allocated;
  // On a device that holds the whole data set, the peak includes it: say how much, so
  // that the figure is not read as the step's (memory.html and memprof profile the step).
  const int64_t data = mem.by_category_at_peak[MemoryCategory::input];
  const int64_t per_sample = s.data.text ? s.data.seq_len : 1;
  const double avg = s.time_ms / static_cast<double>(s.step - s.first);
  const double rate = static_cast<double>(s.cfg.training.batch * per_sample) / (avg / 1000.0);
  s.write_metrics({{"step", s.step},
                   {"loss", std::stod(fmt_g(st.loss))},
                   {"lr", lr},
                   {"step_ms", ms},
                   {"peak_bytes", peak},
                   {s.data.text ? "tokens_per_s" : "images_per_s", rate},
                   {"recomputed_layers", st.recomputed_layers}});
  const dist::CommStats cs = s.comm_stats();
  if (s.comm.size() > 1)
    s.write_metrics({{"step", s.step}, {"comm_bytes", cs.bytes}, {"comm_ms", cs.ms}, {"comm_wait_ms", cs.wait_ms}});
  if (s.opt.quiet) return;
  std::string comm;
  if (s.comm.size() > 1) {
    char buf[128];
    std::snprintf(buf, sizeof buf, " | comm %s %.1f ms, %.0f%% hidden", format_bytes(cs.bytes).c_str(), cs.ms,
                  cs.ms > 0 ? 100.0 * cs.hidden_ms() / cs.ms : 0.0);
    comm = buf;
  }
  const std::string peak_text =
      format_bytes(peak) + (data > peak / 10 ? " (" + format_bytes(data) + " of it the staged data)" : std::string());
  std::printf("step %lld/%lld | loss %.4f | %.0f %s/s | %.1f ms/step | peak %s%s | lr %.2e | ETA %s\n",
              static_cast<long long>(s.step), static_cast<long long>(s.total), st.loss, rate,
              s.data.text ? "tok" : "img", avg, peak_text.c_str(), comm.c_str(), lr,
              format_duration(avg * static_cast<double>(s.total - s.step) / 1000.0).c_str());
  std::fflush(stdout);
}

// Loss and accuracy over (up to eval_batches of) the eval set, in evaluation mode.
// Accuracy skips the rows the loss ignores (its ignore_index); a loss without classes has
// no accuracy (NaN).
std::pair<double, double> Trainer::evaluate() {
  State& s = *s_;
  ActivationDTypeScope precision(s.params.precision());  // accuracy reads the logits in the run's precision
  Executor ex(s.eval_graph, s.params, s.be, make_plan(s.eval_graph, "none"));
  const int64_t b = s.eval_graph.batch;
  int64_t batches = s.data.eval_size() / b;
  if (s.cfg.training.eval_batches > 0) batches = std::min(batches, s.cfg.training.eval_batches);
  double loss_sum = 0;
  int64_t correct = 0, counted = 0;
  for (int64_t k = 0; k < batches; ++k) {
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < b; ++i) idx.push_back(k * b + i);
    TagScope scope(MemoryCategory::activation, "eval", Phase::forward);
    Batch batch = s.data.eval_batch(idx, s.be.device());
    float loss = 0;
    Tensor logits = ex.evaluate(batch, &loss);
    if (s.ignore_index && s.eval_graph.targets_id >= 0) {
      const Tensor& targets = batch.at(s.eval_graph.layer(s.eval_graph.targets_id).name);
      const int64_t v = logits.size(-1);
      int64_t n = 0;
      correct += s.be.accuracy(logits.view(Shape{logits.numel() / v, v}), targets.view(Shape{targets.numel()}),
                               *s.ignore_index, &n);
      counted += n;
    }
    loss_sum += loss;
  }
  double loss = NAN, accuracy = NAN;
  if (batches > 0) {
    loss = loss_sum / static_cast<double>(batches);
    accuracy = counted ? static_cast<double>(correct) / static_cast<double>(counted) : NAN;
  }
  s.result.eval_loss = loss;
  s.result.eval_accuracy = accuracy;
  s.write_metrics({{"step", s.step}, {"eval_loss", loss}, {"eval_accuracy", accuracy}});
  if (!s.opt.quiet) {
    std::printf("eval  step %lld | loss %.4f | accuracy %.4f\n", static_cast<long long>(s.step), loss, accuracy);
    std::fflush(stdout);
  }
  return {loss, accuracy};
}

void Trainer::checkpoint() {
  State& s = *s_;
  if (s.opt.out.empty() && s.opt.resume.empty()) return;  // no run folder (rank 0's out_dir)
  NamedTensors state = s.optimizer.checkpoint_state();
  if (s.optimizer.sharded())  // every rank's shard, gathered on every rank (a collective)
    s.optimizer.gather_state(state,
                             [&](const float* send, float* recv, int64_t n) { s.comm.allgather(send, recv, n); });
  if (s.out_dir.empty() || s.comm.rank() != 0) return;
  const TrainingConfig& tc = s.cfg.training;
  CheckpointState c{s.step,
                    tc.seed,
                    s.gen.state().offset,
                    s.sampler.epoch(),
                    s.sampler.position(),
                    s.optimizer.steps_taken(),
                    tc.policy,
                    s.cfg.name,
                    tc.batch,
                    s.n_train,
                    s.schedule_total};
  save_checkpoint((fs::path(s.out_dir) / "checkpoint").string(), s.params, state, c);
}

// `length` characters from the model (batch 1, temperature 1), drawn from Philox with `seed`.
std::string Trainer::sample(int64_t length, uint64_t seed) {
  State& s = *s_;
  const RunData& data = s.data;
  Graph g = build_graph(s.cfg.model, 1, s.cfg.source, s.vars);
  Executor ex(g, s.params, s.be, make_plan(g, "none"));
  const int64_t t = data.seq_len;
  std::vector<int32_t> ctx{data.eval_text.tokens.empty() ? 0 : data.eval_text.tokens.front()};
  std::string out = data.train_text.decode(ctx);
  for (int64_t k = 0; k < length; ++k) {
    std::vector<int32_t> window(static_cast<size_t>(t), 0);
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(ctx.size()) - t);
    const int64_t len = static_cast<int64_t>(ctx.size()) - start;
    std::copy(ctx.begin() + start, ctx.end(), window.begin());
    Batch b{Tensor::from_ints(window, Shape{1, t}, s.be.device()),
            Tensor::from_ints(std::vector<int32_t>(static_cast<size_t>(t), 0), Shape{1, t}, s.be.device())};
    Tensor logits = ex.evaluate(b, nullptr);
    const int64_t v = logits.size(-1);
    const std::vector<float> all = logits.to_vector();
    const float* row = all.data() + (len - 1) * v;
    // Sample from softmax(row) with a Philox uniform (temperature 1).
    float m = row[0];
    for (int64_t j = 1; j < v; ++j) m = std::max(m, row[j]);
    double z = 0;
    for (int64_t j = 0; j < v; ++j) z += std::exp(static_cast<double>(row[j] - m));
    const double u = philox::uniform(philox::word(seed, static_cast<uint64_t>(k))) * z;
    double acc = 0;
    int32_t pick = static_cast<int32_t>(v - 1);
    for (int64_t j = 0; j < v; ++j) {
      acc += std::exp(static_cast<double>(row[j] - m));
      if (acc >= u) {
        pick = static_cast<int32_t>(j);
        break;
      }
    }
    ctx.push_back(pick);
    out += data.train_text.decode({pick});
  }
  return out;
}

// ---- the loop -------------------------------------------------------------------------------------

TrainResult Trainer::run() {
  State& s = *s_;
  const TrainingConfig& tc = s.cfg.training;
  // shards: no decoder for the ids; translation: `remat translate`
  const bool can_sample = s.data.text && !s.data.shards && !s.data.translation && s.opt.sample;
  if (!s.opt.quiet) {
    std::printf("remat train %s: %s, %lld parameters, batch %lld, %lld step%s on %s in %s\n", s.cfg.source.c_str(),
                s.cfg.name.c_str(), static_cast<long long>(s.graph.parameter_count()), static_cast<long long>(tc.batch),
                static_cast<long long>(s.total), s.total == 1 ? "" : "s", s.dev.str().c_str(), tc.precision.c_str());
    if (s.micros > 1 || s.comm.size() > 1) {
      std::string how = s.reducer->engine() + ", reduction " + s.opt.reduce;
      if (s.reducer->overlapped())
        how += ", overlapped with backward in " + std::to_string(s.reducer->buckets()) + " buckets";
      std::printf("micro-batch %lld: %lld micro-batches per step on %d rank%s (%s)\n", static_cast<long long>(s.micro),
                  static_cast<long long>(s.micros), s.comm.size(), s.comm.size() > 1 ? "s" : "", how.c_str());
    }
    if (s.optimizer.sharded())
      std::printf("optimizer state sharded over %d rank%s (ZeRO-1): %s per rank\n", s.comm.size(),
                  s.comm.size() > 1 ? "s" : "", format_bytes(s.optimizer.state_bytes()).c_str());
    std::printf("%s\n", s.plan.describe(s.graph).c_str());
    if (!s.data.describe.empty()) std::printf("data: %s\n", s.data.describe.c_str());
    if (!s.data.length_buckets.empty()) {
      std::string lengths;
      for (int64_t b : s.data.length_buckets) lengths += std::to_string(b) + ", ";
      std::printf("length buckets %sthen the model's: batches grouped by length in pools of %lld\n", lengths.c_str(),
                  static_cast<long long>(kBucketPoolBatches));
    }
    std::fflush(stdout);
  }
  allocator_for(s.dev).reset_peak();
  while (s.step < s.total) {
    step();
    // The sampler moves to the next epoch lazily: at an epoch's end position() is the
    // number of batches per epoch.
    const bool epoch_end = tc.steps == 0 && s.sampler.position() == s.sampler.batches_per_epoch();
    const bool last = s.step == s.total;
    if ((tc.eval_every > 0 && s.step % tc.eval_every == 0) || (tc.eval_every == 0 && epoch_end && !last)) evaluate();
    if (tc.checkpoint_every > 0 && s.step % tc.checkpoint_every == 0 && !last) checkpoint();
    if (can_sample && tc.sample_every > 0 && s.step % tc.sample_every == 0 && !last && !s.opt.quiet)
      std::printf("sample at step %lld:\n%s\n", static_cast<long long>(s.step),
                  printable_text(sample(tc.sample_length, tc.seed + 7 + static_cast<uint64_t>(s.step))).c_str());
  }
  if (!s.data.length_buckets.empty()) s.result.batches_by_length = s.bucket_batches;
  if (!s.data.length_buckets.empty() && !s.opt.quiet) {
    std::string used;
    for (const auto& [length, n] : s.bucket_batches)
      used += (used.empty() ? "" : ", ") + (length > 0 ? std::to_string(length) : std::string("the model's")) + ": " +
              std::to_string(n);
    std::printf("batches by length: %s\n", used.c_str());
  }
  s.result.steps = s.step;
  s.result.ranks = s.comm.size();
  s.result.policy = s.plan.policy;
  // Each length bucket's executor has its own pinned pool: the largest peak among them.
  if (const CachingAllocator* host = s.executor.host_pool()) s.result.host_peak_bytes = host->stats().peak_allocated;
  for (const auto& [length, b] : s.buckets)
    if (const CachingAllocator* host = b->executor.host_pool())
      s.result.host_peak_bytes = std::max(s.result.host_peak_bytes, host->stats().peak_allocated);
  s.result.precision = tc.precision;
  if (s.step > s.first) {
    evaluate();
    checkpoint();
    if (s.data.translation) translation_bleu();
  }
  if (can_sample && tc.sample_length > 0) {
    s.result.sample = sample(tc.sample_length, tc.seed + 7);
    if (!s.opt.quiet) std::printf("sample:\n%s\n", printable_text(s.result.sample).c_str());
  }
  return s.result;
}

// A translation run's end: greedy translations of the first kBleuPairs pairs of the valid
// split, scored with corpus BLEU (remat translate scores a whole split).
void Trainer::translation_bleu() {
  constexpr int64_t kBleuPairs = 256;
  State& s = *s_;
  const TranslationSplit& valid = s.data.translation->valid;
  const auto n = static_cast<size_t>(std::min<int64_t>(valid.size(), kBleuPairs));
  const std::vector<std::vector<int32_t>> sources(valid.source.begin(), valid.source.begin() + n);
  ActivationDTypeScope precision(s.params.precision());
  std::vector<std::string> hyps, refs;
  for (const auto& ids : greedy_decode(s.eval_graph, s.params, s.be, sources))
    hyps.push_back(s.data.translation->tokenizer.decode(ids));
  for (size_t i = 0; i < n; ++i) refs.push_back(valid.pairs[i].target);
  const BleuScore b = corpus_bleu(hyps, refs);
  s.result.valid_bleu = b.score;
  s.write_metrics({{"step", s.step}, {"valid_bleu", b.score}, {"valid_bleu_pairs", n}});
  if (!s.opt.quiet) {
    std::printf("valid %s (greedy, the first %zu pairs)\n", b.describe().c_str(), n);
    for (size_t i = 0; i < std::min<size_t>(n, 3); ++i)
      std::printf("  %s\n  -> %s\n", valid.pairs[i].source.c_str(), hyps[i].c_str());
    std::fflush(stdout);
  }
}

TrainResult train(const TrainOptions& o) { return Trainer(o).run(); }

}  // namespace remat
