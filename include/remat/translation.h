// Translation data: a parallel corpus built offline from gettext catalogs (human
// translations that Debian ships: gcc-12-locales' English->German messages), a SentencePiece
// subword tokenizer trained on its training split, and batches of padded token sequences for
// an encoder-decoder model (docs/translation.md).
//
// The corpus folder holds train.tsv, valid.tsv and test.tsv (one "source<TAB>target" pair a
// line, UTF-8), tokenizer.model (SentencePiece, shared by both languages: <pad> 0, <unk> 1,
// <s> 2, </s> 3) and manifest.json (the catalogs read, every count, the licence). It is
// written whole into a temporary folder beside it and renamed into place, so a crash leaves
// the old corpus, the new one or none (and a stale DIR.tmp-PID folder), never half of one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "remat/data.h"

namespace remat {

// The default size of the tokenizer's vocabulary: config.h's kTranslationVocab, the default
// data.vocab of a "translation" data set (the data layer sits below the config's).
inline constexpr int64_t kDefaultTokenizerVocab = 4000;

struct ParallelPair {
  std::string source, target;
};

// The messages of a gettext catalog (.mo, either byte order): msgid -> msgstr, with the
// header entry (empty msgid) left out, a msgctxt prefix ("ctx\x04") stripped and, for
// plural entries, the singular forms only. Errors name the file and what is wrong
// (bad magic, a table or string outside the file, a charset other than UTF-8).
std::vector<ParallelPair> read_mo_catalog(const std::string& path);

// Where Debian's gcc-12-locales package puts its German catalogs (gcc-12.mo, cpplib-12.mo).
std::vector<std::string> default_corpus_catalogs();

struct CorpusOptions {
  std::vector<std::string> catalogs;  // empty: default_corpus_catalogs()
  std::string out_dir;
  int64_t vocab = kDefaultTokenizerVocab;  // the tokenizer's vocabulary, special pieces included
  uint64_t seed = 1;                       // SentencePiece's random seed
  // An existing corpus at out_dir: replaced (remat corpus), or kept when another process
  // built it meanwhile (the data set's first use, where several ranks may build at once).
  bool replace = true;
  bool quiet = false;
};

struct CorpusSummary {
  int64_t messages = 0;      // entries read from the catalogs
  int64_t empty = 0;         // dropped: an empty side after whitespace was collapsed
  int64_t untranslated = 0;  // dropped: target equal to source
  int64_t duplicates = 0;    // dropped: a pair seen before
  int64_t train = 0, valid = 0, test = 0;
  int64_t vocab = 0;
  std::string describe() const;
};

// Cleans (whitespace runs become one space, ends trimmed), drops empty, untranslated and
// duplicate pairs, splits by a hash of the source (90% train, 5% valid, 5% test: a source
// string is in one split only, with all its translations) and trains the tokenizer on the
// training split's two sides.
CorpusSummary build_translation_corpus(const CorpusOptions& o);

// The folder the "translation" data set uses when data.path is empty: under
// $REMAT_CACHE_DIR, else $XDG_CACHE_HOME/remat, else ~/.cache/remat; "nmt_de-v<vocab>".
std::string default_translation_corpus_dir(int64_t vocab);

// A SentencePiece model. ids: <pad> 0, <unk> 1, <s> 2 (bos), </s> 3 (eos).
class Tokenizer {
 public:
  static constexpr int32_t kPad = 0, kUnk = 1, kBos = 2, kEos = 3;
  Tokenizer();
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  // Checks that the special ids are the ones above; errors name the file.
  void load(const std::string& path);
  std::vector<int32_t> encode(const std::string& text) const;
  // Stops at the first </s>; <pad> and <s> are skipped.
  std::string decode(const std::vector<int32_t>& ids) const;
  int64_t vocab() const;
  bool loaded() const;
  // FNV-1a 64 of the model file's bytes: which tokenizer this is (a run records it).
  uint64_t fingerprint() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Whether remat was built with SentencePiece (libsentencepiece-dev).
bool have_sentencepiece();

struct TranslationSplit {
  std::vector<ParallelPair> pairs;                   // the text
  std::vector<std::vector<int32_t>> source, target;  // their pieces, without <s> or </s>
  int64_t size() const { return static_cast<int64_t>(pairs.size()); }
};

// A corpus folder, tokenized. fit() keeps the pairs a model of source length S and target
// length T can read whole: the source and </s> in S, <s> and the target (the decoder's
// input), or the target and </s> (its labels), in T.
struct TranslationData {
  std::string dir;
  Tokenizer tokenizer;
  TranslationSplit train, valid, test;
  int64_t src_len = 0, tgt_len = 0;
  int64_t dropped_train = 0, dropped_valid = 0, dropped_test = 0;  // too long for (S, T)
  void fit(int64_t S, int64_t T);
  const TranslationSplit& split(const std::string& name) const;  // train | valid | test
  std::string describe() const;
};
// Loads dir (building it first with `vocab` when it is the default folder and missing).
TranslationData load_translation_data(const std::string& dir, int64_t vocab, bool build_if_missing);

// A translation run's record of the tokenizer it was trained with, RUN/tokenizer.json (the
// corpus folder, the model file's size and FNV-1a 64, its vocabulary): written by `remat
// train`, checked by `--resume` and `remat translate`, so that a corpus rebuilt since (another
// --vocab, --seed or catalogs) is named instead of read with ids the model never saw.
void write_run_tokenizer(const std::string& run_dir, const TranslationData& d);
// Throws naming both when d's tokenizer is not the one the run recorded; a run without a
// record (written before remat kept one) passes.
void check_run_tokenizer(const std::string& run_dir, const TranslationData& d);

// Names of the model inputs a translation batch fills.
inline constexpr const char* kSourceName = "src";
inline constexpr const char* kSourceLengthName = "src_len";
inline constexpr const char* kTargetInName = "tgt";

// Row i is pair idx[i] of `split`: src [B, S] (pieces, </s>, then <pad>), src_len [B]
// (pieces + 1), tgt [B, T] (<s>, pieces, <pad>...) and targets [B, T] (pieces, </s>,
// <pad>...; <pad> is what the loss ignores).
Batch translation_batch(const TranslationSplit& split, const std::vector<int64_t>& idx, int64_t S, int64_t T, Device d);

}  // namespace remat
