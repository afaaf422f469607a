// Translation data: gettext catalogs -> a split, deduplicated parallel corpus -> a
// SentencePiece tokenizer -> padded batches (include/remat/translation.h).
#include "remat/translation.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "data/token_batch.h"
#include "remat/error.h"
#include "remat/hash.h"
#include "remat/io.h"
#include "remat/memory.h"

#ifdef REMAT_WITH_SENTENCEPIECE
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#endif

namespace fs = std::filesystem;

namespace remat {

namespace {

constexpr const char* kCatalogDir = "/usr/share/locale/de/LC_MESSAGES";
constexpr const char* kSplits[] = {"train", "valid", "test"};
constexpr int kFormat = 1;  // manifest.json's "format": what this reader understands

// Whitespace runs (spaces, tabs, newlines) become one space; the ends are trimmed.
std::string collapse_space(const std::string& s) {
  std::string out;
  bool space = false;
  for (char c : s) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

// Which split a source string goes to: 90 / 5 / 5 by its hash, so that every translation of
// one source lands in one split.
int split_of(const std::string& source) {
  const uint64_t h = fnv1a64(source) % 100;
  return h < 90 ? 0 : h < 95 ? 1 : 2;
}

std::string cache_root() {
  if (const char* d = std::getenv("REMAT_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return (fs::path(d) / "remat").string();
  if (const char* d = std::getenv("HOME"); d && *d) return (fs::path(d) / ".cache" / "remat").string();
  REMAT_THROW("no folder for the translation corpus: set data.path, or REMAT_CACHE_DIR (HOME is not set)");
}

std::vector<ParallelPair> read_tsv(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    REMAT_THROW(path, ": cannot read (run `remat corpus --out ", fs::path(path).parent_path().string(),
                "` to build the corpus)");
  std::vector<ParallelPair> pairs;
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    const size_t tab = line.find('\t');
    if (tab == std::string::npos || line.find('\t', tab + 1) != std::string::npos || tab == 0 || tab + 1 == line.size())
      REMAT_THROW(path, ":", n, ": expected \"source<TAB>target\" (two non-empty fields)");
    if (!is_valid_utf8(line)) REMAT_THROW(path, ":", n, ": not valid UTF-8");
    pairs.push_back({line.substr(0, tab), line.substr(tab + 1)});
  }
  return pairs;
}

}  // namespace

// ---- gettext catalogs -----------------------------------------------------------------------------

std::vector<ParallelPair> read_mo_catalog(const std::string& path) {
  const std::string b = read_file(path);
  auto u32 = [&](size_t off, bool swap) -> uint32_t {
    if (off + 4 > b.size())
      REMAT_THROW(path, ": truncated (a header or table entry at byte ", off, " of ", b.size(), ")");
    uint32_t v;
    std::memcpy(&v, b.data() + off, 4);
    return swap ? __builtin_bswap32(v) : v;
  };
  const uint32_t magic = u32(0, false);
  bool swap = false;
  if (magic == 0x950412deU)
    swap = false;
  else if (magic == 0xde120495U)
    swap = true;
  else
    REMAT_THROW(path, ": not a gettext catalog (.mo): magic 0x", std::hex, magic);
  const uint32_t revision = u32(4, swap);
  if ((revision >> 16) > 1) REMAT_THROW(path, ": unknown .mo major revision ", revision >> 16);
  const uint32_t n = u32(8, swap), orig = u32(12, swap), trans = u32(16, swap);
  if (static_cast<uint64_t>(n) * 8 > b.size()) REMAT_THROW(path, ": claims ", n, " messages in ", b.size(), " bytes");
  auto str = [&](uint32_t table, uint32_t i) {
    const uint32_t len = u32(table + 8ULL * i, swap), off = u32(table + 8ULL * i + 4, swap);
    if (static_cast<uint64_t>(off) + len > b.size())
      REMAT_THROW(path, ": message ", i, " lies outside the file (bytes ", off, "..", uint64_t{off} + len, " of ",
                  b.size(), ")");
    return b.substr(off, len);
  };
  std::vector<ParallelPair> out;
  for (uint32_t i = 0; i < n; ++i) {
    std::string id = str(orig, i), text = str(trans, i);
    if (id.empty()) {  // the header: check the charset
      const size_t cs = text.find("charset=");
      if (cs != std::string::npos) {
        std::string charset = text.substr(cs + 8, text.find_first_of(" \n;", cs + 8) - cs - 8);
        std::transform(charset.begin(), charset.end(), charset.begin(),
                       [](unsigned char c) { return std::tolower(c); });
        if (charset != "utf-8" && charset != "ascii" && charset != "us-ascii")
          REMAT_THROW(path, ": charset ", charset, ": only UTF-8 catalogs are read");
      }
      continue;
    }
    if (const size_t ctx = id.find('\x04'); ctx != std::string::npos) id = id.substr(ctx + 1);
    id = id.substr(0, id.find('\0'));  // plural entries: "singular\0plural"
    text = text.substr(0, text.find('\0'));
    if (!is_valid_utf8(id) || !is_valid_utf8(text)) REMAT_THROW(path, ": message ", i, " is not valid UTF-8");
    out.push_back({std::move(id), std::move(text)});
  }
  return out;
}

std::vector<std::string> default_corpus_catalogs() {
  std::vector<std::string> paths;
  for (const char* name : {"gcc-12.mo", "cpplib-12.mo"}) {
    const fs::path p = fs::path(kCatalogDir) / name;
    if (!fs::exists(p))
      REMAT_THROW(p.string(), " is missing: install Debian's gcc-12-locales (tools/bootstrap.sh does), or pass ",
                  "--catalog files to `remat corpus`");
    paths.push_back(p.string());
  }
  return paths;
}

std::string default_translation_corpus_dir(int64_t vocab) {
  return (fs::path(cache_root()) / ("nmt_de-v" + std::to_string(vocab))).string();
}

std::string CorpusSummary::describe() const {
  std::ostringstream s;
  s << messages << " messages; dropped " << empty << " empty, " << untranslated << " untranslated, " << duplicates
    << " duplicate; " << train << " train, " << valid << " valid, " << test << " test pairs; vocabulary " << vocab;
  return s.str();
}

// ---- the tokenizer ---------------------------------------------------------------------------------

namespace {

// Standard error sent to /dev/null for a scope (restored however the scope ends).
class QuietStderr {
 public:
  QuietStderr() {
    std::fflush(stderr);
    saved_ = ::dup(2);
    const int null = ::open("/dev/null", O_WRONLY);
    if (saved_ >= 0 && null >= 0) ::dup2(null, 2);
    if (null >= 0) ::close(null);
  }
  ~QuietStderr() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
  }
  QuietStderr(const QuietStderr&) = delete;
  QuietStderr& operator=(const QuietStderr&) = delete;

 private:
  int saved_ = -1;
};

#ifdef REMAT_WITH_SENTENCEPIECE
// The training lines, one sentence each, for the trainer.
class LinesIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit LinesIterator(const std::vector<std::string>& lines) : lines_(lines) {}
  bool done() const override { return i_ >= lines_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return lines_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& lines_;
  size_t i_ = 0;
};
#endif

}  // namespace

bool have_sentencepiece() {
#ifdef REMAT_WITH_SENTENCEPIECE
  return true;
#else
  return false;
#endif
}

namespace {
[[noreturn]] void no_sentencepiece() {
  REMAT_THROW(
      "remat was built without SentencePiece: install libsentencepiece-dev (tools/bootstrap.sh does) and "
      "configure again");
}
}  // namespace

struct Tokenizer::Impl {
#ifdef REMAT_WITH_SENTENCEPIECE
  sentencepiece::SentencePieceProcessor sp;
#endif
  bool loaded = false;
  uint64_t fingerprint = 0;
};

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
bool Tokenizer::loaded() const { return impl_ && impl_->loaded; }

void Tokenizer::load(const std::string& path) {
#ifdef REMAT_WITH_SENTENCEPIECE
  if (!fs::exists(path)) REMAT_THROW(path, ": no such tokenizer model");
  const auto st = impl_->sp.Load(path);
  if (!st.ok()) REMAT_THROW(path, ": not a SentencePiece model (", st.ToString(), ")");
  const auto& sp = impl_->sp;
  if (sp.pad_id() != kPad || sp.unk_id() != kUnk || sp.bos_id() != kBos || sp.eos_id() != kEos)
    REMAT_THROW(path, ": special ids pad ", sp.pad_id(), ", unk ", sp.unk_id(), ", bos ", sp.bos_id(), ", eos ",
                sp.eos_id(), "; remat expects 0, 1, 2, 3 (train it with `remat corpus`)");
  impl_->fingerprint = fnv1a64(read_file(path));
  impl_->loaded = true;
#else
  (void)path;
  no_sentencepiece();
#endif
}

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  REMAT_CHECK(loaded(), "Tokenizer::encode: no model loaded");
#ifdef REMAT_WITH_SENTENCEPIECE
  std::vector<int> ids;
  const auto st = impl_->sp.Encode(text, &ids);
  if (!st.ok()) REMAT_THROW("tokenizer: cannot encode \"", text, "\": ", st.ToString());
  return {ids.begin(), ids.end()};
#else
  (void)text;
  no_sentencepiece();
#endif
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  REMAT_CHECK(loaded(), "Tokenizer::decode: no model loaded");
#ifdef REMAT_WITH_SENTENCEPIECE
  std::vector<int> keep;
  const int v = impl_->sp.GetPieceSize();
  for (int32_t id : ids) {
    if (id == kEos) break;
    if (id == kPad || id == kBos) continue;
    REMAT_CHECK(id >= 0 && id < v, "tokenizer: id ", id, " is outside [0, ", v, ")");
    keep.push_back(id);
  }
  std::string text;
  const auto st = impl_->sp.Decode(keep, &text);
  if (!st.ok()) REMAT_THROW("tokenizer: cannot decode: ", st.ToString());
  return text;
#else
  (void)ids;
  no_sentencepiece();
#endif
}

uint64_t Tokenizer::fingerprint() const {
  REMAT_CHECK(loaded(), "Tokenizer::fingerprint: no model loaded");
  return impl_->fingerprint;
}

namespace {

std::string hex64(uint64_t x) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(x));
  return buf;
}

}  // namespace

void write_run_tokenizer(const std::string& run_dir, const TranslationData& d) {
  const nlohmann::json j = {{"corpus", d.dir},
                            {"file", "tokenizer.model"},
                            {"fnv1a64", hex64(d.tokenizer.fingerprint())},
                            {"vocab", d.tokenizer.vocab()}};
  write_file_atomic((fs::path(run_dir) / "tokenizer.json").string(), j.dump(2) + "\n");
}

void check_run_tokenizer(const std::string& run_dir, const TranslationData& d) {
  const fs::path rec = fs::path(run_dir) / "tokenizer.json";
  if (!fs::exists(rec)) return;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(rec.string()));
  } catch (const nlohmann::json::exception& e) {
    REMAT_THROW(rec.string(), ": not valid JSON: ", e.what());
  }
  if (!j.is_object() || !j.contains("fnv1a64") || !j["fnv1a64"].is_string())
    REMAT_THROW(rec.string(), ": no \"fnv1a64\" string (expected the record remat train writes)");
  const std::string want = j["fnv1a64"].get<std::string>(), have = hex64(d.tokenizer.fingerprint());
  if (want != have)
    REMAT_THROW(run_dir, " was trained with another tokenizer than ", d.dir, "/tokenizer.model holds now (its record ",
                rec.string(), " says fnv1a64 ", want, ", vocab ", j.value("vocab", int64_t{0}), ", corpus ",
                j.value("corpus", std::string("?")), "; the file has ", have, ", vocab ", d.tokenizer.vocab(),
                "): the corpus was rebuilt since; rebuild it as it was (remat corpus with the same --vocab, --seed "
                "and catalogs)");
}

int64_t Tokenizer::vocab() const {
  REMAT_CHECK(loaded(), "Tokenizer::vocab: no model loaded");
#ifdef REMAT_WITH_SENTENCEPIECE
  return impl_->sp.GetPieceSize();
#else
  no_sentencepiece();
#endif
}

// ---- building a corpus -----------------------------------------------------------------------------

namespace {

// A build that died (killed, out of power) leaves its OUT.tmp-PID folder beside out: each
// such sibling whose process is gone (kill(pid, 0) answers ESRCH) is removed; one of a live
// process (another build under way) is left alone.
void remove_stale_builds(const fs::path& out) {
  const std::string prefix = out.filename().string() + ".tmp-";
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto pid = static_cast<pid_t>(std::stol(digits));
    if (pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH) stale.push_back(e.path());
  }
  for (const fs::path& p : stale) fs::remove_all(p, ec);
}

}  // namespace

CorpusSummary build_translation_corpus(const CorpusOptions& o) {
  REMAT_CHECK(!o.out_dir.empty(), "remat corpus: no output folder");
  REMAT_CHECK(o.vocab >= 64 && o.vocab <= 1000000, "remat corpus: --vocab ", o.vocab, ": expected 64 to 1000000");
  if (!have_sentencepiece()) no_sentencepiece();
  const std::vector<std::string> catalogs = o.catalogs.empty() ? default_corpus_catalogs() : o.catalogs;
  CorpusSummary sum;
  std::set<std::pair<std::string, std::string>> seen;
  std::vector<ParallelPair> split[3];
  nlohmann::json sources = nlohmann::json::array();
  for (const std::string& path : catalogs) {
    const std::vector<ParallelPair> msgs = read_mo_catalog(path);
    sum.messages += static_cast<int64_t>(msgs.size());
    sources.push_back({{"file", fs::path(path).filename().string()},
                       {"messages", msgs.size()},
                       {"bytes", fs::file_size(path)},
                       {"fnv1a64", [&] {
                          char h[17];
                          std::snprintf(h, sizeof h, "%016llx",
                                        static_cast<unsigned long long>(fnv1a64(read_file(path))));
                          return std::string(h);
                        }()}});
    for (const ParallelPair& m : msgs) {
      ParallelPair p{collapse_space(m.source), collapse_space(m.target)};
      if (p.source.empty() || p.target.empty()) {
        ++sum.empty;
      } else if (p.source == p.target) {
        ++sum.untranslated;
      } else if (!seen.insert({p.source, p.target}).second) {
        ++sum.duplicates;
      } else {
        split[split_of(p.source)].push_back(std::move(p));
      }
    }
  }
  sum.train = static_cast<int64_t>(split[0].size());
  sum.valid = static_cast<int64_t>(split[1].size());
  sum.test = static_cast<int64_t>(split[2].size());
  REMAT_CHECK(sum.train >= 100 && sum.valid > 0 && sum.test > 0, "remat corpus: only ", sum.train, " train, ",
              sum.valid, " valid and ", sum.test, " test pairs from ", catalogs.size(),
              " catalogs: too few to train on");

  // Everything goes into a fresh folder beside out_dir, renamed into place at the end.
  // `out` without a trailing slash, so that the temporary folder is its sibling.
  fs::path out = fs::path(o.out_dir).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();
  if (fs::exists(out) && !fs::exists(out / "manifest.json"))
    REMAT_THROW(out.string(), " exists and is not a corpus folder (no manifest.json): choose another --out");
  if (out.has_parent_path()) fs::create_directories(out.parent_path());
  remove_stale_builds(out);
  const fs::path tmp = out.string() + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  struct Cleanup {
    fs::path p;
    bool armed = true;
    ~Cleanup() {
      std::error_code ec;
      if (armed) fs::remove_all(p, ec);
    }
  } cleanup{tmp};
  for (int s = 0; s < 3; ++s) {
    std::string text;
    for (const ParallelPair& p : split[s]) text += p.source + "\t" + p.target + "\n";
    write_file_atomic((tmp / (std::string(kSplits[s]) + ".tsv")).string(), text);
  }
#ifdef REMAT_WITH_SENTENCEPIECE
  if (!o.quiet) {
    std::printf("remat corpus: training the tokenizer (SentencePiece unigram, %lld pieces) on %lld pairs\n",
                static_cast<long long>(o.vocab), static_cast<long long>(sum.train));
    std::fflush(stdout);
  }
  // The tokenizer learns from both sides of the training split only, fed from memory (no
  // file names on its command line, which splits them at spaces and commas). One thread
  // and a fixed seed: the same pieces on every machine. Characters all covered (German
  // umlauts and the catalogs' punctuation are rare but real).
  std::vector<std::string> lines;
  for (const ParallelPair& p : split[0]) {
    lines.push_back(p.source);
    lines.push_back(p.target);
  }
  LinesIterator it(lines);
  const std::unordered_map<std::string, std::string> kwargs = {{"vocab_size", std::to_string(o.vocab)},
                                                               {"model_type", "unigram"},
                                                               {"character_coverage", "1.0"},
                                                               {"pad_id", "0"},
                                                               {"unk_id", "1"},
                                                               {"bos_id", "2"},
                                                               {"eos_id", "3"},
                                                               {"num_threads", "1"},
                                                               {"minloglevel", "2"}};
  sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned>(o.seed));
  std::string model;
  sentencepiece::util::Status st;
  {
    const QuietStderr quiet;  // the trainer logs its settings before it reads minloglevel
    st = sentencepiece::SentencePieceTrainer::Train(kwargs, &it, &model);
  }
  if (!st.ok()) REMAT_THROW("remat corpus: the tokenizer did not train: ", st.ToString());
  write_file_atomic((tmp / "tokenizer.model").string(), model);
#endif
  sum.vocab = o.vocab;
  nlohmann::json m = {
      {"format", kFormat},
      {"what", "English->German pairs of gettext messages (msgid -> msgstr), cleaned, deduplicated, split by source"},
      {"catalogs", sources},
      {"licence",
       "The catalogs are the GCC translation team's work, distributed under the GCC package's licence "
       "(GPL-3.0-or-later): see /usr/share/doc/gcc-12-locales/copyright. This corpus is derived from them."},
      {"counts",
       {{"messages", sum.messages},
        {"dropped_empty", sum.empty},
        {"dropped_untranslated", sum.untranslated},
        {"dropped_duplicate", sum.duplicates},
        {"train", sum.train},
        {"valid", sum.valid},
        {"test", sum.test}}},
      {"split", "by FNV-1a 64 of the source string mod 100: < 90 train, < 95 valid, else test"},
      {"tokenizer",
       {{"file", "tokenizer.model"},
        {"type", "sentencepiece unigram"},
        {"vocab", o.vocab},
        {"seed", o.seed},
        {"special", {{"pad", 0}, {"unk", 1}, {"bos", 2}, {"eos", 3}}}}}};
  write_file_atomic((tmp / "manifest.json").string(), m.dump(2) + "\n");
  if (fs::exists(out)) {
    if (!o.replace && fs::exists(out / "manifest.json")) return sum;  // another process built it meanwhile
    if (!fs::exists(out / "manifest.json"))
      REMAT_THROW(out.string(), " exists and is not a corpus folder (no manifest.json): choose another --out");
    fs::remove_all(out);
  }
  std::error_code ec;
  fs::rename(tmp, out, ec);
  if (ec) {
    // Another process's corpus took the name between the check and the rename: keep it.
    if (!o.replace && fs::exists(out / "manifest.json")) return sum;
    REMAT_THROW(out.string(), ": cannot move the new corpus into place: ", ec.message());
  }
  cleanup.armed = false;
  return sum;
}

// ---- loading and batching --------------------------------------------------------------------------

TranslationData load_translation_data(const std::string& dir, int64_t vocab, bool build_if_missing) {
  const fs::path root(dir);
  if (!fs::exists(root / "manifest.json")) {
    if (!build_if_missing)
      REMAT_THROW(dir, ": no translation corpus here (no manifest.json); build one with `remat corpus --out ", dir,
                  "`");
    std::printf("data: building the translation corpus in %s (once)\n", dir.c_str());
    std::fflush(stdout);
    CorpusOptions o;
    o.out_dir = dir;
    o.vocab = vocab;
    o.replace = false;  // several processes (ranks) may build it at once: the first one's stays
    const CorpusSummary s = build_translation_corpus(o);
    std::printf("data: %s\n", s.describe().c_str());
  }
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(read_file((root / "manifest.json").string()));
  } catch (const nlohmann::json::exception& e) {
    REMAT_THROW((root / "manifest.json").string(), ": not valid JSON (", e.what(), ")");
  }
  const bool known =
      m.is_object() && m.contains("format") && m["format"].is_number_integer() && m["format"].get<int64_t>() == kFormat;
  if (!known)
    REMAT_THROW((root / "manifest.json").string(), ": format ",
                m.is_object() && m.contains("format") ? m["format"].dump() : std::string("missing"),
                ", this remat reads format ", kFormat, ": build the corpus again with `remat corpus --out ", dir, "`");
  TranslationData d;
  d.dir = dir;
  d.tokenizer.load((root / "tokenizer.model").string());
  for (int s = 0; s < 3; ++s) {
    TranslationSplit& sp = s == 0 ? d.train : s == 1 ? d.valid : d.test;
    sp.pairs = read_tsv((root / (std::string(kSplits[s]) + ".tsv")).string());
    for (const ParallelPair& p : sp.pairs) {
      sp.source.push_back(d.tokenizer.encode(p.source));
      sp.target.push_back(d.tokenizer.encode(p.target));
    }
  }
  return d;
}

void TranslationData::fit(int64_t S, int64_t T) {
  REMAT_CHECK(S >= 2 && T >= 2, "translation data: source length ", S, " and target length ", T, " must be at least 2");
  src_len = S;
  tgt_len = T;
  auto keep = [&](TranslationSplit& sp) {
    TranslationSplit k;
    for (size_t i = 0; i < sp.pairs.size(); ++i) {
      if (static_cast<int64_t>(sp.source[i].size()) + 1 > S || static_cast<int64_t>(sp.target[i].size()) + 1 > T)
        continue;
      k.pairs.push_back(sp.pairs[i]);
      k.source.push_back(sp.source[i]);
      k.target.push_back(sp.target[i]);
    }
    const int64_t dropped = sp.size() - k.size();
    sp = std::move(k);
    return dropped;
  };
  dropped_train += keep(train);
  dropped_valid += keep(valid);
  dropped_test += keep(test);
}

const TranslationSplit& TranslationData::split(const std::string& name) const {
  if (name == "train") return train;
  if (name == "valid") return valid;
  if (name == "test") return test;
  REMAT_THROW("no split \"", name, "\": expected train, valid or test");
}

std::string TranslationData::describe() const {
  std::ostringstream s;
  s << dir << ": " << train.size() << " train, " << valid.size() << " valid, " << test.size() << " test pairs";
  if (src_len > 0)
    s << " of at most " << src_len << " source and " << tgt_len << " target pieces (" << dropped_train << ", "
      << dropped_valid << ", " << dropped_test << " longer left out)";
  s << "; vocabulary " << tokenizer.vocab();
  return s.str();
}

Batch translation_batch(const TranslationSplit& split, const std::vector<int64_t>& idx, int64_t S, int64_t T,
                        Device d) {
  REMAT_CHECK(!idx.empty(), "translation_batch: no pairs");
  const auto b = static_cast<int64_t>(idx.size());
  std::vector<int32_t> src(static_cast<size_t>(b * S), Tokenizer::kPad), len(static_cast<size_t>(b)),
      tgt(static_cast<size_t>(b * T), Tokenizer::kPad), targets(static_cast<size_t>(b * T), Tokenizer::kPad);
  for (int64_t r = 0; r < b; ++r) {
    const int64_t i = idx[static_cast<size_t>(r)];
    REMAT_CHECK(i >= 0 && i < split.size(), "translation_batch: pair ", i, " is outside [0, ", split.size(), ")");
    const auto& s = split.source[static_cast<size_t>(i)];
    const auto& t = split.target[static_cast<size_t>(i)];
    REMAT_CHECK(static_cast<int64_t>(s.size()) < S && static_cast<int64_t>(t.size()) < T, "translation_batch: pair ", i,
                " (", s.size(), " and ", t.size(), " pieces) does not fit source ", S, " and target ", T);
    int32_t* sr = src.data() + r * S;
    std::copy(s.begin(), s.end(), sr);
    sr[s.size()] = Tokenizer::kEos;
    len[static_cast<size_t>(r)] = static_cast<int32_t>(s.size() + 1);
    int32_t* ti = tgt.data() + r * T;
    int32_t* to = targets.data() + r * T;
    ti[0] = Tokenizer::kBos;
    std::copy(t.begin(), t.end(), ti + 1);
    std::copy(t.begin(), t.end(), to);
    to[t.size()] = Tokenizer::kEos;
  }
  TagScope scope(MemoryCategory::input, "data", Phase::setup);
  auto put = [&](const std::vector<int32_t>& v, const Shape& shape) {
    if (d.is_meta()) return Tensor::empty(shape, d, DType::i32);
    return data_detail::to_device(Tensor::from_ints(v, shape), d);
  };
  Batch batch;
  batch.set(kSourceName, put(src, Shape{b, S}));
  batch.set(kSourceLengthName, put(len, Shape{b}));
  batch.set(kTargetInName, put(tgt, Shape{b, T}));
  batch.set("targets", put(targets, Shape{b, T}));
  return batch;
}

}  // namespace remat
