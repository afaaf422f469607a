// Hugging Face GPT-2 (hf_arch.h): the name table, the facts of a remat GPT-2 config, the
// checks of a config.json against them, and the config.json of an export.
#include <string>

#include "interop/hf_arch.h"
#include "remat/error.h"

namespace remat::hf {

namespace {

const std::vector<HfTensorName>& gpt2_names() {
  static const std::vector<HfTensorName> table = {
      {"embed.weight", {"wte.weight"}, false},
      {"embed.pos_weight", {"wpe.weight"}, false},
      {"h{}.ln1.weight", {"h.{}.ln_1.weight"}, false},
      {"h{}.ln1.bias", {"h.{}.ln_1.bias"}, false},
      {"h{}.qkv.weight", {"h.{}.attn.c_attn.weight"}, true},
      {"h{}.qkv.bias", {"h.{}.attn.c_attn.bias"}, false},
      {"h{}.proj.weight", {"h.{}.attn.c_proj.weight"}, true},
      {"h{}.proj.bias", {"h.{}.attn.c_proj.bias"}, false},
      {"h{}.ln2.weight", {"h.{}.ln_2.weight"}, false},
      {"h{}.ln2.bias", {"h.{}.ln_2.bias"}, false},
      {"h{}.fc.weight", {"h.{}.mlp.c_fc.weight"}, true},
      {"h{}.fc.bias", {"h.{}.mlp.c_fc.bias"}, false},
      {"h{}.fc2.weight", {"h.{}.mlp.c_proj.weight"}, true},
      {"h{}.fc2.bias", {"h.{}.mlp.c_proj.bias"}, false},
      {"ln_f.weight", {"ln_f.weight"}, false},
      {"ln_f.bias", {"ln_f.bias"}, false},
      // Only a model whose head has its own weight has a parameter head.weight; a tied
      // head shares embed.weight (Hugging Face leaves lm_head.weight out of such files).
      {"head.weight", {"lm_head.weight"}, false},
  };
  return table;
}

bool gpt2_buffer(const std::string& n) {
  int64_t i = -1;
  return match_pattern("h.{}.attn.bias", n, &i) || match_pattern("h.{}.attn.masked_bias", n, &i);
}

bool gpt2_recognises(const std::string& n) {
  int64_t i = -1;
  return n == "wte.weight" || match_pattern("h.{}.ln_1.weight", n, &i) ||
         match_pattern("h.{}.attn.c_attn.weight", n, &i);
}

constexpr const char* kArch = "a GPT-2 has one";

struct ModelFacts {
  std::string activation;  // Hugging Face's name: gelu_new (tanh) or gelu (erf)
  double ln_eps = 1e-5;
  int64_t heads = 0;
  double embd_pdrop = 0, attn_pdrop = 0, resid_pdrop = 0;
  bool causal = true;
};

ModelFacts model_facts(const Config& cfg) {
  ModelFacts m;
  nlohmann::json v;
  if (shared_value(cfg.model, "gelu", "approximate", "none", cfg.source, kArch, &v))
    m.activation = v == "tanh" ? "gelu_new" : "gelu";
  if (shared_value(cfg.model, "layernorm", "eps", 1e-5, cfg.source, kArch, &v) && v.is_number())
    m.ln_eps = v.get<double>();
  if (shared_value(cfg.model, "attention", "heads", 1, cfg.source, kArch, &v) && v.is_number_integer())
    m.heads = v.get<int64_t>();
  if (shared_value(cfg.model, "attention", "dropout", 0.0, cfg.source, kArch, &v) && v.is_number())
    m.attn_pdrop = v.get<double>();
  if (shared_value(cfg.model, "attention", "causal", true, cfg.source, kArch, &v) && v.is_boolean())
    m.causal = v.get<bool>();
  auto first_p = [&](int where) {
    const auto ls = layers_of(cfg.model, "dropout", where);
    if (ls.empty()) return 0.0;
    const nlohmann::json p = ls.front()->contains("p") ? (*ls.front())["p"] : nlohmann::json(0.5);
    return p.is_number() ? p.get<double>() : 0.0;
  };
  m.embd_pdrop = first_p(-1);
  m.resid_pdrop = first_p(1);
  return m;
}

void check_gpt2_config(const nlohmann::json& j, const std::string& path, const Config& cfg, const Graph&,
                       int64_t n_blocks) {
  const ModelFacts m = model_facts(cfg);
  auto fail = [&](const std::string& key, const std::string& msg) -> void {
    REMAT_THROW(path, ": ", key, " is ", j[key].dump(), ", ", msg, " (", cfg.source, ")");
  };
  if (j.contains("model_type") && j["model_type"] != "gpt2") fail("model_type", "not gpt2");
  if (j.contains("n_layer") && j["n_layer"] != n_blocks)
    fail("n_layer", "the config has " + std::to_string(n_blocks) + " blocks");
  if (j.contains("n_head") && m.heads > 0 && j["n_head"] != m.heads)
    fail("n_head", "the config's attention layers have " + std::to_string(m.heads) + " heads");
  if (j.contains("activation_function") && !m.activation.empty()) {
    std::string a = j["activation_function"].is_string() ? j["activation_function"].get<std::string>() : "?";
    if (a == "gelu_pytorch_tanh") a = "gelu_new";  // the same function
    if (a != m.activation)
      fail("activation_function", "the config's gelu layers compute " + m.activation +
                                      (m.activation == "gelu_new" ? " (approximate: tanh)" : " (approximate: none)"));
  }
  if (j.contains("layer_norm_epsilon")) {
    const auto& e = j["layer_norm_epsilon"];
    if (!e.is_number() || static_cast<float>(e.get<double>()) != static_cast<float>(m.ln_eps))
      fail("layer_norm_epsilon", "the config's layernorm eps is " + nlohmann::json(m.ln_eps).dump());
  }
  if (j.value("scale_attn_weights", true) != true)
    fail("scale_attn_weights", "remat's attention scales by 1/sqrt(head size)");
  if (j.value("scale_attn_by_inverse_layer_idx", false) != false)
    fail("scale_attn_by_inverse_layer_idx", "remat's attention does not scale by layer");
  if (!m.causal) REMAT_THROW(cfg.source, ": the attention layers are not causal; GPT-2's are");
}

std::vector<int64_t> gpt2_part_rows(const Config&, const std::string&, int64_t rows) { return {rows}; }

nlohmann::json gpt2_export_config(const Config& cfg, const ExportShapes& x) {
  const ModelFacts m = model_facts(cfg);
  REMAT_CHECK(x.n_blocks > 0 && x.positions > 0, cfg.source,
              ": not a GPT-2 (blocks h0.., a position table embed.pos_weight)");
  REMAT_CHECK(!m.activation.empty() && m.heads > 0 && m.causal, cfg.source,
              ": not a GPT-2 (its blocks need gelu, causal attention with integer heads)");
  nlohmann::json c = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", x.embed[0]},
      {"n_positions", x.positions},
      {"n_embd", x.embed[1]},
      {"n_layer", x.n_blocks},
      {"n_head", m.heads},
      {"n_inner", x.inner == 4 * x.embed[1] ? nlohmann::json(nullptr) : nlohmann::json(x.inner)},
      {"activation_function", m.activation},
      {"layer_norm_epsilon", m.ln_eps},
      {"embd_pdrop", m.embd_pdrop},
      {"attn_pdrop", m.attn_pdrop},
      {"resid_pdrop", m.resid_pdrop},
      {"initializer_range", 0.02},
      {"scale_attn_weights", true},
      {"scale_attn_by_inverse_layer_idx", false},
      {"reorder_and_upcast_attn", false},
      {"tie_word_embeddings", x.tied},
      {"use_cache", true},
  };
  if (x.embed[0] == kGpt2Vocab) {  // GPT-2's tokenizer: <|endoftext|>
    c["bos_token_id"] = 50256;
    c["eos_token_id"] = 50256;
  }
  return c;
}

}  // namespace

const Arch& gpt2_arch() {
  static const Arch a{HfArch::gpt2,
                      "hf-gpt2",
                      "Hugging Face GPT-2",
                      "transformer.",
                      "wte.weight",
                      "lm_head.weight",
                      "the layer names of models/gpt2_124m.json: embed, h{i}.ln1, h{i}.qkv, h{i}.proj, h{i}.ln2, "
                      "h{i}.fc, h{i}.fc2, ln_f, head",
                      gpt2_names(),
                      gpt2_buffer,
                      gpt2_recognises,
                      check_gpt2_config,
                      gpt2_part_rows,
                      gpt2_export_config};
  return a;
}

}  // namespace remat::hf
