// The training loop behind `remat train`.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "remat/philox.h"
#include "remat/data.h"
#include "remat/error.h"
#include "remat/interop.h"
#include "remat/io.h"
#include "remat/log.h"
#include "remat/profile.h"
#include "remat/token_shards.h"
#include "remat/train.h"

namespace fs = std::filesystem;

namespace remat {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

std::string format_duration(double seconds) {
  char buf[32];
  const auto s = static_cast<long long>(seconds + 0.5);
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, s / 60 % 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%llds", s);
  return buf;
}

Device resolve_device(const std::string& name) {
  if (name == "auto") return cuda_status().available ? Device::cuda(0) : Device::cpu();
  Device d = Device::parse(name);
  require_available(d);
  if (d.is_meta()) REMAT_THROW("cannot train on meta (it holds no data); use `remat memprof --device meta`");
  return d;
}

// The data a config asks for: training and evaluation sets, images or text.
struct Data {
  bool text = false;
  bool shards = false;  // text as token shards (train_shards, eval_shards), not train_text
  ImageDataset train_images, eval_images;
  TextDataset train_text, eval_text;
  TokenShards train_shards, eval_shards;
  int64_t vocab = 0;  // shards: the model's vocabulary, which every token is checked against
  std::string describe;  // shards: which files train and evaluate
  int64_t seq_len = 0;
  double hflip = 0.0;  // data.augment.hflip: training images only
  uint64_t seed = 0;   // the run's seed, which the flips are drawn from
  int64_t train_size() const {
    if (shards) return train_shards.windows(seq_len);
    return text ? text_windows(train_text, seq_len) : train_images.labels.numel();
  }
  int64_t eval_size() const {
    if (shards) return eval_shards.windows(seq_len);
    return text ? text_windows(eval_text, seq_len) : eval_images.labels.numel();
  }
  // A training batch of the sampler's epoch `epoch`, augmented as the config asks.
  Batch train_batch(const std::vector<int64_t>& idx, int64_t epoch, Device d) const {
    std::vector<uint8_t> flips;
    if (!text && hflip > 0) flips = hflip_draws(seed, epoch, train_size(), idx, hflip);
    if (shards) return train_shards.batch(idx, seq_len, vocab, d);
    return batch(train_images, train_text, idx, d, flips);
  }
  Batch eval_batch(const std::vector<int64_t>& idx, Device d) const {
    if (shards) return eval_shards.batch(idx, seq_len, vocab, d);
    return batch(eval_images, eval_text, idx, d, {});  // never augmented
  }

 private:
  // Sample i is image i, or the text window starting at token i * seq_len.
  Batch batch(const ImageDataset& images, const TextDataset& txt, const std::vector<int64_t>& idx, Device d,
              const std::vector<uint8_t>& flips) const {
    if (!text) return image_batch(images, idx, d, flips);
    std::vector<int64_t> starts;
    for (int64_t i : idx) starts.push_back(i * seq_len);
    return text_batch(txt, starts, seq_len, d);
  }
};

Data load_data(const Config& cfg, const nlohmann::json& model) {
  Data d;
  const DataConfig& dc = cfg.data;
  d.hflip = dc.augment.hflip;
  d.seed = cfg.training.seed;
  const bool tokens = model.contains("input") && model["input"].is_object() && model["input"].value("type", "image") == "tokens";
  if (dc.dataset == "fashion_mnist" || dc.dataset == "synthetic_images") {
    if (tokens) REMAT_THROW(cfg.source, ": /data/dataset: ", dc.dataset, " gives images but the model takes tokens");
    if (dc.dataset == "fashion_mnist") {
      const std::string dir = dc.path.empty() ? default_fashion_mnist_dir() : dc.path;
      auto tr = fashion_mnist_paths(dir, "train");
      auto te = fashion_mnist_paths(dir, "test");
      d.train_images = load_idx(tr.first, tr.second);
      d.eval_images = load_idx(te.first, te.second);
    } else {
      const auto& s = dc.image_shape;
      REMAT_CHECK(s.size() == 3, cfg.source, ": /data/image_shape: expected [C, H, W]");
      // One set of the seed's classes: the first synthetic_size samples train, the next
      // quarter evaluates (sample i depends only on (seed, i)).
      const int64_t n_train = dc.synthetic_size, n_eval = std::max<int64_t>(dc.synthetic_size / 4, 1);
      ImageDataset all = synthetic_images(n_train + n_eval, static_cast<int>(s[0]), static_cast<int>(s[1]),
                                          static_cast<int>(s[2]), static_cast<int>(dc.classes), cfg.training.seed);
      const int64_t per = all.images.numel() / (n_train + n_eval);
      auto slice = [&](int64_t b, int64_t n) {
        ImageDataset d2;
        d2.num_classes = all.num_classes;
        d2.source = all.source;
        TagScope scope(MemoryCategory::input, "data", Phase::setup);
        d2.images = Tensor::empty(Shape{n, s[0], s[1], s[2]});
        d2.labels = Tensor::empty(Shape{n}, Device::cpu(), DType::i32);
        std::copy(all.images.f32() + b * per, all.images.f32() + (b + n) * per, d2.images.f32());
        std::copy(all.labels.i32() + b, all.labels.i32() + b + n, d2.labels.i32());
        return d2;
      };
      d.train_images = slice(0, n_train);
      d.eval_images = slice(n_train, n_eval);
    }
    return d;
  }
  if (!tokens) REMAT_THROW(cfg.source, ": /data/dataset: ", dc.dataset, " gives text but the model takes images");
  d.text = true;
  if (dc.dataset == "token_shards") {
    TokenShardData sd = load_token_shard_data(dc.path, dc.eval_fraction);
    d.shards = true;
    d.train_shards = std::move(sd.train);
    d.eval_shards = std::move(sd.eval);
    d.describe = std::move(sd.describe);
    return d;
  }
  TextDataset all;
  if (dc.dataset == "text") {
    if (dc.path.empty()) all = load_text_corpus(default_text_corpus_dir());
    else if (fs::is_directory(dc.path)) all = load_text_corpus(dc.path);
    else all = load_text(dc.path);
  } else {
    all = synthetic_text(dc.synthetic_size, static_cast<int>(dc.vocab), cfg.training.seed);
  }
  const auto n = static_cast<int64_t>(all.tokens.size());
  const auto n_eval = static_cast<int64_t>(static_cast<double>(n) * dc.eval_fraction);
  d.train_text = all;
  d.eval_text = all;
  d.train_text.tokens.assign(all.tokens.begin(), all.tokens.end() - n_eval);
  d.eval_text.tokens.assign(all.tokens.end() - n_eval, all.tokens.end());
  return d;
}

int64_t largest_divisor_at_most(int64_t n, int64_t cap) {
  for (int64_t b = std::min(n, cap); b > 1; --b)
    if (n % b == 0) return b;
  return 1;
}

// Loss and accuracy over (up to max_batches of) the eval set, in evaluation mode.
// Accuracy skips the rows the loss ignores (the model's loss.ignore_index).
std::pair<double, double> evaluate(const Data& data, const Graph& eval_graph, ParamStore& params, Backend& be,
                                   int64_t max_batches, int ignore_index) {
  Executor ex(eval_graph, params, be, make_plan(eval_graph, "none"));
  const int64_t b = eval_graph.batch;
  int64_t batches = data.eval_size() / b;
  if (max_batches > 0) batches = std::min(batches, max_batches);
  double loss_sum = 0;
  int64_t correct = 0, counted = 0;
  for (int64_t k = 0; k < batches; ++k) {
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < b; ++i) idx.push_back(k * b + i);
    TagScope scope(MemoryCategory::activation, "eval", Phase::forward);
    Batch batch = data.eval_batch(idx, be.device());
    float loss = 0;
    Tensor logits = ex.evaluate(batch, &loss);
    const int64_t v = logits.size(-1);
    int64_t n = 0;
    correct += be.accuracy(logits.view(Shape{logits.numel() / v, v}), batch.targets.view(Shape{batch.targets.numel()}),
                           ignore_index, &n);
    counted += n;
    loss_sum += loss;
  }
  if (batches == 0) return {NAN, NAN};
  return {loss_sum / static_cast<double>(batches), counted ? static_cast<double>(correct) / counted : NAN};
}

std::string generate_sample(const Data& data, const Config& cfg, const std::map<std::string, int64_t>& vars,
                            ParamStore& params, Backend& be, int64_t length, uint64_t seed) {
  Graph g = build_graph(cfg.model, 1, cfg.source, vars);
  Executor ex(g, params, be, make_plan(g, "none"));
  const int64_t t = data.seq_len;
  std::vector<int32_t> ctx{data.eval_text.tokens.empty() ? 0 : data.eval_text.tokens.front()};
  std::string out = data.train_text.decode(ctx);
  for (int64_t k = 0; k < length; ++k) {
    std::vector<int32_t> window(static_cast<size_t>(t), 0);
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(ctx.size()) - t);
    const int64_t len = static_cast<int64_t>(ctx.size()) - start;
    std::copy(ctx.begin() + start, ctx.end(), window.begin());
    Batch b{Tensor::from_ints(window, Shape{1, t}, be.device()), Tensor::from_ints(std::vector<int32_t>(static_cast<size_t>(t), 0), Shape{1, t}, be.device())};
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

std::string fmt_g(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace

TrainResult train(const TrainOptions& o) {
  Config cfg = load_config(o.config, o.dataset);
  if (!o.policy.empty()) cfg.training.policy = o.policy;
  if (o.steps >= 0) cfg.training.steps = o.steps;
  if (o.epochs >= 0) {
    cfg.training.epochs = o.epochs;
    if (o.steps < 0) cfg.training.steps = 0;
  }
  if (o.batch == 0) REMAT_THROW("--batch must be positive");
  if (o.batch > 0) cfg.training.batch = o.batch;
  if (o.seed >= 0) cfg.training.seed = static_cast<uint64_t>(o.seed);
  if (!o.data_path.empty()) cfg.data.path = o.data_path;
  if (!o.data_path.empty() && cfg.data.dataset.rfind("synthetic", 0) == 0)
    REMAT_THROW("--data ", o.data_path, ": the data set of ", o.config, " is ", cfg.data.dataset,
                ", which reads no files; pass --dataset too (token_shards, text, fashion_mnist)");
  const TrainingConfig& tc = cfg.training;

  const Device dev = resolve_device(o.device);
  Backend& be = backend_for(dev);
  Data data = load_data(cfg, cfg.model);
  std::map<std::string, int64_t> vars;
  if (data.text) {
    vars["vocab"] = data.shards ? cfg.data.vocab : data.train_text.vocab_size();
    data.seq_len = cfg.model["input"].value("seq_len", int64_t{0});
  }
  Graph g = build_graph(cfg.model, tc.batch, cfg.source, vars);
  if (data.text) data.seq_len = g.layer(g.input_id).out_shape[1];
  if (data.shards) data.vocab = g.layer(g.logits_id).out_shape[-1];
  const CheckpointPlan plan = resolve_policy(cfg, g, tc.policy, &be);  // budgets with this device's workspace sizes
  const int64_t n_train = data.train_size();
  REMAT_CHECK(n_train >= tc.batch, cfg.source, ": the training set has ", n_train, " samples, fewer than one batch of ",
              tc.batch);
  BatchSampler sampler(n_train, tc.batch, tc.seed, cfg.data.shuffle);
  const int64_t total = tc.steps > 0 ? tc.steps : tc.epochs * sampler.batches_per_epoch();
  REMAT_CHECK(total > 0, cfg.source, ": /training: set steps or epochs (or pass --steps / --epochs)");

  ParamStore params(g, dev, tc.seed, /*initialise=*/o.init_from.empty());  // init_from sets them
  if (!o.init_from.empty()) {
    REMAT_CHECK(o.resume.empty(), "--init-from and --resume exclude each other (a resumed run has its weights)");
    const InitFromReport r = init_from(o.init_from, cfg, params, o.init_from_partial);
    if (!o.quiet) std::printf("%s\n", r.describe().c_str());
  }
  Optimizer optimizer(cfg.optimizer, params, be);
  Executor ex(g, params, be, plan, ExecOptions{o.verify_recompute});
  RngGenerator gen(tc.seed);
  const int64_t eval_b = largest_divisor_at_most(std::max<int64_t>(data.eval_size(), 1), data.text ? tc.batch : 500);
  Graph eval_graph = build_graph(cfg.model, eval_b, cfg.source, vars);
  // build_graph has validated the loss section.
  const int ignore_index = cfg.model.contains("loss") ? cfg.model["loss"].value("ignore_index", -100) : -100;

  int64_t step = 0;
  if (!o.resume.empty()) {
    const CheckpointState s = load_checkpoint((fs::path(o.resume) / "checkpoint").string(), params, optimizer);
    if (s.config_name != cfg.name)
      REMAT_THROW(o.resume, ": the checkpoint is of config \"", s.config_name, "\", not \"", cfg.name, "\"");
    REMAT_CHECK(s.seed == tc.seed, o.resume, ": the checkpoint was made with seed ", s.seed, ", not ", tc.seed);
    REMAT_CHECK(s.batch == tc.batch && s.train_size == n_train, o.resume, ": the checkpoint was made with batch ",
                s.batch, " over ", s.train_size, " training samples, this run has batch ", tc.batch, " over ", n_train,
                "; resuming would not continue the same run");
    gen.set_state({s.seed, s.rng_offset});
    sampler.seek(s.epoch, s.position);
    step = s.step;
    if (!o.quiet) std::printf("resumed %s at step %lld\n", o.resume.c_str(), static_cast<long long>(step));
  }
  const std::string out_dir = o.out.empty() ? o.resume : o.out;
  std::ofstream metrics;
  if (!out_dir.empty()) {
    fs::create_directories(out_dir);
    write_file_atomic((fs::path(out_dir) / "config.json").string(), cfg.resolved().dump(2) + "\n");
    const std::string mpath = (fs::path(out_dir) / "metrics.jsonl").string();
    if (!o.resume.empty() && fs::exists(mpath)) {
      // Records of steps after the checkpoint were made by the interrupted run; they are
      // about to be made again.
      std::string kept;
      std::istringstream in(read_file(mpath));
      for (std::string line; std::getline(in, line);) {
        try {
          if (nlohmann::json::parse(line).value("step", int64_t{0}) <= step) kept += line + "\n";
        } catch (const nlohmann::json::exception&) {
          // a torn last line from the crash: drop it
        }
      }
      write_file_atomic(mpath, kept);
    }
    metrics.open(mpath, std::ios::app);
    REMAT_CHECK(metrics.good(), "cannot open ", (fs::path(out_dir) / "metrics.jsonl").string());
  }
  if (!out_dir.empty() && o.resume.empty()) {
    // The initial weights, so that a reference implementation can start from them.
    save_safetensors((fs::path(out_dir) / "init.safetensors").string(), params.named_values(),
                     {{"format", "remat"}, {"seed", std::to_string(tc.seed)}});
  }
  auto write_metrics = [&](const nlohmann::json& j) {
    if (metrics.is_open()) {
      metrics << j.dump() << "\n";
      metrics.flush();
    }
  };
  auto checkpoint = [&] {
    if (out_dir.empty()) return;
    CheckpointState s{step, tc.seed, gen.state().offset, sampler.epoch(), sampler.position(), optimizer.steps_taken(),
                      tc.policy, cfg.name, tc.batch, n_train};
    save_checkpoint((fs::path(out_dir) / "checkpoint").string(), params, optimizer, s);
  };

  if (!o.quiet) {
    std::printf("remat train %s: %s, %lld parameters, batch %lld, %lld steps on %s\n", cfg.source.c_str(),
                cfg.name.c_str(), static_cast<long long>(g.parameter_count()), static_cast<long long>(tc.batch),
                static_cast<long long>(total), dev.str().c_str());
    if (!data.describe.empty()) std::printf("data: %s\n", data.describe.c_str());
    std::printf("%s\n", plan.describe(g).c_str());
    std::fflush(stdout);
  }
  TrainResult result;
  auto& alloc = allocator_for(dev);
  alloc.reset_peak();
  const int64_t first = step;
  double time_ms = 0;
  const int64_t per_sample = data.text ? data.seq_len : 1;
  auto run_eval = [&] {
    auto [el, ea] = evaluate(data, eval_graph, params, be, tc.eval_batches, ignore_index);
    result.eval_loss = el;
    result.eval_accuracy = ea;
    write_metrics({{"step", step}, {"eval_loss", el}, {"eval_accuracy", ea}});
    if (!o.quiet) {
      std::printf("eval  step %lld | loss %.4f | accuracy %.4f\n", static_cast<long long>(step), el, ea);
      std::fflush(stdout);
    }
  };
  while (step < total) {
    const Clock::time_point t0 = Clock::now();
    alloc.reset_peak();
    Batch batch;
    {
      TagScope scope(MemoryCategory::input, "data", Phase::setup);
      const std::vector<int64_t> idx = sampler.next();  // may move the sampler to the next epoch
      batch = data.train_batch(idx, sampler.epoch(), dev);
    }
    params.zero_grads(be);
    const StepStats st = ex.train_step(batch, gen);
    ++step;
    if (!std::isfinite(st.loss)) {
      const bool have_ckpt = !out_dir.empty() && fs::exists(fs::path(out_dir) / "checkpoint" / "state.json");
      REMAT_THROW("step ", step, ": the loss is ", st.loss, "; stopping",
                  have_ckpt ? "; the last good checkpoint is in " + out_dir + "/checkpoint" : std::string("; no checkpoint was written"));
    }
    const double lr = scheduled_lr(cfg.optimizer, cfg.schedule, step, total);
    optimizer.step(lr);
    const double ms = ms_since(t0);
    time_ms += ms;
    const MemoryStats ms_now = alloc.stats();
    const int64_t peak = ms_now.peak_allocated;
    if (peak >= result.peak_bytes) {
      result.peak_bytes = peak;
      result.peak_stats = ms_now;
    }
    result.losses.push_back(st.loss);
    result.last_loss = st.loss;
    if (o.on_step) o.on_step(step, st.loss);
    const bool log_now = step % tc.log_every == 0 || step == total || step == first + 1;
    if (log_now) {
      const double avg = time_ms / static_cast<double>(step - first);
      const double rate = static_cast<double>(tc.batch * per_sample) / (avg / 1000.0);
      write_metrics({{"step", step}, {"loss", std::stod(fmt_g(st.loss))}, {"lr", lr}, {"step_ms", ms},
                     {"peak_bytes", peak}, {data.text ? "tokens_per_s" : "images_per_s", rate},
                     {"recomputed_layers", st.recomputed_layers}});
      if (!o.quiet) {
        std::printf("step %lld/%lld | loss %.4f | %.0f %s/s | %.1f ms/step | peak %s | lr %.2e | ETA %s\n",
                    static_cast<long long>(step), static_cast<long long>(total), st.loss, rate,
                    data.text ? "tok" : "img", avg, format_bytes(peak).c_str(), lr,
                    format_duration(avg * static_cast<double>(total - step) / 1000.0).c_str());
        std::fflush(stdout);
      }
    }
    // The sampler moves to the next epoch lazily: at an epoch's end position() is the
    // number of batches per epoch.
    const bool epoch_end = tc.steps == 0 && sampler.position() == sampler.batches_per_epoch();
    if ((tc.eval_every > 0 && step % tc.eval_every == 0) || (tc.eval_every == 0 && epoch_end && step != total)) run_eval();
    if (tc.checkpoint_every > 0 && step % tc.checkpoint_every == 0 && step != total) checkpoint();
    if (data.text && !data.shards && o.sample && tc.sample_every > 0 && step % tc.sample_every == 0 && step != total && !o.quiet)
      std::printf("sample at step %lld:\n%s\n", static_cast<long long>(step),
                  generate_sample(data, cfg, vars, params, be, tc.sample_length, tc.seed + 7 + static_cast<uint64_t>(step)).c_str());
  }
  result.steps = step;
  if (step > first) {
    run_eval();
    checkpoint();
  }
  if (data.text && !data.shards && o.sample && tc.sample_length > 0) {  // shards: no decoder for the ids
    result.sample = generate_sample(data, cfg, vars, params, be, tc.sample_length, tc.seed + 7);
    if (!o.quiet) std::printf("sample:\n%s\n", result.sample.c_str());
  }
  return result;
}

}  // namespace remat
