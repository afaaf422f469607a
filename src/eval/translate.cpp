// Greedy decoding and `remat translate` (include/remat/translate.h).
#include "remat/translate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "remat/config.h"
#include "remat/error.h"
#include "remat/executor.h"
#include "remat/interop.h"
#include "remat/io.h"
#include "remat/memory.h"
#include "remat/translation.h"

namespace fs = std::filesystem;

namespace remat {

std::vector<std::vector<int32_t>> greedy_decode(const Graph& g, ParamStore& params, Backend& be,
                                                const std::vector<std::vector<int32_t>>& sources) {
  const Layer& src_in = g.layer(g.require_input(kSourceName, "greedy decoding"));
  const Layer& tgt_in = g.layer(g.require_input(kTargetInName, "greedy decoding"));
  const int64_t B = g.batch, S = src_in.out_shape[1], T = tgt_in.out_shape[1];
  const int64_t V = g.layer(g.logits_id).out_shape[-1];
  const Device dev = be.device();
  Executor ex(g, params, be, make_plan(g, "none"));
  std::vector<std::vector<int32_t>> out(sources.size());
  for (size_t first = 0; first < sources.size(); first += static_cast<size_t>(B)) {
    const size_t n = std::min(sources.size() - first, static_cast<size_t>(B));
    std::vector<int32_t> src(static_cast<size_t>(B * S), Tokenizer::kPad), len(static_cast<size_t>(B));
    for (int64_t r = 0; r < B; ++r) {
      const auto& s = sources[first + (static_cast<size_t>(r) < n ? static_cast<size_t>(r) : 0)];
      REMAT_CHECK(static_cast<int64_t>(s.size()) < S, "greedy decoding: a source of ", s.size(),
                  " pieces does not fit the model's ", S, " (with </s>)");
      std::copy(s.begin(), s.end(), src.begin() + r * S);
      src[static_cast<size_t>(r * S) + s.size()] = Tokenizer::kEos;
      len[static_cast<size_t>(r)] = static_cast<int32_t>(s.size() + 1);
    }
    std::vector<int32_t> tgt(static_cast<size_t>(B * T), Tokenizer::kPad);
    for (int64_t r = 0; r < B; ++r) tgt[static_cast<size_t>(r * T)] = Tokenizer::kBos;
    // The loss is not read; its labels only need to be valid ids.
    const std::vector<int32_t> labels(static_cast<size_t>(B * T), Tokenizer::kEos);
    std::vector<bool> done(static_cast<size_t>(B), false);
    TagScope scope(MemoryCategory::activation, "decode", Phase::forward);
    auto put = [&](const std::vector<int32_t>& v, const Shape& s) { return Tensor::from_ints(v, s).to(dev); };
    const Tensor src_t = put(src, Shape{B, S}), len_t = put(len, Shape{B});
    const Tensor labels_t = put(labels, Shape{B, T});
    for (int64_t t = 0; t < T; ++t) {
      Batch batch;
      batch.set(kSourceName, src_t);
      batch.set(kSourceLengthName, len_t);
      batch.set(kTargetInName, put(tgt, Shape{B, T}));
      batch.set(kTargetsName, labels_t);
      float loss = 0;
      const Tensor logits = ex.evaluate(batch, &loss);
      bool all_done = true;
      for (int64_t r = 0; r < static_cast<int64_t>(n); ++r) {
        if (done[static_cast<size_t>(r)]) continue;
        const std::vector<float> row = logits.view_at((r * T + t) * V, Shape{V}).to_vector();
        const auto best = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
        if (best == Tokenizer::kEos) {
          done[static_cast<size_t>(r)] = true;
          continue;
        }
        out[first + static_cast<size_t>(r)].push_back(best);
        if (t + 1 < T) tgt[static_cast<size_t>(r * T + t + 1)] = best;
        all_done = false;
      }
      if (all_done) break;
    }
  }
  return out;
}

TranslateResult translate(const TranslateOptions& o) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  REMAT_CHECK(o.max_sentences >= 0, "--max ", o.max_sentences, ": must be 0 (all) or more");
  REMAT_CHECK(!o.batch || *o.batch > 0, "--batch ", o.batch.value_or(0), ": must be positive");
  const fs::path run(o.run);
  if (!fs::exists(run / "config.json"))
    REMAT_THROW(o.run, ": not a run folder (no config.json); pass the --out folder of `remat train`");
  Config cfg = load_config((run / "config.json").string());
  if (cfg.data.dataset != "translation")
    REMAT_THROW(o.run, ": a run of data set ", cfg.data.dataset, "; remat translate reads translation runs");
  Device dev =
      o.device == "auto" ? (cuda_status().available ? Device::cuda(0) : Device::cpu()) : Device::parse(o.device);
  require_available(dev);
  if (dev.is_meta()) REMAT_THROW("cannot translate on meta (it holds no data)");
  Backend& be = backend_for(dev);

  const bool default_dir = cfg.data.path.empty();
  const std::string dir = default_dir ? default_translation_corpus_dir(cfg.data.vocab) : cfg.data.path;
  TranslationData data = load_translation_data(dir, cfg.data.vocab, default_dir);
  const int64_t batch = o.batch.value_or(cfg.training.batch);
  Graph g = build_graph(cfg.model, batch, cfg.source, {{"vocab", cfg.data.vocab}});
  const int64_t S = g.layer(g.require_input(kSourceName, "remat translate")).out_shape[1];

  TranslateResult res;
  std::vector<std::vector<int32_t>> sources;
  if (!o.input.empty()) {
    std::ifstream file;
    if (o.input != "-") {
      file.open(o.input, std::ios::binary);
      if (!file) REMAT_THROW(o.input, ": cannot read");
    }
    std::istream& in = o.input == "-" ? std::cin : file;
    std::string line;
    while (std::getline(in, line)) {
      if (o.max_sentences > 0 && static_cast<int64_t>(res.sources.size()) >= o.max_sentences) break;
      res.sources.push_back(line);
    }
    for (const std::string& s : res.sources) {
      std::vector<int32_t> ids = data.tokenizer.encode(s);
      if (static_cast<int64_t>(ids.size()) >= S) {
        ids.resize(static_cast<size_t>(S - 1));
        ++res.too_long;
      }
      sources.push_back(std::move(ids));
    }
  } else {
    data.fit(S, g.layer(g.require_input(kTargetInName, "remat translate")).out_shape[1]);
    const TranslationSplit& sp = data.split(o.split);
    REMAT_CHECK(sp.size() > 0, dir, ": no ", o.split, " pair fits the model");
    int64_t n = sp.size();
    if (o.max_sentences > 0) n = std::min(n, o.max_sentences);
    for (int64_t i = 0; i < n; ++i) {
      res.sources.push_back(sp.pairs[static_cast<size_t>(i)].source);
      res.references.push_back(sp.pairs[static_cast<size_t>(i)].target);
      sources.push_back(sp.source[static_cast<size_t>(i)]);
    }
  }
  REMAT_CHECK(!sources.empty(), "remat translate: no sentence to translate");
  // The parameters' working copies in the run's precision, as in training (ParamStore).
  ActivationDTypeScope precision(precision_dtype(cfg.training.precision));
  ParamStore params(g, dev, cfg.training.seed, /*initialise=*/false);
  const InitFromReport init = init_from(o.run, cfg, params, false);
  if (!o.quiet) {
    std::fprintf(stderr, "remat translate %s: %zu sentences%s on %s, batch %lld, greedy\n", o.run.c_str(),
                 sources.size(), o.input.empty() ? (" of the " + o.split + " split").c_str() : "", dev.str().c_str(),
                 static_cast<long long>(batch));
    std::fprintf(stderr, "%s\n", init.describe().c_str());
  }
  for (const auto& ids : greedy_decode(g, params, be, sources)) res.hypotheses.push_back(data.tokenizer.decode(ids));
  if (!res.references.empty()) {
    res.bleu = corpus_bleu(res.hypotheses, res.references);
    res.copy_bleu = corpus_bleu(res.sources, res.references);
  }
  res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!o.output.empty()) {
    std::string text;
    for (const std::string& h : res.hypotheses) text += h + "\n";
    write_file_atomic(o.output, text);
  }
  return res;
}

}  // namespace remat
