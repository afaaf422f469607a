// Greedy decoding, beam search and `remat translate` (include/remat/translate.h).
#include "remat/translate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "remat/config.h"
#include "remat/error.h"
#include "remat/executor.h"
#include "remat/incremental.h"
#include "remat/interop.h"
#include "remat/io.h"
#include "remat/memory.h"
#include "remat/translation.h"

namespace fs = std::filesystem;

namespace remat {

namespace {

// The logits of each decoding step: from an IncrementalDecoder (one position a step, a
// key/value cache) where the model allows and the caller asks, else one forward of the
// whole model over the prefix (Executor::evaluate).
class StepLogits {
 public:
  StepLogits(const Graph& g, ParamStore& params, Backend& be, bool kv_cache)
      : g_(g), t_(g.layer(g.require_input(kTargetInName, "decoding")).out_shape[1]), device_(be.device()) {
    if (kv_cache && IncrementalDecoder::unsupported(g, kTargetInName).empty())
      dec_.emplace(g, params, be, kTargetInName);
    else
      ex_.emplace(g, params, be, make_plan(g, "none"));
  }
  // A new batch: `inputs` holds the model's inputs (the target's and the labels' contents
  // are read at each step).
  void start(const Batch& inputs) {
    if (dec_) dec_->start(inputs);
  }
  // The logits of position t for every row ([B, 1, V] cached, else [B, T, V]), given each
  // row's target tokens up to t (tgt: B x T ids); `inputs()` makes the whole batch where
  // each step runs the whole model.
  template <class Inputs>
  Tensor at(int64_t t, const std::vector<int32_t>& tgt, Inputs&& inputs) {
    if (!dec_) {
      float loss = 0;
      return ex_->evaluate(inputs(), &loss);
    }
    std::vector<int32_t> col(static_cast<size_t>(g_.batch));
    for (int64_t r = 0; r < g_.batch; ++r) col[static_cast<size_t>(r)] = tgt[static_cast<size_t>(r * t_ + t)];
    return dec_->step(Tensor::from_ints(col, Shape{g_.batch, 1}).to(device_), t);
  }
  // The offset of row r's logits at position t in what at() returned.
  int64_t row(int64_t r, int64_t t, int64_t v) const { return dec_ ? r * v : (r * t_ + t) * v; }
  IncrementalDecoder* cached() { return dec_ ? &*dec_ : nullptr; }

 private:
  const Graph& g_;
  int64_t t_;
  Device device_;
  std::optional<IncrementalDecoder> dec_;
  std::optional<Executor> ex_;
};

}  // namespace

std::vector<std::vector<int32_t>> greedy_decode(const Graph& g, ParamStore& params, Backend& be,
                                                const std::vector<std::vector<int32_t>>& sources, bool kv_cache) {
  const Layer& src_in = g.layer(g.require_input(kSourceName, "greedy decoding"));
  const Layer& tgt_in = g.layer(g.require_input(kTargetInName, "greedy decoding"));
  const int64_t B = g.batch, S = src_in.out_shape[1], T = tgt_in.out_shape[1];
  const int64_t V = g.layer(g.logits_id).out_shape[-1];
  const Device dev = be.device();
  StepLogits model(g, params, be, kv_cache);
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
    Batch batch;
    batch.set(kSourceName, src_t);
    batch.set(kSourceLengthName, len_t);
    batch.set(kTargetInName, put(tgt, Shape{B, T}));
    batch.set(kTargetsName, labels_t);
    model.start(batch);
    for (int64_t t = 0; t < T; ++t) {
      const Tensor logits = model.at(t, tgt, [&]() -> const Batch& {
        batch.set(kTargetInName, put(tgt, Shape{B, T}));
        return batch;
      });
      bool all_done = true;
      for (int64_t r = 0; r < static_cast<int64_t>(n); ++r) {
        if (done[static_cast<size_t>(r)]) continue;
        const std::vector<float> row = logits.view_at(model.row(r, t, V), Shape{V}).to_vector();
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

namespace {

// The model's inputs for rows of (source, target prefix): sources padded with </s> and
// <pad>, targets <s> + prefix + <pad>; labels any valid id (the loss is not read).
struct DecodeRows {
  int64_t B, S, T;
  std::vector<int32_t> src, len, tgt;
  DecodeRows(int64_t b, int64_t s, int64_t t)
      : B(b),
        S(s),
        T(t),
        src(static_cast<size_t>(b * s)),
        len(static_cast<size_t>(b)),
        tgt(static_cast<size_t>(b * t)) {}
  void set_source(int64_t r, const std::vector<int32_t>& s) {
    REMAT_CHECK(static_cast<int64_t>(s.size()) < S, "decoding: a source of ", s.size(),
                " pieces does not fit the model's ", S, " (with </s>)");
    std::fill(src.begin() + r * S, src.begin() + (r + 1) * S, Tokenizer::kPad);
    std::copy(s.begin(), s.end(), src.begin() + r * S);
    src[static_cast<size_t>(r * S) + s.size()] = Tokenizer::kEos;
    len[static_cast<size_t>(r)] = static_cast<int32_t>(s.size() + 1);
  }
  void set_prefix(int64_t r, const std::vector<int32_t>& p) {
    std::fill(tgt.begin() + r * T, tgt.begin() + (r + 1) * T, Tokenizer::kPad);
    tgt[static_cast<size_t>(r * T)] = Tokenizer::kBos;
    std::copy(p.begin(), p.begin() + std::min<int64_t>(static_cast<int64_t>(p.size()), T - 1), tgt.begin() + r * T + 1);
  }
  Batch batch(Device dev) const {
    auto put = [&](const std::vector<int32_t>& v, const Shape& s) { return Tensor::from_ints(v, s).to(dev); };
    Batch b;
    b.set(kSourceName, put(src, Shape{B, S}));
    b.set(kSourceLengthName, put(len, Shape{B}));
    b.set(kTargetInName, put(tgt, Shape{B, T}));
    b.set(kTargetsName, put(std::vector<int32_t>(static_cast<size_t>(B * T), Tokenizer::kEos), Shape{B, T}));
    return b;
  }
};

// log softmax of one row, in double.
std::vector<double> log_softmax_row(const std::vector<float>& x) {
  const double m = *std::max_element(x.begin(), x.end());
  double s = 0;
  for (float v : x) s += std::exp(static_cast<double>(v) - m);
  const double lse = m + std::log(s);
  std::vector<double> out(x.size());
  for (size_t j = 0; j < x.size(); ++j) out[j] = static_cast<double>(x[j]) - lse;
  return out;
}

}  // namespace

std::vector<Hypothesis> beam_decode(const Graph& g, ParamStore& params, Backend& be,
                                    const std::vector<std::vector<int32_t>>& sources, int64_t beam,
                                    double length_penalty, bool kv_cache) {
  const int64_t B = g.batch, S = g.layer(g.require_input(kSourceName, "beam search")).out_shape[1];
  const int64_t T = g.layer(g.require_input(kTargetInName, "beam search")).out_shape[1];
  const int64_t V = g.layer(g.logits_id).out_shape[-1];
  REMAT_CHECK(beam >= 1 && beam <= B, "beam search: a beam of ", beam, " needs a batch of at least as many rows (the ",
              "batch is ", B, ")");
  const int64_t per = B / beam;  // sources a forward
  StepLogits model(g, params, be, kv_cache);
  TagScope scope(MemoryCategory::activation, "decode", Phase::forward);
  std::vector<Hypothesis> result(sources.size());
  auto normalised = [&](const Hypothesis& h, size_t length) {
    return h.log_prob / std::pow(static_cast<double>(length), length_penalty);
  };
  for (size_t first = 0; first < sources.size(); first += static_cast<size_t>(per)) {
    const auto n = static_cast<int64_t>(std::min(sources.size() - first, static_cast<size_t>(per)));
    DecodeRows rows(B, S, T);
    for (int64_t r = 0; r < B; ++r) {
      const int64_t i = r / beam < n ? r / beam : 0;  // rows past the sources: copies of the first
      rows.set_source(r, sources[first + static_cast<size_t>(i)]);
      rows.set_prefix(r, {});
    }
    std::vector<std::vector<Hypothesis>> live(static_cast<size_t>(n), std::vector<Hypothesis>(1));
    std::vector<std::vector<std::pair<Hypothesis, double>>> done(static_cast<size_t>(n));  // with normalised scores
    model.start(rows.batch(be.device()));
    std::vector<int64_t> from(static_cast<size_t>(B));  // cached: the row each row's hypothesis came from
    for (int64_t t = 0; t < T; ++t) {
      bool any = false;
      for (int64_t i = 0; i < n; ++i) {
        const auto& lv = live[static_cast<size_t>(i)];
        for (size_t k = 0; k < lv.size(); ++k) rows.set_prefix(i * beam + static_cast<int64_t>(k), lv[k].tokens);
        any = any || !lv.empty();
      }
      if (!any) break;
      const Tensor logits = model.at(t, rows.tgt, [&]() { return rows.batch(be.device()); });
      for (int64_t r = 0; r < B; ++r) from[static_cast<size_t>(r)] = r;
      for (int64_t i = 0; i < n; ++i) {
        auto& lv = live[static_cast<size_t>(i)];
        auto& fin = done[static_cast<size_t>(i)];
        if (lv.empty()) continue;
        struct Candidate {
          double score;
          size_t k;
          int32_t v;
        };
        std::vector<Candidate> cands;
        cands.reserve(lv.size() * static_cast<size_t>(V));
        for (size_t k = 0; k < lv.size(); ++k) {
          const int64_t r = i * beam + static_cast<int64_t>(k);
          const std::vector<double> lp = log_softmax_row(logits.view_at(model.row(r, t, V), Shape{V}).to_vector());
          for (int64_t v = 0; v < V; ++v)
            cands.push_back({lv[k].log_prob + lp[static_cast<size_t>(v)], k, static_cast<int32_t>(v)});
        }
        const size_t keep = std::min(cands.size(), static_cast<size_t>(2 * beam));
        std::partial_sort(cands.begin(), cands.begin() + static_cast<std::ptrdiff_t>(keep), cands.end(),
                          [](const Candidate& a, const Candidate& b) {
                            if (a.score != b.score) return a.score > b.score;
                            return a.k != b.k ? a.k < b.k : a.v < b.v;
                          });
        std::vector<Hypothesis> next;
        for (size_t c = 0;
             c < keep && static_cast<int64_t>(next.size()) < beam && static_cast<int64_t>(fin.size()) < beam; ++c) {
          Hypothesis h{lv[cands[c].k].tokens, cands[c].score};
          if (cands[c].v == Tokenizer::kEos) {
            // As fairseq: only an end among the `beam` best extensions finishes a hypothesis.
            if (c >= static_cast<size_t>(beam)) continue;
            const size_t length = h.tokens.size() + 1;
            fin.emplace_back(h, normalised(h, length));
          } else {
            h.tokens.push_back(cands[c].v);
            from[static_cast<size_t>(i * beam) + next.size()] = i * beam + static_cast<int64_t>(cands[c].k);
            next.push_back(std::move(h));
          }
        }
        lv = static_cast<int64_t>(fin.size()) >= beam ? std::vector<Hypothesis>{} : std::move(next);
        if (t == T - 1)  // at the target length: the live hypotheses finish as they are
          for (Hypothesis& h : lv) fin.emplace_back(h, normalised(h, h.tokens.size()));
      }
      if (model.cached() && t + 1 < T) model.cached()->reorder(from);  // each row's cache follows its hypothesis
    }
    for (int64_t i = 0; i < n; ++i) {
      const auto& fin = done[static_cast<size_t>(i)];
      size_t best = 0;
      for (size_t k = 1; k < fin.size(); ++k)
        if (fin[k].second > fin[best].second) best = k;
      if (!fin.empty()) result[first + static_cast<size_t>(i)] = fin[best].first;
    }
  }
  return result;
}

TranslateResult translate(const TranslateOptions& o) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  REMAT_CHECK(o.max_sentences >= 0, "--max ", o.max_sentences, ": must be 0 (all) or more");
  REMAT_CHECK(!o.batch || *o.batch > 0, "--batch ", o.batch.value_or(0), ": must be positive");
  REMAT_CHECK(o.beam >= 1, "--beam ", o.beam, ": must be positive");
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
  if (data.tokenizer.vocab() != cfg.data.vocab)
    REMAT_THROW(o.run, ": the run's model reads ", cfg.data.vocab, " pieces, but the tokenizer of ", dir, " has ",
                data.tokenizer.vocab(), " (was the corpus rebuilt with another --vocab?)");
  check_run_tokenizer(o.run, data);
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
  const std::string no_cache = IncrementalDecoder::unsupported(g, kTargetInName);
  if (!o.quiet) {
    std::string how = o.beam <= 1 ? "greedy" : "beam " + std::to_string(o.beam);
    how += o.no_kv_cache      ? ", the whole model at every position (--no-kv-cache)"
           : no_cache.empty() ? ", key/value cache"
                              : ", the whole model at every position (no key/value cache: " + no_cache + ")";
    std::fprintf(stderr, "remat translate %s: %zu sentences%s on %s, batch %lld, %s\n", o.run.c_str(), sources.size(),
                 o.input.empty() ? (" of the " + o.split + " split").c_str() : "", dev.str().c_str(),
                 static_cast<long long>(batch), how.c_str());
    std::fprintf(stderr, "%s\n", init.describe().c_str());
  }
  if (o.beam <= 1) {
    for (const auto& ids : greedy_decode(g, params, be, sources, !o.no_kv_cache))
      res.hypotheses.push_back(data.tokenizer.decode(ids));
  } else {
    for (const Hypothesis& h : beam_decode(g, params, be, sources, o.beam, o.length_penalty, !o.no_kv_cache))
      res.hypotheses.push_back(data.tokenizer.decode(h.tokens));
  }
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
