// What differs between the Hugging Face architectures remat reads and writes (interop.h):
// each one's name table, how its files are recognised, the facts of a remat config it
// checks a config.json against, and the config.json its export writes. hf_gpt2.cpp and
// hf_llama.cpp define one Arch each; interop.cpp loads and exports through them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "remat/config.h"
#include "remat/graph.h"
#include "remat/interop.h"

namespace remat::hf {

// `name` against a pattern with at most one "{}" (a block index: digits, no leading zero).
bool match_pattern(const std::string& pattern, const std::string& name, int64_t* index);
std::string fill_pattern(const std::string& pattern, int64_t index);

// Every layer object of `type` in a model's layers (inside repeat blocks too); where > 0:
// only those in blocks, < 0: only those outside.
std::vector<const nlohmann::json*> layers_of(const nlohmann::json& model, const std::string& type, int where = 0);
// The one value of `key` the layers of `type` share (`def` where a layer leaves it out);
// false when there is no such layer. Different values are an error naming `source` and
// `arch` (e.g. "a GPT-2 has one").
bool shared_value(const nlohmann::json& model, const std::string& type, const std::string& key,
                  const nlohmann::json& def, const std::string& source, const char* arch, nlohmann::json* value,
                  int where = 0);

// Parses config.json (errors name the file); a JSON type error inside `check` becomes an
// error naming the file too.
nlohmann::json read_config_json(const std::string& path);

// What the export needs of the checkpoint besides the config.
struct ExportShapes {
  std::vector<std::string> params;  // the graph's parameter names
  bool tied = true;                 // no parameter head.weight of its own
  int64_t n_blocks = 0;
  Shape embed;          // the token embedding [vocab, width]
  int64_t seq_len = 0;  // the model's token input
  // The first block's MLP width (GPT-2's fc, Llama's gate), its qkv's rows, and GPT-2's
  // position table's length.
  int64_t inner = 0, qkv_rows = 0, positions = 0;
};

// The number of blocks of a graph: 1 + the largest i of its parameters h{i}.*.
int64_t block_count(const Graph& g);

struct Arch {
  HfArch id;
  const char* format;       // "hf-gpt2": InitFromReport::format and `remat export --format`
  const char* title;        // "Hugging Face GPT-2"
  const char* prefix;       // what save_pretrained puts before the table's names ("transformer."), or ""
  const char* embed;        // the token embedding's name in the files (a tied head must equal it)
  const char* head;         // the head's name in the files (never prefixed)
  const char* layer_names;  // the remat layer names a config of this architecture uses, for errors
  const std::vector<HfTensorName>& names;
  // Whether a file tensor (name without prefix) is a buffer the loader skips.
  bool (*is_buffer)(const std::string& name);
  // Whether a file tensor (name without prefix) is one only this architecture has.
  bool (*recognises)(const std::string& name);
  // Checks config.json (parsed) against cfg: what shapes cannot show. Throws naming `path`.
  void (*check_config)(const nlohmann::json& j, const std::string& path, const Config& cfg, const Graph& g,
                       int64_t n_blocks);
  // Row counts of the parts of a stacked parameter (Llama's qkv: q, k, v) of `rows` rows.
  std::vector<int64_t> (*part_rows)(const Config& cfg, const std::string& remat_name, int64_t rows);
  // config.json of the export; throws naming cfg.source when the model is not of this
  // architecture in ways the names do not show.
  nlohmann::json (*export_config)(const Config& cfg, const ExportShapes& x);
};

const Arch& gpt2_arch();
const Arch& llama_arch();
const Arch& arch(HfArch id);

}  // namespace remat::hf
