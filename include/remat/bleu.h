// Corpus BLEU as sacrebleu computes it by default (BLEU with the 13a tokenizer, mixed
// case, n-grams up to 4, exponential smoothing, one reference per hypothesis), so that a
// score here equals `sacrebleu.corpus_bleu(hyps, [refs]).score` (tests/test_bleu.cpp checks
// it against sacrebleu's own scores).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace remat {

// mteval-v13a's tokenization: <skipped> dropped, HTML entities &quot; &amp; &lt; &gt;
// decoded, punctuation and symbols split off, periods and commas split unless beside a
// digit, a dash after a digit split; tokens joined by one space.
std::string bleu_tokenize_13a(const std::string& line);

struct BleuScore {
  double score = 0;  // 0..100
  std::array<int64_t, 4> correct{}, total{};
  std::array<double, 4> precisions{};  // percent
  double brevity_penalty = 0;
  int64_t sys_len = 0, ref_len = 0;
  std::string describe()
      const;  // "BLEU = 23.41 55.1/29.8/17.6/10.9 (BP = 0.982 ratio = 0.982 hyp_len = ... ref_len = ...)"
};

// hypotheses[i] is scored against references[i]; the two have one length.
BleuScore corpus_bleu(const std::vector<std::string>& hypotheses, const std::vector<std::string>& references);

}  // namespace remat
