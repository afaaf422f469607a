// BLEU against sacrebleu (tests/golden/bleu/sacrebleu.json, written by
// tools/reference/gen_bleu_golden.py with sacrebleu from PyPI): the 13a tokenization of
// each line is equal, and every corpus score within 0.01 with equal n-gram counts.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "remat/bleu.h"

namespace {

nlohmann::json golden() {
  std::ifstream in(std::string(REMAT_SOURCE_DIR) + "/tests/golden/bleu/sacrebleu.json");
  EXPECT_TRUE(in.good());
  return nlohmann::json::parse(in);
}

}  // namespace

TEST(Bleu, TokenizesAsSacrebleus13a) {
  const nlohmann::json g = golden();
  ASSERT_GE(g["tokenize_13a"].size(), 10u);
  for (const auto& c : g["tokenize_13a"]) {
    const std::string line = c["line"], want = c["tokens"];
    // corpus_bleu strips the line's end before tokenizing; the golden did the same.
    std::string stripped = line;
    while (!stripped.empty() && (stripped.back() == ' ' || stripped.back() == '\n')) stripped.pop_back();
    EXPECT_EQ(remat::bleu_tokenize_13a(stripped), want) << "line: " << line;
  }
}

TEST(Bleu, CorpusScoresEqualSacrebleus) {
  const nlohmann::json g = golden();
  ASSERT_GE(g["corpora"].size(), 8u);
  for (const auto& c : g["corpora"]) {
    const remat::BleuScore b = remat::corpus_bleu(c["hypotheses"].get<std::vector<std::string>>(),
                                                  c["references"].get<std::vector<std::string>>());
    const std::string name = c["name"];
    EXPECT_NEAR(b.score, c["score"].get<double>(), 0.01) << name;
    EXPECT_NEAR(b.score, c["score"].get<double>(), 1e-9) << name << ": more than rounding apart";
    EXPECT_EQ(b.sys_len, c["sys_len"].get<int64_t>()) << name;
    EXPECT_EQ(b.ref_len, c["ref_len"].get<int64_t>()) << name;
    EXPECT_NEAR(b.brevity_penalty, c["bp"].get<double>(), 1e-12) << name;
    for (int n = 0; n < 4; ++n) {
      EXPECT_EQ(b.correct[static_cast<size_t>(n)], c["counts"][n].get<int64_t>()) << name << " n " << n + 1;
      EXPECT_EQ(b.total[static_cast<size_t>(n)], c["totals"][n].get<int64_t>()) << name << " n " << n + 1;
    }
  }
}

TEST(Bleu, MismatchedCountsAreAnError) { EXPECT_THROW(remat::corpus_bleu({"a"}, {"a", "b"}), std::exception); }
