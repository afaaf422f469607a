// `remat eval`: a language model's loss and perplexity on token shards. Windows of
// seq_len tokens (stride seq_len, as in training) are taken in file order; each target
// token counts once, so the loss is the mean over every target of the windows.
#include "remat/evaluate.h"

#include <chrono>
#include <cmath>
#include <cstdio>

#include "remat/error.h"
#include "remat/executor.h"
#include "remat/io.h"
#include "remat/token_shards.h"

namespace remat {

EvalResult evaluate_lm(const EvalOptions& o) {
  using Clock = std::chrono::steady_clock;
  Config cfg = load_config(o.config);
  REMAT_CHECK(!o.batch || *o.batch > 0, "--batch ", o.batch.value_or(0), ": must be positive");
  REMAT_CHECK(!o.seed || *o.seed >= 0, "--seed ", o.seed.value_or(0), ": must be 0 or more");
  REMAT_CHECK(o.max_batches >= 0, "--max-batches ", o.max_batches, ": must be 0 (every window) or more");
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

  Device dev =
      o.device == "auto" ? (cuda_status().available ? Device::cuda(0) : Device::cpu()) : Device::parse(o.device);
  require_available(dev);
  if (dev.is_meta()) REMAT_THROW("cannot evaluate on meta (it holds no data)");
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
  const int64_t full = n_windows / batch, rest = n_windows % batch;
  if (!o.quiet) {
    std::printf("remat eval %s: %s on %s, %lld windows of %lld tokens in batches of %lld\n", o.config.c_str(),
                res.data.c_str(), dev.str().c_str(), static_cast<long long>(n_windows), static_cast<long long>(seq_len),
                static_cast<long long>(batch));
    std::fflush(stdout);
  }

  const Clock::time_point t0 = Clock::now();
  double loss_sum = 0;  // sum over target tokens
  int64_t done = 0;
  auto run = [&](const Graph& graph, int64_t count, int64_t b) {
    Executor ex(graph, params, be, make_plan(graph, "none"));
    for (int64_t k = 0; k < count; ++k) {
      std::vector<int64_t> idx;
      for (int64_t i = 0; i < b; ++i) idx.push_back(done + i);
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
  };
  if (full > 0) run(g, full, batch);
  if (rest > 0) {
    const Graph tail = build_graph(cfg.model, rest, cfg.source, vars);
    run(tail, 1, rest);
  }
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

}  // namespace remat
