// `remat corpus` (build the English->German corpus and its tokenizer) and `remat translate
// RUN` (greedy translations of a trained encoder-decoder, scored with BLEU); docs/cli.md.
#include <cstdio>

#include "commands.h"
#include "remat/translate.h"
#include "remat/translation.h"

namespace remat::cli {

Runner add_corpus_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "corpus", "Build the English->German translation corpus (gettext catalogs) and train its tokenizer");
  auto opt = std::make_shared<CorpusOptions>();
  cmd->add_option("--out", opt->out_dir,
                  "Corpus folder to write (replaced whole when it holds a corpus); default: the folder the "
                  "translation data set reads when data.path is empty")
      ->default_str("$REMAT_CACHE_DIR/nmt_de-v<vocab>");
  cmd->add_option("--vocab", opt->vocab, "Pieces of the SentencePiece tokenizer, special ones included")
      ->default_val(kDefaultTokenizerVocab)
      ->check(whole_number_at_least(64, "64 or more"));
  cmd->add_option("--catalog", opt->catalogs,
                  "A gettext catalog (.mo) to read, repeatable; default: gcc-12-locales' gcc-12.mo and cpplib-12.mo "
                  "(German)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--seed", opt->seed, "The tokenizer's random seed")->default_val(1);
  return [cmd, opt]() -> int {
    if (!cmd->parsed()) return -1;
    if (opt->out_dir.empty()) opt->out_dir = default_translation_corpus_dir(opt->vocab);
    const CorpusSummary s = build_translation_corpus(*opt);
    std::printf("remat corpus: %s\n%s\n", opt->out_dir.c_str(), s.describe().c_str());
    return 0;
  };
}

Runner add_translate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "translate", "Translate with a trained encoder-decoder run (greedy or beam search); BLEU on a split");
  auto opt = std::make_shared<TranslateOptions>();
  cmd->add_option("run", opt->run, "A translation run folder (the --out of `remat train`)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--split", opt->split, "The corpus split to translate and score")
      ->default_val("test")
      ->check(CLI::IsMember({"train", "valid", "test"}));
  cmd->add_option("--input", opt->input, "Translate this file's lines instead (- : standard input); no score");
  cmd->add_option("--output", opt->output, "Write the translations here, one a line (default: print them)");
  cmd->add_option("--device", opt->device, "cpu, cuda, cuda:N, cuda-emu or auto (cuda:0 when a GPU is present)")
      ->default_val("auto");
  cmd->add_option("--batch", opt->batch, "Sentences a batch (default: the run's training.batch)")->check(positive());
  cmd->add_option("--max", opt->max_sentences, "Translate at most this many sentences (default: all)")
      ->check(non_negative("0 (all) or more"));
  cmd->add_option("--beam", opt->beam, "Beam search with this many hypotheses a source (default 1: greedy)")
      ->check(positive());
  cmd->add_option("--length-penalty", opt->length_penalty,
                  "Beam search: a hypothesis's log-probability is divided by its length to this power")
      ->default_val(1.0)
      ->check(CLI::Range(0.0, 10.0));
  cmd->add_flag("--no-kv-cache", opt->no_kv_cache,
                "Run the whole model at every position instead of the decoder on one position with a key/value "
                "cache (the same translations, slower; for comparison)");
  cmd->add_flag("--quiet", opt->quiet, "Only the translations (and the score)");
  return [cmd, opt]() -> int {
    if (!cmd->parsed()) return -1;
    const TranslateResult r = translate(*opt);
    if (opt->output.empty())
      for (size_t i = 0; i < r.hypotheses.size(); ++i) std::printf("%s\n", r.hypotheses[i].c_str());
    if (r.too_long > 0)
      std::fprintf(stderr, "%lld sources were longer than the model's source length and were cut\n",
                   static_cast<long long>(r.too_long));
    if (r.bleu) {
      std::fprintf(stderr, "%s | %.1f s\n", r.bleu->describe().c_str(), r.seconds);
      std::fprintf(stderr, "copy-the-source baseline: %s\n", r.copy_bleu->describe().c_str());
    }
    return 0;
  };
}

}  // namespace remat::cli
