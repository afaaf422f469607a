// `remat eval`: a language model's loss and perplexity on token shards. Windows of
// seq_len tokens (stride seq_len, as in training) are taken in file order; each target
// token counts once, so the loss is the mean over every target of the windows. A
// translation model's loss and BLEU on a corpus split; any other model's loss and
// accuracy on its evaluation set.
#include "remat/evaluate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <numeric>

#include "remat/data.h"
#include "remat/error.h"
#include "remat/executor.h"
#include "remat/io.h"
#include "remat/token_shards.h"
#include "remat/translate.h"
#include "remat/translation.h"
#include "train/run_data.h"

namespace remat {

namespace {

// The options both kinds of model share, checked, and the device evaluated on.
Device eval_device(const EvalOptions& o) {
  REMAT_CHECK(!o.batch || *o.batch > 0, "--batch ", o.batch.value_or(0), ": must be positive");
  REMAT_CHECK(!o.seed || *o.seed >= 0, "--seed ", o.seed.value_or(0), ": must be 0 or more");
  const Device dev =
      o.device == "auto" ? (cuda_status().available ? Device::cuda(0) : Device::cpu()) : Device::parse(o.device);
  require_available(dev);
  if (dev.is_meta()) REMAT_THROW("cannot evaluate on meta (it holds no data)");
  return dev;
}

// A run folder (the --out of remat train) stands for its config.json and, unless other
// weights are named, its own.
void open_run_folder(std::string& config, std::string& init_from) {
  if (!std::filesystem::is_directory(config)) return;
  const std::string run = config;
  config = (std::filesystem::path(run) / "config.json").string();
  if (!std::filesystem::exists(config))
    REMAT_THROW(run, ": not a run folder (no config.json); pass a model config or the --out folder of `remat train`");
  if (init_from.empty()) init_from = run;
}

// Samples [0, n) in order, g's batch at a time and the rest as one batch of a graph of that
// size (the same parameters), each batch's indices handed to visit(ex, idx) in evaluation.
template <typename Visit>
void over_batches(const Config& cfg, const Graph& g, const std::map<std::string, int64_t>& vars, ParamStore& params,
                  Backend& be, int64_t n, Visit visit) {
  int64_t done = 0;
  auto run = [&](const Graph& graph, int64_t count) {
    Executor ex(graph, params, be, make_plan(graph, "none"));
    for (int64_t k = 0; k < count; ++k, done += graph.batch) {
      std::vector<int64_t> idx(static_cast<size_t>(graph.batch));
      std::iota(idx.begin(), idx.end(), done);
      visit(ex, idx);
    }
  };
  if (n / g.batch > 0) run(g, n / g.batch);
  if (n % g.batch > 0) run(build_graph(cfg.model, n % g.batch, cfg.source, vars), 1);
}

// --split names a split of a translation corpus; other models have one evaluation set.
void refuse_split(const EvalOptions& o, const char* what) {
  REMAT_CHECK(!o.split, "--split ", o.split.value_or(""), ": ", what,
              " evaluates one set; --split chooses among a translation corpus's splits");
}

}  // namespace

EvalResult evaluate_lm(const EvalOptions& o) {
  using Clock = std::chrono::steady_clock;
  Config cfg = load_config(o.config);
  REMAT_CHECK(o.max_batches >= 0, "--max-batches ", o.max_batches, ": must be 0 (every window) or more");
  refuse_split(o, "a language model on token shards");
  const int64_t batch = o.batch.value_or(cfg.training.batch);
  const uint64_t seed = o.seed ? static_cast<uint64_t>(*o.seed) : cfg.training.seed;
  const bool shards_config = cfg.data.dataset == "token_shards";
  const std::string path = !o.data_path.empty() ? o.data_path : shards_config ? cfg.data.path : "";
  if (path.empty())
    REMAT_THROW(o.config,
                ": remat eval reads token shards: pass --data (a shard file, folder or pattern) or use a "
                "config with data.dataset \"token_shards\" and data.path");
  REMAT_CHECK(declared_input_type(cfg.model, kInputName) == "tokens", o.config,
              ": /model: remat eval needs a model of tokens (an input \"input\" of type \"tokens\")");

  const Device dev = eval_device(o);
  Backend& be = backend_for(dev);

  EvalResult res;
  const TokenShards data = load_eval_token_shards(path, &res.data);
  // $vocab: the shards' vocabulary (data.vocab; GPT-2's unless the config says otherwise).
  const std::map<std::string, int64_t> vars{{"vocab", shards_config ? cfg.data.vocab : kGpt2Vocab}};
  Graph g = build_graph(cfg.model, batch, cfg.source, vars);
  const int64_t seq_len = g.layer(g.require_input(kInputName, "remat eval")).out_shape[1];
  const int64_t vocab = g.layer(g.logits_id).out_shape[-1];
  ParamStore params(g, dev, seed, /*initialise=*/o.init_from.empty());  // init_from sets them
  if (!o.init_from.empty()) {
    res.init = init_from(o.init_from, cfg, params, o.init_from_partial);
    if (!o.quiet) std::printf("%s\n", res.init.describe().c_str());
  }
  res.windows = data.windows(seq_len);
  REMAT_CHECK(res.windows > 0, res.data, ": ", data.tokens(), " tokens, too few for one window of ", seq_len,
              " tokens and its target");
  int64_t n_windows = res.windows;
  if (o.max_batches > 0) n_windows = std::min(n_windows, o.max_batches * batch);
  if (!o.quiet) {
    std::printf("remat eval %s: %s on %s, %lld windows of %lld tokens in batches of %lld\n", o.config.c_str(),
                res.data.c_str(), dev.str().c_str(), static_cast<long long>(n_windows), static_cast<long long>(seq_len),
                static_cast<long long>(batch));
    std::fflush(stdout);
  }

  const Clock::time_point t0 = Clock::now();
  double loss_sum = 0;  // sum over target tokens
  int64_t done = 0;
  over_batches(cfg, g, vars, params, be, n_windows, [&](Executor& ex, const std::vector<int64_t>& idx) {
    const auto b = static_cast<int64_t>(idx.size());
    {
      TagScope scope(MemoryCategory::activation, "eval", Phase::forward);
      const Batch bt = data.batch(idx, seq_len, vocab, dev);
      float loss = 0;
      Tensor logits = ex.evaluate(bt, &loss);
      if (!std::isfinite(loss)) REMAT_THROW("eval: the loss of windows ", done, "..", done + b - 1, " is ", loss);
      if (done == 0 && !o.save_logits.empty())
        save_safetensors(o.save_logits, {{"input_ids", bt.input()}, {"targets", bt.targets()}, {"logits", logits}},
                         {{"format", "remat"}, {"config", cfg.name}});
      loss_sum += static_cast<double>(loss) * static_cast<double>(b * seq_len);
      done += b;
      ++res.batches;
      if (!o.quiet && (res.batches % 50 == 0)) {
        std::printf("  %lld/%lld windows | loss so far %.4f\n", static_cast<long long>(done),
                    static_cast<long long>(n_windows), loss_sum / static_cast<double>(done * seq_len));
        std::fflush(stdout);
      }
    }
  });
  res.tokens = done * seq_len;
  res.loss = loss_sum / static_cast<double>(res.tokens);
  res.perplexity = std::exp(res.loss);
  if (!o.quiet) {
    std::printf("eval: loss %.6f | perplexity %.4f | %lld windows, %lld target tokens | %.1f s\n", res.loss,
                res.perplexity, static_cast<long long>(done), static_cast<long long>(res.tokens),
                std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return res;
}

EvalResult evaluate_translation(const EvalOptions& o) {
  using Clock = std::chrono::steady_clock;
  const Config cfg = load_config(o.config);
  REMAT_CHECK(cfg.data.dataset == "translation", o.config, ": data.dataset is \"", cfg.data.dataset,
              "\", not translation");
  REMAT_CHECK(o.data_path.empty(), "--data: a translation model reads its corpus (data.path), not token shards");
  REMAT_CHECK(o.save_logits.empty(), "--save-logits: language models only");
  REMAT_CHECK(o.max_batches >= 0, "--max-batches ", o.max_batches, ": must be 0 (every pair) or more");
  const Device dev = eval_device(o);
  Backend& be = backend_for(dev);

  EvalResult res;
  const bool default_dir = cfg.data.path.empty();
  res.data = default_dir ? default_translation_corpus_dir(cfg.data.vocab) : cfg.data.path;
  TranslationData data = load_translation_data(res.data, cfg.data.vocab, default_dir);
  if (data.tokenizer.vocab() != cfg.data.vocab)
    REMAT_THROW(o.config, ": the model reads ", cfg.data.vocab, " pieces, but the tokenizer of ", res.data, " has ",
                data.tokenizer.vocab(), " (was the corpus rebuilt with another --vocab?)");
  if (!o.init_from.empty() && std::filesystem::is_directory(o.init_from)) check_run_tokenizer(o.init_from, data);
  const int64_t batch = o.batch.value_or(cfg.training.batch);
  const std::map<std::string, int64_t> vars{{"vocab", cfg.data.vocab}};
  const Graph g = build_graph(cfg.model, batch, cfg.source, vars);
  const int64_t S = g.layer(g.require_input(kSourceName, "remat eval")).out_shape[1];
  const int64_t T = g.layer(g.require_input(kTargetInName, "remat eval")).out_shape[1];
  data.fit(S, T);
  const std::string split_name = o.split.value_or("test");
  const TranslationSplit& split = data.split(split_name);
  REMAT_CHECK(split.size() > 0, res.data, ": no ", split_name, " pair fits the model's ", S, " source and ", T,
              " target pieces");
  int64_t n = split.size();
  if (o.max_batches > 0) n = std::min(n, o.max_batches * batch);

  // The run's precision, as in training and translate.
  ActivationDTypeScope precision(precision_dtype(cfg.training.precision));
  const uint64_t seed = o.seed ? static_cast<uint64_t>(*o.seed) : cfg.training.seed;
  ParamStore params(g, dev, seed, /*initialise=*/o.init_from.empty());
  if (!o.init_from.empty()) {
    res.init = init_from(o.init_from, cfg, params, o.init_from_partial);
    if (!o.quiet) std::printf("%s\n", res.init.describe().c_str());
  }
  if (!o.quiet) {
    std::printf("eval: %lld pairs of the %s split of %s on %s, batch %lld\n", static_cast<long long>(n),
                split_name.c_str(), res.data.c_str(), dev.str().c_str(), static_cast<long long>(batch));
    std::fflush(stdout);
  }
  const Clock::time_point t0 = Clock::now();
  // The loss: the loss layer's mean over each batch's counted targets (those not its
  // ignore index), weighted by their count. A short last batch runs at its own size.
  const std::optional<int> ignore = g.layer(g.loss_id).ignore_index();
  double loss_sum = 0;
  for (int64_t first = 0; first < n; first += batch) {
    const int64_t b = std::min(batch, n - first);
    const Graph tail = b == batch ? Graph() : build_graph(cfg.model, b, cfg.source, vars);
    const Graph& gb = b == batch ? g : tail;
    std::vector<int64_t> idx(static_cast<size_t>(b));
    for (int64_t i = 0; i < b; ++i) idx[static_cast<size_t>(i)] = first + i;
    TagScope scope(MemoryCategory::activation, "eval", Phase::forward);
    const Batch bt = translation_batch(split, idx, S, T, dev);
    int64_t counted = 0;
    for (int32_t t : bt.at(kTargetsName).to_ints()) counted += !ignore || t != *ignore;
    Executor ex(gb, params, be, make_plan(gb, "none"));
    float loss = 0;
    ex.evaluate(bt, &loss);
    if (!std::isfinite(loss)) REMAT_THROW("eval: the loss of pairs ", first, "..", first + b - 1, " is ", loss);
    loss_sum += static_cast<double>(loss) * static_cast<double>(counted);
    res.tokens += counted;
    ++res.batches;
  }
  res.windows = n;
  res.loss = loss_sum / static_cast<double>(std::max<int64_t>(1, res.tokens));
  res.perplexity = std::exp(res.loss);
  // BLEU of greedy translations (remat translate's, with the key/value cache).
  std::vector<std::vector<int32_t>> sources(split.source.begin(), split.source.begin() + n);
  std::vector<std::string> hyps, refs, srcs;
  for (const auto& ids : greedy_decode(g, params, be, sources)) hyps.push_back(data.tokenizer.decode(ids));
  for (int64_t i = 0; i < n; ++i) {
    refs.push_back(split.pairs[static_cast<size_t>(i)].target);
    srcs.push_back(split.pairs[static_cast<size_t>(i)].source);
  }
  res.bleu = corpus_bleu(hyps, refs);
  res.copy_bleu = corpus_bleu(srcs, refs);
  if (!o.quiet) {
    std::printf("eval: loss %.6f | perplexity %.4f | %lld pairs, %lld target pieces | %.1f s\n", res.loss,
                res.perplexity, static_cast<long long>(n), static_cast<long long>(res.tokens),
                std::chrono::duration<double>(Clock::now() - t0).count());
    std::printf("greedy %s\ncopy-the-source baseline: %s\n", res.bleu->describe().c_str(),
                res.copy_bleu->describe().c_str());
  }
  return res;
}

EvalResult evaluate_dataset(const EvalOptions& o) {
  using Clock = std::chrono::steady_clock;
  Config cfg = load_config(o.config);
  REMAT_CHECK(cfg.data.dataset != "translation" && cfg.data.dataset != "token_shards", o.config, ": data.dataset \"",
              cfg.data.dataset, "\" is evaluated by remat eval's own path for it");
  REMAT_CHECK(o.data_path.empty(), "--data: token shards, for a language model; ", o.config, " reads data.dataset \"",
              cfg.data.dataset, "\" and is evaluated on its evaluation set");
  REMAT_CHECK(o.save_logits.empty(), "--save-logits: language models on token shards only");
  REMAT_CHECK(o.max_batches >= 0, "--max-batches ", o.max_batches, ": must be 0 (the whole set) or more");
  refuse_split(o, std::string("a model of data.dataset \"" + cfg.data.dataset + "\"").c_str());
  const Device dev = eval_device(o);
  Backend& be = backend_for(dev);
  const int64_t batch = o.batch.value_or(cfg.training.batch);
  const uint64_t seed = o.seed ? static_cast<uint64_t>(*o.seed) : cfg.training.seed;

  EvalResult res;
  RunData data = load_run_data(cfg, cfg.model);
  std::map<std::string, int64_t> vars;
  if (data.text) vars["vocab"] = data.train_text.vocab_size();
  Graph g = build_graph(cfg.model, batch, cfg.source, vars);
  fit_data_to_model(data, g, cfg);  // the data against the model, named before any batch
  ParamStore params(g, dev, seed, /*initialise=*/o.init_from.empty());
  if (!o.init_from.empty()) {
    res.init = init_from(o.init_from, cfg, params, o.init_from_partial);
    if (!o.quiet) std::printf("%s\n", res.init.describe().c_str());
  }
  const std::optional<int> ignore = g.layer(g.loss_id).ignore_index();
  int64_t n = data.eval_size();
  REMAT_CHECK(n > 0, o.config, ": the evaluation set of data.dataset \"", cfg.data.dataset, "\" is empty");
  if (o.max_batches > 0) n = std::min(n, o.max_batches * batch);
  const char* unit = data.text ? "windows" : "images";
  res.data = cfg.data.dataset + (cfg.data.path.empty() ? std::string() : " (" + cfg.data.path + ")");
  if (!o.quiet) {
    std::printf("remat eval %s: the evaluation set of %s on %s, %lld %s in batches of %lld\n", o.config.c_str(),
                res.data.c_str(), dev.str().c_str(), static_cast<long long>(n), unit, static_cast<long long>(batch));
    std::fflush(stdout);
  }

  const Clock::time_point t0 = Clock::now();
  ActivationDTypeScope precision(params.precision());  // accuracy reads the logits in the run's precision
  double loss_sum = 0;                                 // per sample
  int64_t done = 0, correct = 0, counted = 0;
  over_batches(cfg, g, vars, params, be, n, [&](Executor& ex, const std::vector<int64_t>& idx) {
    const auto b = static_cast<int64_t>(idx.size());
    {
      TagScope scope(MemoryCategory::activation, "eval", Phase::forward);
      const Batch bt = data.eval_batch(idx, dev);
      float loss = 0;
      Tensor logits = ex.evaluate(bt, &loss);
      if (!std::isfinite(loss)) REMAT_THROW("eval: the loss of ", unit, " ", done, "..", done + b - 1, " is ", loss);
      if (ignore && g.targets_id >= 0) {
        const Tensor& targets = bt.at(g.layer(g.targets_id).name);
        const int64_t v = logits.size(-1);
        int64_t m = 0;
        correct +=
            be.accuracy(logits.view(Shape{logits.numel() / v, v}), targets.view(Shape{targets.numel()}), *ignore, &m);
        counted += m;
      }
      loss_sum += static_cast<double>(loss) * static_cast<double>(b);
      done += b;
      ++res.batches;
      if (!o.quiet && res.batches % 50 == 0) {
        std::printf("  %lld/%lld %s | loss so far %.4f\n", static_cast<long long>(done), static_cast<long long>(n),
                    unit, loss_sum / static_cast<double>(done));
        std::fflush(stdout);
      }
    }
  });
  res.windows = done;
  res.tokens = data.text ? done * data.seq_len : 0;
  res.loss = loss_sum / static_cast<double>(done);
  res.perplexity = data.text ? std::exp(res.loss) : NAN;
  if (counted > 0) res.accuracy = static_cast<double>(correct) / static_cast<double>(counted);
  if (!o.quiet) {
    std::printf("eval: loss %.6f", res.loss);
    if (data.text) std::printf(" | perplexity %.4f", res.perplexity);
    if (res.accuracy)
      std::printf(" | accuracy %.4f (%lld of %lld)", *res.accuracy, static_cast<long long>(correct),
                  static_cast<long long>(counted));
    std::printf(" | %lld %s | %.1f s\n", static_cast<long long>(done), unit,
                std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return res;
}

EvalResult evaluate(EvalOptions o) {
  open_run_folder(o.config, o.init_from);
  const Config cfg = load_config(o.config);
  if (cfg.data.dataset == "translation") return evaluate_translation(o);
  if (cfg.data.dataset == "token_shards" || !o.data_path.empty()) return evaluate_lm(o);
  return evaluate_dataset(o);
}

// ---- remat predict ----------------------------------------------------------------------------------

Predictions predict_images(PredictOptions o) {
  using Clock = std::chrono::steady_clock;
  open_run_folder(o.config, o.init_from);
  const Config cfg = load_config(o.config);
  REMAT_CHECK(declared_input_type(cfg.model, kInputName) == "image", o.config,
              ": /model: remat predict classifies images (an input \"input\" of type \"image\"); a language model "
              "samples with remat train, a translation model translates with remat translate");
  EvalOptions common;
  common.device = o.device, common.batch = o.batch, common.seed = o.seed;
  const Device dev = eval_device(common);
  Backend& be = backend_for(dev);
  const int64_t batch = o.batch.value_or(cfg.training.batch);
  const uint64_t seed = o.seed ? static_cast<uint64_t>(*o.seed) : cfg.training.seed;

  ImageDataset images;
  images.images = npy_images(load_npy(o.input));
  images.source = o.input;
  // A Fashion-MNIST run trained on normalised pixels: the images get the same.
  const bool normalise = cfg.data.dataset == "fashion_mnist";
  if (normalise)
    for (float *p = images.images.f32(), *end = p + images.images.numel(); p != end; ++p)
      *p = (*p - kFashionMnistMean) / kFashionMnistStd;
  const int64_t n = images.images.size(0);
  {
    TagScope scope(MemoryCategory::input, "data", Phase::setup);
    images.labels = Tensor::zeros(Shape{n}, Device::cpu(), DType::i32);  // the loss reads some class; unused
  }
  Graph g = build_graph(cfg.model, batch, cfg.source);
  const Layer& in = g.layer(g.require_input(kInputName, "remat predict"));
  const Shape& is = images.images.shape();
  if (in.out_shape[1] != is[1] || in.out_shape[2] != is[2] || in.out_shape[3] != is[3])
    REMAT_THROW(o.input, ": images [", is[1], ", ", is[2], ", ", is[3], "], but the model \"", cfg.name,
                "\" reads images [", in.out_shape[1], ", ", in.out_shape[2], ", ", in.out_shape[3], "]");
  ParamStore params(g, dev, seed, /*initialise=*/o.init_from.empty());
  if (!o.init_from.empty()) {
    const InitFromReport r = init_from(o.init_from, cfg, params, o.init_from_partial);
    if (!o.quiet) std::printf("%s\n", r.describe().c_str());
  }
  const int64_t classes = g.layer(g.logits_id).out_shape[-1];
  if (!o.quiet) {
    std::printf("remat predict %s: %lld images of %s on %s, in batches of %lld\n", o.config.c_str(),
                static_cast<long long>(n), o.input.c_str(), dev.str().c_str(), static_cast<long long>(batch));
    if (normalise)
      std::printf("pixels normalised as the run's Fashion-MNIST training did: (x - %.4f) / %.4f\n",
                  static_cast<double>(kFashionMnistMean), static_cast<double>(kFashionMnistStd));
    std::fflush(stdout);
  }
  const Clock::time_point t0 = Clock::now();
  Predictions p;
  {
    TagScope scope(MemoryCategory::input, "predictions", Phase::setup);
    p.logits = Tensor::empty(Shape{n, classes}, Device::cpu(), DType::f32);
  }
  int64_t done = 0;
  over_batches(cfg, g, {}, params, be, n, [&](Executor& ex, const std::vector<int64_t>& idx) {
    const auto b = static_cast<int64_t>(idx.size());
    {
      TagScope scope(MemoryCategory::activation, "predict", Phase::forward);
      const std::vector<float> logits = ex.evaluate(image_batch(images, idx, dev), nullptr).to_vector();
      REMAT_CHECK(static_cast<int64_t>(logits.size()) == b * classes, "predict: logits of ", logits.size(),
                  " values for ", b, " images of ", classes, " classes");
      std::copy(logits.begin(), logits.end(), p.logits.f32() + done * classes);
      for (int64_t i = 0; i < b; ++i) {
        const float* row = logits.data() + i * classes;
        // No class is the largest of a NaN: say so rather than name one.
        for (int64_t k = 0; k < classes; ++k)
          if (!std::isfinite(row[k]))
            REMAT_THROW(o.input, ": the logits of image ", idx[static_cast<size_t>(i)], " are not finite (", row[k],
                        " for class ", k, "): a NaN or infinity in the image or in the model's weights");
        p.classes.push_back(static_cast<int32_t>(std::max_element(row, row + classes) - row));
      }
      done += b;
    }
  });
  if (!o.out.empty()) save_npy(o.out, Tensor::from_ints(p.classes, Shape{n}));
  if (!o.logits_out.empty()) save_npy(o.logits_out, p.logits);
  if (!o.quiet) {
    std::vector<int64_t> counts(static_cast<size_t>(classes), 0);
    for (int32_t c : p.classes) ++counts[static_cast<size_t>(c)];
    std::string hist;
    for (int64_t c = 0; c < classes; ++c)
      if (counts[static_cast<size_t>(c)] > 0)
        hist += (hist.empty() ? "" : ", ") + std::to_string(c) + ": " + std::to_string(counts[static_cast<size_t>(c)]);
    std::printf("predicted classes (class: images): %s | %.1f s\n", hist.c_str(),
                std::chrono::duration<double>(Clock::now() - t0).count());
    if (!o.out.empty()) std::printf("classes written to %s (int32 [%lld])\n", o.out.c_str(), static_cast<long long>(n));
    if (!o.logits_out.empty())
      std::printf("logits written to %s (float32 [%lld, %lld])\n", o.logits_out.c_str(), static_cast<long long>(n),
                  static_cast<long long>(classes));
  }
  return p;
}

}  // namespace remat
