// Translation data (include/remat/translation.h) and decoding (include/remat/translate.h):
// gettext catalogs read in either byte order, the corpus's cleaning, split and tokenizer,
// batches by hand, an encoder-decoder trained on a corpus (checkpointed steps bitwise the
// plain ones), the errors a mismatched corpus and config give, and greedy decoding against
// a teacher-forced forward.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "remat/backend.h"
#include "remat/config.h"
#include "remat/executor.h"
#include "remat/graph.h"
#include "remat/incremental.h"
#include "remat/io.h"
#include "remat/params.h"
#include "remat/train.h"
#include "remat/translate.h"
#include "remat/translation.h"
#include "support/expect_error.h"
#include "support/models.h"

namespace fs = std::filesystem;
using remat::ParallelPair;

namespace {

// A fresh folder under the system temp dir; every one is removed, with what it holds, when
// the test program ends (some outlive their test: the corpus the tests share).
std::string tmp_dir(const std::string& name) {
  struct Made {
    std::vector<fs::path> dirs;
    ~Made() {
      std::error_code ec;
      for (const fs::path& d : dirs) fs::remove_all(d, ec);
    }
  };
  static Made made;
  const fs::path p = fs::temp_directory_path() / ("remat_nmt_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  made.dirs.push_back(p);
  return p.string();
}

// A .mo file of `entries` (msgid, msgstr; ids with '\x04' carry a context, with '\0' a
// plural), big- or little-endian, strings laid out after the tables as msgfmt does.
std::string make_mo(const std::vector<std::pair<std::string, std::string>>& entries, bool big_endian) {
  auto u32 = [&](std::string& s, uint32_t v) {
    if (big_endian) v = __builtin_bswap32(v);
    s.append(reinterpret_cast<const char*>(&v), 4);
  };
  const auto n = static_cast<uint32_t>(entries.size());
  const uint32_t orig = 28, trans = orig + 8 * n;
  uint32_t at = trans + 8 * n;
  std::string head, tables_o, tables_t, strings;
  for (const auto& [id, text] : entries) {
    u32(tables_o, static_cast<uint32_t>(id.size()));
    u32(tables_o, at + static_cast<uint32_t>(strings.size()));
    strings += id;
    strings += '\0';
  }
  for (const auto& [id, text] : entries) {
    u32(tables_t, static_cast<uint32_t>(text.size()));
    u32(tables_t, at + static_cast<uint32_t>(strings.size()));
    strings += text;
    strings += '\0';
  }
  u32(head, 0x950412deU);
  u32(head, 0);
  u32(head, n);
  u32(head, orig);
  u32(head, trans);
  u32(head, 0);
  u32(head, 0);
  return head + tables_o + tables_t + strings;
}

const std::string kHeader = "Content-Type: text/plain; charset=UTF-8\n";

// A synthetic catalog of about 400 messages: phrases made of a small English lexicon and
// their word-by-word German, with duplicates, untranslated and empty entries mixed in.
std::vector<std::pair<std::string, std::string>> synthetic_messages() {
  const char* en[] = {"file", "cannot", "open",    "the",     "option", "invalid", "argument", "for",
                      "too",  "many",   "warning", "ignored", "memory", "error",   "line",     "column"};
  const char* de[] = {"Datei", "kann",  "öffnen",  "die",       "Option",   "ungültig", "Argument", "für",
                      "zu",    "viele", "Warnung", "ignoriert", "Speicher", "Fehler",   "Zeile",    "Spalte"};
  std::vector<std::pair<std::string, std::string>> m{{"", kHeader}};
  uint32_t x = 12345;
  for (int i = 0; i < 400; ++i) {
    std::string s, t;
    const int words = 1 + static_cast<int>(i % 3);
    for (int w = 0; w < words; ++w) {
      x = x * 1103515245u + 12345u;
      const auto k = (x >> 16) % 16;
      s += (w ? " " : "") + std::string(en[k]);
      t += (w ? " " : "") + std::string(de[k]);
    }
    if (i % 5 == 0) s += " %s", t += " %s";
    m.emplace_back(s, t);
  }
  m.emplace_back("same text", "same text");              // untranslated
  m.emplace_back("  spaced \n out ", "  ");              // empty after cleaning
  m.emplace_back(m[1].first, m[1].second);               // a duplicate
  m.emplace_back("ctx\x04with context", "mit Kontext");  // a context, stripped
  return m;
}

// Builds a corpus from the synthetic catalog once per process.
const std::string& corpus_dir() {
  static const std::string dir = [] {
    const std::string root = tmp_dir("corpus");
    const std::string mo = root + "/synthetic.mo";
    remat::write_file_atomic(mo, make_mo(synthetic_messages(), false));
    remat::CorpusOptions o;
    o.catalogs = {mo};
    o.out_dir = root + "/nmt";
    o.vocab = 64;
    o.quiet = true;
    remat::build_translation_corpus(o);
    return o.out_dir;
  }();
  return dir;
}

// nmt_tiny (tests/configs) on the synthetic corpus: $vocab 64, source 10, target 8.
std::string nmt_config(const std::string& dir, const std::string& policy, const std::string& tweak = "") {
  nlohmann::json c =
      nlohmann::json::parse(remat::read_file(std::string(REMAT_SOURCE_DIR) + "/tests/configs/nmt_tiny.json"));
  c["data"] = {{"dataset", "translation"}, {"path", corpus_dir()}, {"vocab", 64}};
  c["training"] = {{"batch", 4}, {"steps", 3}, {"policy", policy}, {"log_every", 1}};
  c["model"]["layers"].back()["label_smoothing"] = 0.1;
  if (tweak == "ignore_index") c["model"]["layers"].back()["ignore_index"] = -100;
  if (tweak == "vocab") c["data"]["vocab"] = 65;
  if (tweak == "input") c["model"]["inputs"][0]["name"] = "input";
  if (tweak == "buckets") {
    c["data"]["length_buckets"] = {3, 4, 5, 6, 7};
    c["training"]["steps"] = 6;
    c["training"]["checkpoint_every"] = 1;
  }
  if (tweak == "kv_from_target")  // cross-attention over the decoder's own states
    for (auto& l : c["model"]["layers"])
      if (l.value("name", "") == "dec")
        for (auto& b : l["layers"])
          if (b.value("name", "") == "kv") b["inputs"] = {"ln2"};
  if (tweak == "noncausal")  // the decoder's self-attention sees later positions: no incremental decoding
    for (auto& l : c["model"]["layers"])
      if (l.value("name", "") == "dec")
        for (auto& b : l["layers"])
          if (b.value("name", "") == "self_attn") b["causal"] = false;
  const std::string path = dir + "/nmt_" + policy + tweak + ".json";
  remat::write_file_atomic(path, c.dump(2));
  return path;
}

// nmt_tiny with random weights at batch `batch` on cpu, and the corpus fitted to it: what the
// decoding tests run.
struct DecodeModel {
  remat::Config cfg;
  remat::TranslationData data;
  remat::Graph g;
  remat::Backend& be = remat::backend_for(remat::Device::cpu());
  remat::ParamStore params;
  DecodeModel(const std::string& dir, int64_t batch, uint64_t seed, const std::string& tweak = "")
      : cfg(remat::load_config(nmt_config(dir, "none", tweak))),
        data(remat::load_translation_data(corpus_dir(), 64, false)),
        g(remat::build_graph(cfg.model, batch, cfg.source, {{"vocab", 64}})),
        params(g, remat::Device::cpu(), seed) {
    data.fit(10, 8);
  }
  // The logits [8, 64] of one teacher-forced forward of `source` with the decoder reading
  // <s> and the first 7 of `tokens` (row 0 of a batch of copies).
  std::vector<float> teacher_forced(const std::vector<int32_t>& source, const std::vector<int32_t>& tokens) {
    remat::TranslationSplit one;
    one.pairs = {{"s", "t"}};
    one.source = {source};
    one.target = {std::vector<int32_t>(tokens.begin(), tokens.begin() + std::min<size_t>(tokens.size(), 7))};
    const remat::Batch b = remat::translation_batch(one, std::vector<int64_t>(static_cast<size_t>(g.batch), 0), 10, 8,
                                                    remat::Device::cpu());
    remat::Executor ex(g, params, be, remat::make_plan(g, "none"));
    float loss = 0;
    const std::vector<float> all = ex.evaluate(b, &loss).to_vector();
    return {all.begin(), all.begin() + 8 * 64};
  }
};
}  // namespace

TEST(Translation, ReadsCatalogsInEitherByteOrder) {
  const std::string dir = tmp_dir("mo");
  const std::vector<std::pair<std::string, std::string>> entries = {
      {"", kHeader},
      {"open %s", "%s öffnen"},
      {"menu\x04"
       "File",
       "Datei"},
      {std::string("one file\0%d files", 17), std::string("eine Datei\0%d Dateien", 21)},
  };
  for (bool big : {false, true}) {
    const std::string path = dir + (big ? "/be.mo" : "/le.mo");
    remat::write_file_atomic(path, make_mo(entries, big));
    const std::vector<ParallelPair> pairs = remat::read_mo_catalog(path);
    ASSERT_EQ(pairs.size(), 3u) << path;
    EXPECT_EQ(pairs[0].source, "open %s");
    EXPECT_EQ(pairs[0].target, "%s öffnen");
    EXPECT_EQ(pairs[1].source, "File");  // the context is not part of the message
    EXPECT_EQ(pairs[1].target, "Datei");
    EXPECT_EQ(pairs[2].source, "one file");  // the singular forms of a plural entry
    EXPECT_EQ(pairs[2].target, "eine Datei");
  }
}

TEST(Translation, BadCatalogsAreErrorsNamingTheFile) {
  const std::string dir = tmp_dir("bad_mo");
  remat::write_file_atomic(dir + "/magic.mo", std::string(32, 'x'));
  EXPECT_REMAT_ERROR(remat::read_mo_catalog(dir + "/magic.mo"), "magic.mo: not a gettext catalog");
  std::string mo = make_mo({{"", kHeader}, {"a", "b"}}, false);
  remat::write_file_atomic(dir + "/cut.mo", mo.substr(0, mo.size() - 4));
  EXPECT_REMAT_ERROR(remat::read_mo_catalog(dir + "/cut.mo"), "cut.mo: message");
  remat::write_file_atomic(dir + "/latin1.mo",
                           make_mo({{"", "Content-Type: text/plain; charset=ISO-8859-1\n"}, {"a", "b"}}, false));
  EXPECT_REMAT_ERROR(remat::read_mo_catalog(dir + "/latin1.mo"), "charset iso-8859-1");
  remat::write_file_atomic(dir + "/utf8.mo", make_mo({{"", kHeader}, {"a", "\xff\xfe"}}, false));
  EXPECT_REMAT_ERROR(remat::read_mo_catalog(dir + "/utf8.mo"), "not valid UTF-8");
}

TEST(Translation, CorpusIsCleanedDeduplicatedAndSplitBySource) {
  if (!remat::have_sentencepiece()) GTEST_SKIP() << "built without SentencePiece";
  const fs::path dir = corpus_dir();
  const nlohmann::json m = nlohmann::json::parse(remat::read_file((dir / "manifest.json").string()));
  const auto& c = m["counts"];
  // Every message is accounted for: dropped for a reason, or in exactly one split.
  const int64_t messages = static_cast<int64_t>(synthetic_messages().size()) - 1;  // the header is no message
  EXPECT_EQ(c["messages"].get<int64_t>(), messages);
  EXPECT_EQ(c["dropped_empty"].get<int64_t>(), 1);
  EXPECT_EQ(c["dropped_untranslated"].get<int64_t>(), 1);
  EXPECT_GE(c["dropped_duplicate"].get<int64_t>(), 1);
  EXPECT_EQ(c["messages"].get<int64_t>(), c["dropped_empty"].get<int64_t>() + c["dropped_untranslated"].get<int64_t>() +
                                              c["dropped_duplicate"].get<int64_t>() + c["train"].get<int64_t>() +
                                              c["valid"].get<int64_t>() + c["test"].get<int64_t>());
  std::map<std::string, std::string> split_of;
  std::set<std::pair<std::string, std::string>> pairs;
  for (const char* split : {"train", "valid", "test"}) {
    std::ifstream in(dir / (std::string(split) + ".tsv"));
    int64_t lines = 0;
    for (std::string l; std::getline(in, l); ++lines) {
      const size_t tab = l.find('\t');
      ASSERT_NE(tab, std::string::npos);
      const std::string s = l.substr(0, tab), t = l.substr(tab + 1);
      EXPECT_NE(s, t);
      EXPECT_EQ(s.find("  "), std::string::npos);
      EXPECT_TRUE(pairs.insert({s, t}).second) << "a duplicate pair: " << l;
      const auto [it, fresh] = split_of.emplace(s, split);
      EXPECT_EQ(it->second, split) << "source in two splits: " << s;
      (void)fresh;
    }
    EXPECT_EQ(lines, c[split].get<int64_t>()) << split;
  }
  EXPECT_TRUE(split_of.count("with context"));
  // Nothing of the build is left beside it.
  for (const auto& e : fs::directory_iterator(dir.parent_path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();

  remat::Tokenizer tok;
  tok.load((dir / "tokenizer.model").string());
  EXPECT_EQ(tok.vocab(), 64);
  const std::string text = "too many warning";
  const std::vector<int32_t> ids = tok.encode(text);
  ASSERT_FALSE(ids.empty());
  for (int32_t id : ids) EXPECT_GT(id, remat::Tokenizer::kEos);  // no special piece in text
  std::vector<int32_t> framed = {remat::Tokenizer::kBos};
  framed.insert(framed.end(), ids.begin(), ids.end());
  framed.push_back(remat::Tokenizer::kEos);
  framed.push_back(ids[0]);  // after </s>: not decoded
  EXPECT_EQ(tok.decode(framed), text);
}

TEST(Translation, CorpusRefusesToReplaceAFolderThatIsNoCorpus) {
  if (!remat::have_sentencepiece()) GTEST_SKIP() << "built without SentencePiece";
  const std::string dir = tmp_dir("not_corpus");
  remat::write_file_atomic(dir + "/precious.txt", "keep me");
  remat::CorpusOptions o;
  o.catalogs = {fs::path(corpus_dir()).parent_path().string() + "/synthetic.mo"};
  o.out_dir = dir;
  o.vocab = 64;
  o.quiet = true;
  EXPECT_REMAT_ERROR(remat::build_translation_corpus(o), "is not a corpus folder");
  EXPECT_TRUE(fs::exists(dir + "/precious.txt"));
  // A folder name with a space and a comma, given with a trailing slash: the temporary
  // folder is its sibling, and building again replaces the corpus.
  const std::string odd = dir + "/with space, comma/";
  o.out_dir = odd;
  for (int round = 0; round < 2; ++round) {
    remat::build_translation_corpus(o);
    EXPECT_TRUE(fs::exists(odd + "manifest.json")) << round;
    EXPECT_TRUE(fs::exists(odd + "tokenizer.model")) << round;
    for (const auto& e : fs::directory_iterator(dir))
      EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
    for (const auto& e : fs::directory_iterator(odd))
      EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  }
  // What a build that died left beside the corpus goes; a live process's build stays.
  const std::string base = odd.substr(0, odd.size() - 1);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);  // its pid names no process now
  const std::string dead = base + ".tmp-" + std::to_string(child), live = base + ".tmp-" + std::to_string(getppid());
  for (const std::string& d : {dead, live}) {
    fs::create_directories(d);
    remat::write_file_atomic(d + "/train.tsv", "half written");
  }
  remat::build_translation_corpus(o);
  EXPECT_FALSE(fs::exists(dead)) << "a dead build's folder is left";
  EXPECT_TRUE(fs::exists(live + "/train.tsv")) << "a live process's build was removed";
  fs::remove_all(live);
  // The data set's first use keeps a corpus another process finished meanwhile.
  const auto before = fs::last_write_time(odd + "manifest.json");
  o.replace = false;
  remat::build_translation_corpus(o);
  EXPECT_EQ(fs::last_write_time(odd + "manifest.json"), before);
  EXPECT_REMAT_ERROR(remat::load_translation_data(dir, 64, false), "remat corpus --out");
}

TEST(Translation, BatchesPadSourcesAndShiftTargets) {
  remat::TranslationSplit sp;
  sp.pairs = {{"a", "b"}, {"c", "d"}};
  sp.source = {{7, 8}, {9}};
  sp.target = {{10, 11, 12}, {13}};
  const remat::Batch b = remat::translation_batch(sp, {1, 0}, 4, 5, remat::Device::cpu());
  EXPECT_EQ(b.at("src").to_ints(), (std::vector<int32_t>{9, 3, 0, 0, 7, 8, 3, 0}));
  EXPECT_EQ(b.at("src_len").to_ints(), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(b.at("tgt").to_ints(), (std::vector<int32_t>{2, 13, 0, 0, 0, 2, 10, 11, 12, 0}));
  EXPECT_EQ(b.at("targets").to_ints(), (std::vector<int32_t>{13, 3, 0, 0, 0, 10, 11, 12, 3, 0}));
  EXPECT_REMAT_ERROR(remat::translation_batch(sp, {0}, 4, 3, remat::Device::cpu()), "does not fit");
}

// Every policy trains the same bits on real pairs (dropout, key lengths and all).
TEST(Translation, CheckpointedStepsOnACorpusAreBitwiseThePlainOnes) {
  if (!remat::have_sentencepiece()) GTEST_SKIP() << "built without SentencePiece";
  const std::string dir = tmp_dir("train");
  std::vector<float> plain;
  for (const std::string policy : {"none", "sqrt", "all", "selective"}) {
    remat::TrainOptions o;
    o.config = nmt_config(dir, policy);
    o.device = "cpu";
    o.quiet = true;
    const remat::TrainResult r = remat::train(o);
    ASSERT_EQ(r.losses.size(), 3u) << policy;
    EXPECT_GE(r.valid_bleu, 0.0) << policy << ": the run's end scores the valid split";
    for (float l : r.losses) EXPECT_TRUE(std::isfinite(l) && l > 0) << policy;
    if (plain.empty())
      plain = r.losses;
    else
      for (size_t i = 0; i < plain.size(); ++i)
        EXPECT_EQ(std::memcmp(&plain[i], &r.losses[i], sizeof(float)), 0) << policy << " step " << i + 1;
  }
}

// A batch cut to its length bucket (data.length_buckets) trains as the same pairs padded to
// the model's lengths: padded keys are masked by the source lengths, padded targets are
// ignored by the loss, and causal self-attention keeps the decoder's padded positions from
// the real ones, so the loss and every gradient agree to rounding (dropout off: its masks
// follow a tensor's geometry). Plans differ too (none against sqrt), as they may in a run.
// On cpu they come out bitwise equal here (the padded rows add exact zeros to sums whose
// other terms keep their order); a GEMM that blocks its reduction by the row count need not.
TEST(Translation, ABatchCutToItsBucketTrainsAsThePaddedOne) {
  if (!remat::have_sentencepiece()) GTEST_SKIP() << "built without SentencePiece";
  const std::string dir = tmp_dir("bucket");
  nlohmann::json model = remat::load_config(nmt_config(dir, "none")).model;
  for (auto& l : model["layers"]) {
    auto no_dropout = [](nlohmann::json& x) {
      if (x.value("type", "") == "dropout") x["p"] = 0.0;
      if (x.contains("dropout")) x["dropout"] = 0.0;
    };
    no_dropout(l);
    if (l.contains("layers"))
      for (auto& b : l["layers"]) no_dropout(b);
  }
  nlohmann::json cut_model = model;
  for (auto& in : cut_model["inputs"])
    if (in.contains("seq_len")) in["seq_len"] = 6;
  remat::TranslationData data = remat::load_translation_data(corpus_dir(), 64, false);
  data.fit(10, 8);
  std::vector<int64_t> idx;  // pairs of at most 5 pieces a side, among them one of 5
  bool longest = false;
  for (int64_t i = 0; i < data.train.size() && idx.size() < 4; ++i) {
    const size_t n =
        std::max(data.train.source[static_cast<size_t>(i)].size(), data.train.target[static_cast<size_t>(i)].size());
    if (n > 5 || (idx.size() == 3 && !longest && n != 5)) continue;
    longest = longest || n == 5;
    idx.push_back(i);
  }
  ASSERT_EQ(idx.size(), 4u);
  const std::string path = dir + "/nmt_none.json";
  const remat::Graph full = remat::build_graph(model, 4, path, {{"vocab", 64}});
  const remat::Graph cut = remat::build_graph(cut_model, 4, path, {{"vocab", 64}});
  remat::Backend& be = remat::backend_for(remat::Device::cpu());
  remat::ParamStore params(full, remat::Device::cpu(), 11);
  remat::Executor ef(full, params, be, remat::make_plan(full, "none"));
  remat::Executor ec(cut, params, be, remat::make_plan(cut, "sqrt"));
  remat::RngGenerator ga(4), gb(4);
  params.zero_grads(be);
  const float loss_full =
      ef.train_step(remat::translation_batch(data.train, idx, 10, 8, remat::Device::cpu()), ga).loss;
  std::vector<std::vector<float>> grads_full;
  for (const remat::Tensor& t : params.grads) grads_full.push_back(t.defined() ? t.to_vector() : std::vector<float>{});
  params.zero_grads(be);
  const float loss_cut = ec.train_step(remat::translation_batch(data.train, idx, 6, 6, remat::Device::cpu()), gb).loss;
  EXPECT_GT(loss_full, 0.0f);
  EXPECT_NEAR(loss_cut, loss_full, 1e-6 * loss_full);
  for (size_t p = 0; p < params.grads.size(); ++p) {
    if (!params.grads[p].defined()) continue;
    const std::vector<float> g = params.grads[p].to_vector();
    ASSERT_EQ(g.size(), grads_full[p].size());
    double worst = 0, scale = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      worst = std::max(worst, std::abs(double(g[i]) - double(grads_full[p][i])));
      scale = std::max(scale, std::abs(double(grads_full[p][i])));
    }
    EXPECT_LE(worst, 1e-5 * scale + 1e-9) << full.params[p].name << " (largest gradient " << scale << ")";
  }
}

// A run with length buckets: every policy trains the same bits (a batch's bucket graph is
// planned and checkpointed as the model's), and a run resumed mid-epoch draws the same
// grouped batches as the uninterrupted one. Bad buckets are named with the config's field.
TEST(Translation, LengthBucketedRunsAreCheckpointedAndResumedExactly) {
  if (!remat::have_sentencepiece()) GTEST_SKIP() << "built without SentencePiece";
  const std::string dir = tmp_dir("buckets");
  std::vector<float> plain;
  for (const std::string policy : {"none", "sqrt", "selective"}) {
    remat::TrainOptions o;
    o.config = nmt_config(dir, policy, "buckets");
    o.device = "cpu";
    o.quiet = true;
    const remat::TrainResult r = remat::train(o);
    ASSERT_EQ(r.losses.size(), 6u) << policy;
    for (float l : r.losses) EXPECT_TRUE(std::isfinite(l) && l > 0) << policy;
    int64_t batches = 0;
    for (const auto& [length, n] : r.batches_by_length) batches += n;
    EXPECT_EQ(batches, 6);
    EXPECT_GE(r.batches_by_length.size(), 2u) << "the six batches should use two lengths at least";
    if (plain.empty())
      plain = r.losses;
    else
      for (size_t i = 0; i < plain.size(); ++i)
        EXPECT_EQ(std::memcmp(&plain[i], &r.losses[i], sizeof(float)), 0) << policy << " step " << i + 1;
  }
  remat::TrainOptions a;
  a.config = nmt_config(dir, "sqrt", "buckets");
  a.device = "cpu";
  a.quiet = true;
  a.out = dir + "/run";
  a.on_step = [](int64_t step, float) {
    if (step == 4) throw remat::Error("interrupted");
  };
  EXPECT_REMAT_ERROR(remat::train(a), "interrupted");  // the checkpoint is step 3's
  remat::TrainOptions b = a;
  b.on_step = nullptr;
  b.out.clear();
  b.resume = dir + "/run";
  const remat::TrainResult rest = remat::train(b);
  ASSERT_EQ(rest.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(std::memcmp(&plain[i + 3], &rest.losses[i], sizeof(float)), 0) << "resumed step " << i + 4;

  nlohmann::json c = nlohmann::json::parse(remat::read_file(nmt_config(dir, "none", "buckets")));
  auto fails = [&](const nlohmann::json& buckets, const std::string& expect) {
    c["data"]["length_buckets"] = buckets;
    remat::write_file_atomic(dir + "/bad.json", c.dump());
    remat::TrainOptions o;
    o.config = dir + "/bad.json";
    o.device = "cpu";
    o.quiet = true;
    EXPECT_REMAT_ERROR(remat::train(o), expect);
  };
  fails({6, 4}, "/data/length_buckets: expected ascending lengths of at least 2, got 4 after 6");
  fails({4, 10}, "/data/length_buckets: 10 is not below the model's lengths (source 10, target 8)");
  c["data"] = {{"dataset", "synthetic_text"}, {"length_buckets", {4}}};
  remat::write_file_atomic(dir + "/bad.json", c.dump());
  EXPECT_REMAT_ERROR(remat::load_config(dir + "/bad.json"), "but the data set synthetic_text is not translation");
}

TEST(Translation, AMismatchedConfigIsNamedBeforeAnyStep) {
  if (!remat::have_sentencepiece()) GTEST_SKIP() << "built without SentencePiece";
  const std::string dir = tmp_dir("mismatch");
  remat::TrainOptions o;
  o.device = "cpu";
  o.quiet = true;
  o.config = nmt_config(dir, "none", "ignore_index");
  EXPECT_REMAT_ERROR(remat::train(o), "must ignore <pad>");
  o.config = nmt_config(dir, "none", "vocab");
  EXPECT_REMAT_ERROR(remat::train(o), "/data/vocab: 65, but the tokenizer of");
  o.config = nmt_config(dir, "none", "input");
  EXPECT_REMAT_ERROR(remat::train(o), "translation fills the inputs src, src_len, tgt and targets");
}

// Greedy decoding's outputs, fed back as the decoder's input, are each position's arg max
// of one teacher-forced forward: causal attention makes the padding after a position
// irrelevant to it, and the decoder reads one step at a time what that forward reads at once.
TEST(Translation, GreedyDecodingAgreesWithATeacherForcedForward) {
  if (!remat::have_sentencepiece()) GTEST_SKIP() << "built without SentencePiece";
  DecodeModel m(tmp_dir("decode"), 3, 7);
  std::vector<std::vector<int32_t>> sources;
  for (int i = 0; i < 5; ++i)
    sources.push_back(m.data.valid.source[static_cast<size_t>(i) % m.data.valid.source.size()]);
  const std::vector<std::vector<int32_t>> out = remat::greedy_decode(m.g, m.params, m.be, sources);
  ASSERT_EQ(out.size(), sources.size());
  // Sources 3 and 4 went in a second batch padded with copies: decode them again alone.
  for (size_t i = 0; i < sources.size(); ++i) {
    const auto& hyp = out[i];
    EXPECT_LE(hyp.size(), 8u);
    const std::vector<float> logits = m.teacher_forced(sources[i], hyp);
    // Position t's arg max is token t of the hypothesis, or </s> where it ended.
    for (size_t t = 0; t <= hyp.size() && t < 8; ++t) {
      const float* row = logits.data() + t * 64;
      const auto best = static_cast<int32_t>(std::max_element(row, row + 64) - row);
      EXPECT_EQ(best, t < hyp.size() ? hyp[t] : remat::Tokenizer::kEos) << "source " << i << " position " << t;
    }
  }
}

// Shared source and target embeddings (`"tie_weight": "src_embed"` on tgt_embed; the head
// stays tied to tgt_embed, so all three read one table): one parameter fewer, and one step
// gives the losses of the untied model holding the same table twice, and as the shared
// table's gradient the sum of the two tables' gradients there.
TEST(Translation, SharedEmbeddingsSumBothGradients) {
  const std::string path = std::string(REMAT_SOURCE_DIR) + "/tests/configs/nmt_tiny.json";
  const nlohmann::json base = nlohmann::json::parse(remat::read_file(path));
  nlohmann::json shared = base;
  for (auto& l : shared["model"]["layers"])
    if (l.value("name", "") == "tgt_embed") l["tie_weight"] = "src_embed";
  const remat::Graph ga = remat::build_graph(shared["model"], 3, path, {{"vocab", 24}});
  const remat::Graph gb = remat::build_graph(base["model"], 3, path, {{"vocab", 24}});
  ASSERT_EQ(ga.params.size() + 1, gb.params.size());
  auto index = [](const remat::Graph& g, const std::string& name) {
    for (size_t p = 0; p < g.params.size(); ++p)
      if (g.params[p].name == name) return p;
    ADD_FAILURE() << "no parameter " << name;
    return size_t{0};
  };
  for (int i = 0; i < ga.size(); ++i)  // src_embed, tgt_embed and the head hold one table
    if (ga.layer(i).name == "tgt_embed" || ga.layer(i).name == "head") {
      EXPECT_EQ(ga.layer_params[static_cast<size_t>(i)][0], static_cast<int>(index(ga, "src_embed.weight")))
          << ga.layer(i).name;
    }
  remat::Backend& be = remat::backend_for(remat::Device::cpu());
  remat::ParamStore pa(ga, remat::Device::cpu(), 5), pb(gb, remat::Device::cpu(), 5);
  for (size_t p = 0; p < gb.params.size(); ++p) {
    const std::string& name = gb.params[p].name;
    pb.values[p].copy_from(pa.values[index(ga, name == "tgt_embed.weight" ? "src_embed.weight" : name)]);
  }
  const remat::Batch batch = remat::test::batch_for(ga, 3);
  remat::Executor ea(ga, pa, be, remat::make_plan(ga, "sqrt")), eb(gb, pb, be, remat::make_plan(gb, "sqrt"));
  remat::RngGenerator ra(9), rb(9);
  pa.zero_grads(be);
  pb.zero_grads(be);
  EXPECT_EQ(ea.train_step(batch, ra).loss, eb.train_step(batch, rb).loss);
  const std::vector<float> got = pa.grads[index(ga, "src_embed.weight")].to_vector();
  const std::vector<float> src = pb.grads[index(gb, "src_embed.weight")].to_vector();
  const std::vector<float> tgt = pb.grads[index(gb, "tgt_embed.weight")].to_vector();
  double worst = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(double(got[i]) - (double(src[i]) + double(tgt[i]))));
    scale = std::max(scale, std::abs(double(src[i]) + double(tgt[i])));
  }
  EXPECT_GT(scale, 0.0);
  EXPECT_LE(worst, 1e-6 * scale);
  for (size_t p = 0; p < ga.params.size(); ++p)  // the others: the same gradients
    if (ga.params[p].name != "src_embed.weight" && pa.grads[p].defined()) {
      EXPECT_EQ(pa.grads[p].to_vector(), pb.grads[index(gb, ga.params[p].name)].to_vector()) << ga.params[p].name;
    }
  // A table of another shape is named.
  nlohmann::json bad = shared;
  for (auto& l : bad["model"]["layers"])
    if (l.value("name", "") == "tgt_embed") l["dim"] = 8;
  EXPECT_REMAT_ERROR(remat::build_graph(bad["model"], 3, path, {{"vocab", 24}}),
                     "\"src_embed.weight\" has shape [24, 16], this layer needs [24, 8]");
}

// The key/value cache (remat/incremental.h): each step's logits, one position at a time,
// against the whole model's forward over the same prefix (teacher forced), in fp32 and
// bf16; greedy and beam search with and without the cache pick the same pieces with the
// same scores; a model whose decoder cannot run one position at a time (non-causal
// self-attention) is named, and decoding falls back to the whole model.
TEST(Translation, KeyValueCacheDecodesAsTheWholeModel) {
  if (!remat::have_sentencepiece()) GTEST_SKIP() << "built without SentencePiece";
  for (const remat::DType precision : {remat::DType::f32, remat::DType::bf16}) {
    SCOPED_TRACE(remat::dtype_name(precision));
    remat::ActivationDTypeScope scope(precision);
    DecodeModel m(tmp_dir("kv_cache"), 3, 5);
    ASSERT_EQ(remat::IncrementalDecoder::unsupported(m.g, remat::kTargetInName), "");
    const std::vector<int32_t>& source = m.data.valid.source[0];
    std::vector<int32_t> tokens;  // a target to force: pieces of another pair
    for (int32_t v : m.data.valid.target[1]) tokens.push_back(v);
    tokens.resize(7, 5);
    const std::vector<float> whole = m.teacher_forced(source, tokens);
    remat::TranslationSplit one;
    one.pairs = {{"s", "t"}};
    one.source = {source};
    one.target = {tokens};
    const remat::Batch b = remat::translation_batch(one, std::vector<int64_t>(3, 0), 10, 8, remat::Device::cpu());
    remat::IncrementalDecoder dec(m.g, m.params, m.be, remat::kTargetInName);
    dec.start(b);
    double worst = 0, scale = 0;
    for (int64_t t = 0; t < 8; ++t) {
      const int32_t at = t == 0 ? remat::Tokenizer::kBos : tokens[static_cast<size_t>(t - 1)];
      const std::vector<float> step =
          dec.step(remat::Tensor::from_ints(std::vector<int32_t>(3, at), remat::Shape{3, 1}), t).to_vector();
      ASSERT_EQ(step.size(), 3u * 64u);
      for (int v = 0; v < 64; ++v) {
        worst =
            std::max(worst, std::abs(double(step[static_cast<size_t>(v)]) - whole[static_cast<size_t>(t * 64 + v)]));
        scale = std::max(scale, std::abs(double(whole[static_cast<size_t>(t * 64 + v)])));
      }
    }
    // Bitwise on cpu: every layer but self-attention computes each row as the whole forward
    // does, and the fused attention visits the cached keys in the causal row's order, the
    // masked ones adding nothing.
    EXPECT_EQ(worst, 0.0) << "largest logit " << scale;
    EXPECT_REMAT_ERROR(dec.step(remat::Tensor::from_ints({1, 1, 1}, remat::Shape{3, 1}), 3),
                       "position 3 after 8 steps");

    std::vector<std::vector<int32_t>> sources;
    for (int i = 0; i < 5; ++i)
      sources.push_back(m.data.valid.source[static_cast<size_t>(i) % m.data.valid.source.size()]);
    EXPECT_EQ(remat::greedy_decode(m.g, m.params, m.be, sources, true),
              remat::greedy_decode(m.g, m.params, m.be, sources, false));
    const auto cached = remat::beam_decode(m.g, m.params, m.be, sources, 3, 1.0, true);
    const auto full = remat::beam_decode(m.g, m.params, m.be, sources, 3, 1.0, false);
    for (size_t i = 0; i < sources.size(); ++i) {
      EXPECT_EQ(cached[i].tokens, full[i].tokens) << "source " << i;
      EXPECT_EQ(cached[i].log_prob, full[i].log_prob) << "source " << i;
    }
  }
  {  // beam 3 at batch 7: two sources a batch and a spare row, hypotheses moving between rows
    DecodeModel m(tmp_dir("kv_cache_beam"), 7, 5);
    std::vector<std::vector<int32_t>> sources;
    for (int i = 0; i < 5; ++i) sources.push_back(m.data.train.source[static_cast<size_t>(i)]);
    const auto cached = remat::beam_decode(m.g, m.params, m.be, sources, 3, 1.0, true);
    const auto full = remat::beam_decode(m.g, m.params, m.be, sources, 3, 1.0, false);
    for (size_t i = 0; i < sources.size(); ++i) {
      EXPECT_EQ(cached[i].tokens, full[i].tokens) << "source " << i;
      EXPECT_EQ(cached[i].log_prob, full[i].log_prob) << "source " << i;
    }
  }
  DecodeModel cross(tmp_dir("kv_cache_cross"), 3, 5, "kv_from_target");
  EXPECT_EQ(remat::IncrementalDecoder::unsupported(cross.g, remat::kTargetInName),
            "layer \"dec0.cross_attn\" (cross-attention) reads keys, values or key lengths computed from the target "
            "(\"dec0.kv\"): one position would see itself alone");
  DecodeModel bad(tmp_dir("kv_cache_noncausal"), 3, 5, "noncausal");
  EXPECT_EQ(remat::IncrementalDecoder::unsupported(bad.g, remat::kTargetInName),
            "layer \"dec0.self_attn\" (attention) reads the target but cannot run on one position at a time");
  EXPECT_REMAT_ERROR(remat::IncrementalDecoder(bad.g, bad.params, bad.be, remat::kTargetInName),
                     "incremental decoding: layer \"dec0.self_attn\"");
  EXPECT_EQ(remat::greedy_decode(bad.g, bad.params, bad.be, {bad.data.valid.source[0]}).size(), 1u);  // the whole model
}

// The commands as a user runs them: remat corpus, remat train on that corpus, remat
// translate of the test split (translations on stdout, BLEU and the copy baseline on
// stderr) and of a file; bad input named.
TEST(Translation, CorpusTrainAndTranslateCommands) {
  if (!remat::have_sentencepiece()) GTEST_SKIP() << "built without SentencePiece";
  const std::string dir = tmp_dir("cli");
  const std::string mo = dir + "/synthetic.mo";
  remat::write_file_atomic(mo, make_mo(synthetic_messages(), true));
  auto run = [&](const std::string& args, const std::string& out) {
    const int status = std::system((std::string(REMAT_CLI) + " " + args + " > " + out + " 2>&1").c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  ASSERT_EQ(run("corpus --catalog " + mo + " --vocab 64 --out " + dir + "/corpus", dir + "/corpus.txt"), 0)
      << remat::read_file(dir + "/corpus.txt");
  EXPECT_NE(remat::read_file(dir + "/corpus.txt").find(" train, "), std::string::npos);
  nlohmann::json c = nlohmann::json::parse(remat::read_file(nmt_config(dir, "sqrt")));
  c["data"]["path"] = dir + "/corpus";
  remat::write_file_atomic(dir + "/nmt.json", c.dump());
  ASSERT_EQ(run("train " + dir + "/nmt.json --device cpu --out " + dir + "/run", dir + "/train.txt"), 0)
      << remat::read_file(dir + "/train.txt");
  const std::string train = remat::read_file(dir + "/train.txt");
  EXPECT_NE(train.find("valid BLEU = "), std::string::npos) << train;
  EXPECT_NE(remat::read_file(dir + "/run/metrics.jsonl").find("\"valid_bleu\""), std::string::npos);

  ASSERT_EQ(run("translate " + dir + "/run --max 5 --device cpu", dir + "/translate.txt"), 0)
      << remat::read_file(dir + "/translate.txt");
  const std::string tr = remat::read_file(dir + "/translate.txt");
  EXPECT_NE(tr.find("BLEU = "), std::string::npos) << tr;
  EXPECT_NE(tr.find("copy-the-source baseline: BLEU = "), std::string::npos) << tr;
  EXPECT_NE(tr.find("5 sentences of the test split"), std::string::npos) << tr;

  // remat eval RUN: the split's loss and the BLEU of greedy translations, the same BLEU as
  // translate's on the same pairs; neither depends on the batch (the 12 test pairs in 4s,
  // or in 5s with a short last batch).
  ASSERT_EQ(run("eval " + dir + "/run --max-batches 2 --device cpu", dir + "/eval.txt"), 0)
      << remat::read_file(dir + "/eval.txt");
  ASSERT_EQ(run("translate " + dir + "/run --max 8 --device cpu", dir + "/translate8.txt"), 0);
  auto bleu_line = [](const std::string& text) {
    const size_t at = text.find("BLEU = ");
    return at == std::string::npos ? std::string("none") : text.substr(at, text.find(" (BP", at) - at);
  };
  const std::string ev = remat::read_file(dir + "/eval.txt");
  EXPECT_NE(ev.find("eval: 8 pairs of the test split"), std::string::npos) << ev;
  EXPECT_NE(ev.find("greedy BLEU = "), std::string::npos) << ev;
  EXPECT_EQ(bleu_line(ev), bleu_line(remat::read_file(dir + "/translate8.txt")));
  ASSERT_EQ(run("eval " + dir + "/run --batch 4 --quiet --device cpu", dir + "/eval4.txt"), 0);
  ASSERT_EQ(run("eval " + dir + "/run --batch 5 --quiet --device cpu", dir + "/eval3.txt"), 0);
  double loss4 = 0, loss3 = 0, bleu4 = -1, bleu3 = -2;
  ASSERT_EQ(
      std::sscanf(remat::read_file(dir + "/eval4.txt").c_str(), "loss %lf perplexity %*f bleu %lf", &loss4, &bleu4), 2)
      << remat::read_file(dir + "/eval4.txt");
  ASSERT_EQ(
      std::sscanf(remat::read_file(dir + "/eval3.txt").c_str(), "loss %lf perplexity %*f bleu %lf", &loss3, &bleu3), 2);
  EXPECT_NEAR(loss3, loss4, 1e-5 * loss4);
  EXPECT_GT(loss4, 0.0);
  EXPECT_EQ(bleu3, bleu4);
  EXPECT_EQ(run("eval " + dir + "/run --data x.bin --device cpu", dir + "/evalbad.txt"), 1);
  EXPECT_NE(remat::read_file(dir + "/evalbad.txt").find("--data: a translation model reads its corpus"),
            std::string::npos)
      << remat::read_file(dir + "/evalbad.txt");

  remat::write_file_atomic(dir + "/in.txt", "too many warning\nfile error\n");
  ASSERT_EQ(run("translate " + dir + "/run --input " + dir + "/in.txt --output " + dir + "/out.txt --device cpu",
                dir + "/file.txt"),
            0)
      << remat::read_file(dir + "/file.txt");
  const std::string out = remat::read_file(dir + "/out.txt");
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << out;
  EXPECT_EQ(remat::read_file(dir + "/file.txt").find("BLEU"), std::string::npos);

  // The run records its tokenizer; a corpus rebuilt since (other messages, same vocabulary)
  // is named by translate and by --resume instead of being read with other ids.
  const nlohmann::json tok = nlohmann::json::parse(remat::read_file(dir + "/run/tokenizer.json"));
  EXPECT_EQ(tok["vocab"], 64);
  EXPECT_EQ(tok["fnv1a64"].get<std::string>().size(), 16u);
  auto more = synthetic_messages();
  more.push_back({"segmentation fault in the linker", "Speicherzugriffsfehler im Linker"});
  more.push_back({"internal compiler error", "interner Compiler-Fehler"});
  remat::write_file_atomic(dir + "/more.mo", make_mo(more, true));
  ASSERT_EQ(run("corpus --catalog " + dir + "/more.mo --vocab 64 --out " + dir + "/corpus", dir + "/corpus2.txt"), 0)
      << remat::read_file(dir + "/corpus2.txt");
  EXPECT_EQ(run("translate " + dir + "/run --max 5 --device cpu", dir + "/stale.txt"), 1);
  EXPECT_NE(remat::read_file(dir + "/stale.txt").find("was trained with another tokenizer than"), std::string::npos)
      << remat::read_file(dir + "/stale.txt");
  EXPECT_EQ(run("train " + dir + "/nmt.json --device cpu --resume " + dir + "/run --steps 3", dir + "/resume.txt"), 1);
  EXPECT_NE(remat::read_file(dir + "/resume.txt").find("the corpus was rebuilt since"), std::string::npos)
      << remat::read_file(dir + "/resume.txt");

  EXPECT_EQ(run("translate " + dir + " --device cpu", dir + "/bad.txt"), 1);
  EXPECT_NE(remat::read_file(dir + "/bad.txt").find("not a run folder (no config.json)"), std::string::npos);
  EXPECT_EQ(run("corpus --vocab 10 --out " + dir + "/c2", dir + "/bad2.txt"), 2);
}

// Beam search of width 1 is greedy decoding (two implementations, one answer), and the
// log-probability a beam hypothesis carries is the one a teacher-forced forward gives it.
TEST(Translation, BeamSearchScoresItsHypothesesAsTheModelDoes) {
  if (!remat::have_sentencepiece()) GTEST_SKIP() << "built without SentencePiece";
  DecodeModel m(tmp_dir("beam"), 6, 11);
  std::vector<std::vector<int32_t>> sources;
  for (int i = 0; i < 5; ++i) sources.push_back(m.data.train.source[static_cast<size_t>(i)]);
  const auto greedy = remat::greedy_decode(m.g, m.params, m.be, sources);
  const auto beam1 = remat::beam_decode(m.g, m.params, m.be, sources, 1);
  for (size_t i = 0; i < sources.size(); ++i) EXPECT_EQ(beam1[i].tokens, greedy[i]) << "source " << i;

  const auto beam3 = remat::beam_decode(m.g, m.params, m.be, sources, 3, 1.0);
  for (size_t i = 0; i < sources.size(); ++i) {
    const auto& h = beam3[i];
    ASSERT_LE(h.tokens.size(), 8u);
    const std::vector<float> logits = m.teacher_forced(sources[i], h.tokens);
    double lp = 0;
    const size_t steps = std::min<size_t>(h.tokens.size() + 1, 8);  // the pieces and </s> (unless cut at T)
    for (size_t t = 0; t < steps; ++t) {
      const float* row = logits.data() + t * 64;
      double m = row[0], s = 0;
      for (int v = 1; v < 64; ++v) m = std::max(m, static_cast<double>(row[v]));
      for (int v = 0; v < 64; ++v) s += std::exp(row[v] - m);
      const int32_t want = t < h.tokens.size() ? h.tokens[t] : remat::Tokenizer::kEos;
      lp += row[want] - m - std::log(s);
    }
    EXPECT_NEAR(h.log_prob, lp, 1e-6 * std::max(1.0, std::abs(lp))) << "source " << i;
    EXPECT_LE(h.log_prob, 0.0);
  }
  EXPECT_REMAT_ERROR(remat::beam_decode(m.g, m.params, m.be, sources, 7), "needs a batch of at least");
}
