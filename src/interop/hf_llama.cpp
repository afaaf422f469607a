// Hugging Face Llama (hf_arch.h): LlamaForCausalLM's names against the layers of
// models/llama_tiny.json, the facts of such a config (heads, key/value heads, RoPE's theta,
// RMSNorm's eps), the checks of a config.json against them, and the config.json of an
// export.
//
// Hugging Face keeps q_proj, k_proj and v_proj apart ([heads·d, C], [kv_heads·d, C] twice);
// remat's qkv is one linear whose output rows are q's, then k's, then v's heads, which is
// what its rope and attention layers read. Both rotate in the halves form (the pair (i,
// i + d/2) of a head), so the weights need no permutation.
#include <cmath>
#include <string>

#include "interop/hf_arch.h"
#include "remat/error.h"
#include "remat/rope.h"

namespace remat::hf {

namespace {

const std::vector<HfTensorName>& llama_names() {
  static const std::vector<HfTensorName> table = {
      {"embed.weight", {"model.embed_tokens.weight"}, false},
      {"h{}.attn_norm.weight", {"model.layers.{}.input_layernorm.weight"}, false},
      {"h{}.qkv.weight",
       {"model.layers.{}.self_attn.q_proj.weight", "model.layers.{}.self_attn.k_proj.weight",
        "model.layers.{}.self_attn.v_proj.weight"},
       false},
      {"h{}.qkv.bias",
       {"model.layers.{}.self_attn.q_proj.bias", "model.layers.{}.self_attn.k_proj.bias",
        "model.layers.{}.self_attn.v_proj.bias"},
       false},
      {"h{}.o_proj.weight", {"model.layers.{}.self_attn.o_proj.weight"}, false},
      {"h{}.o_proj.bias", {"model.layers.{}.self_attn.o_proj.bias"}, false},
      {"h{}.mlp_norm.weight", {"model.layers.{}.post_attention_layernorm.weight"}, false},
      {"h{}.gate.weight", {"model.layers.{}.mlp.gate_proj.weight"}, false},
      {"h{}.gate.bias", {"model.layers.{}.mlp.gate_proj.bias"}, false},
      {"h{}.up.weight", {"model.layers.{}.mlp.up_proj.weight"}, false},
      {"h{}.up.bias", {"model.layers.{}.mlp.up_proj.bias"}, false},
      {"h{}.down.weight", {"model.layers.{}.mlp.down_proj.weight"}, false},
      {"h{}.down.bias", {"model.layers.{}.mlp.down_proj.bias"}, false},
      {"norm_f.weight", {"model.norm.weight"}, false},
      // An untied head only (a tied one shares embed.weight; the file then has no lm_head).
      {"head.weight", {"lm_head.weight"}, false},
  };
  return table;
}

bool llama_buffer(const std::string& n) {
  int64_t i = -1;
  return match_pattern("model.layers.{}.self_attn.rotary_emb.inv_freq", n, &i);
}

bool llama_recognises(const std::string& n) {
  int64_t i = -1;
  return n == "model.embed_tokens.weight" || match_pattern("model.layers.{}.input_layernorm.weight", n, &i) ||
         match_pattern("model.layers.{}.self_attn.q_proj.weight", n, &i);
}

constexpr const char* kArch = "a Llama has one";

// A rope layer's "scaling" object (validated when the graph was built).
RopeScaling remat_scaling(const nlohmann::json& j) {
  RopeScaling s;
  const std::string type = j.value("type", "none");
  s.type = type == "linear"   ? RopeScalingType::linear
           : type == "llama3" ? RopeScalingType::llama3
                              : RopeScalingType::none;
  s.factor = j.value("factor", s.factor);
  s.low_freq_factor = j.value("low_freq_factor", s.low_freq_factor);
  s.high_freq_factor = j.value("high_freq_factor", s.high_freq_factor);
  s.original_max_position = j.value("original_max_position", s.original_max_position);
  return s;
}

const char* scaling_name(RopeScalingType t) {
  return t == RopeScalingType::linear ? "linear" : t == RopeScalingType::llama3 ? "llama3" : "none";
}

// Hugging Face's rope_scaling (null, or an object with "rope_type" or the older "type"):
// false for a kind remat's rope does not compute (dynamic, yarn, longrope, ...).
bool hf_scaling(const nlohmann::json& j, RopeScaling* s) {
  *s = RopeScaling{};
  if (j.is_null()) return true;
  if (!j.is_object()) return false;
  const nlohmann::json type = j.contains("rope_type") ? j["rope_type"] : j.value("type", nlohmann::json("default"));
  if (type == "default") return true;
  if (type == "linear") {
    s->type = RopeScalingType::linear;
  } else if (type == "llama3") {
    s->type = RopeScalingType::llama3;
    s->low_freq_factor = j.value("low_freq_factor", s->low_freq_factor);
    s->high_freq_factor = j.value("high_freq_factor", s->high_freq_factor);
    s->original_max_position = j.value("original_max_position_embeddings", s->original_max_position);
  } else {
    return false;
  }
  s->factor = j.value("factor", s->factor);
  return true;
}

bool same_scaling(const RopeScaling& a, const RopeScaling& b) {
  auto eq = [](double x, double y) { return static_cast<float>(x) == static_cast<float>(y); };
  if (a.type != b.type) return false;
  if (a.type == RopeScalingType::none) return true;
  if (!eq(a.factor, b.factor)) return false;
  return a.type != RopeScalingType::llama3 ||
         (eq(a.low_freq_factor, b.low_freq_factor) && eq(a.high_freq_factor, b.high_freq_factor) &&
          eq(a.original_max_position, b.original_max_position));
}

std::string describe(const RopeScaling& s) {
  if (s.type == RopeScalingType::none) return "none";
  std::string out = std::string(scaling_name(s.type)) + ", factor " + nlohmann::json(s.factor).dump();
  if (s.type == RopeScalingType::llama3)
    out += ", low_freq_factor " + nlohmann::json(s.low_freq_factor).dump() + ", high_freq_factor " +
           nlohmann::json(s.high_freq_factor).dump() + ", original_max_position " +
           nlohmann::json(s.original_max_position).dump();
  return out;
}

struct ModelFacts {
  RopeScaling scaling;
  int64_t heads = 0, kv_heads = 0;
  int64_t rope_heads = 0, rope_kv_heads = 0;  // 0: no rope layer
  double theta = 10000.0, rms_eps = 1e-6, attn_dropout = 0.0;
  bool causal = true, silu = false;
};

ModelFacts model_facts(const Config& cfg) {
  ModelFacts m;
  nlohmann::json v;
  const std::string& s = cfg.source;
  if (shared_value(cfg.model, "attention", "heads", 1, s, kArch, &v) && v.is_number_integer())
    m.heads = v.get<int64_t>();
  m.kv_heads = m.heads;
  if (shared_value(cfg.model, "attention", "kv_heads", m.heads, s, kArch, &v) && v.is_number_integer())
    m.kv_heads = v.get<int64_t>();
  if (shared_value(cfg.model, "attention", "dropout", 0.0, s, kArch, &v) && v.is_number())
    m.attn_dropout = v.get<double>();
  if (shared_value(cfg.model, "attention", "causal", true, s, kArch, &v) && v.is_boolean()) m.causal = v.get<bool>();
  if (shared_value(cfg.model, "rope", "heads", 1, s, kArch, &v) && v.is_number_integer()) {
    m.rope_heads = v.get<int64_t>();
    m.rope_kv_heads = m.rope_heads;
    if (shared_value(cfg.model, "rope", "kv_heads", m.rope_heads, s, kArch, &v) && v.is_number_integer())
      m.rope_kv_heads = v.get<int64_t>();
    if (shared_value(cfg.model, "rope", "theta", 10000.0, s, kArch, &v) && v.is_number()) m.theta = v.get<double>();
    if (shared_value(cfg.model, "rope", "scaling", nullptr, s, kArch, &v) && v.is_object())
      m.scaling = remat_scaling(v);
  }
  if (shared_value(cfg.model, "rmsnorm", "eps", 1e-6, s, kArch, &v) && v.is_number()) m.rms_eps = v.get<double>();
  m.silu = !layers_of(cfg.model, "silu", 1).empty();
  return m;
}

// The config is a Llama in what the names cannot show: RoPE on q and k of the attention's
// heads, causal attention, SiLU in the MLP.
void require_llama(const ModelFacts& m, const Config& cfg) {
  if (m.rope_heads == 0)
    REMAT_THROW(cfg.source, ": no rope layer in the blocks; a Llama's q and k turn by rotary embeddings");
  if (m.rope_heads != m.heads || m.rope_kv_heads != m.kv_heads)
    REMAT_THROW(cfg.source, ": the rope layers have heads ", m.rope_heads, ", kv_heads ", m.rope_kv_heads,
                " but the attention layers ", m.heads, " and ", m.kv_heads, "; a Llama's are the same");
  if (!m.causal) REMAT_THROW(cfg.source, ": the attention layers are not causal; a Llama's are");
  if (!m.silu) REMAT_THROW(cfg.source, ": no silu layer in the blocks; a Llama's MLP is SwiGLU (hidden_act silu)");
}

bool same_float(double a, double b) { return static_cast<float>(a) == static_cast<float>(b); }

void check_llama_config(const nlohmann::json& j, const std::string& path, const Config& cfg, const Graph& g,
                        int64_t n_blocks) {
  const ModelFacts m = model_facts(cfg);
  auto fail = [&](const std::string& key, const std::string& msg) -> void {
    REMAT_THROW(path, ": ", key, " is ", j[key].dump(), ", ", msg, " (", cfg.source, ")");
  };
  if (j.contains("model_type") && j["model_type"] != "llama") fail("model_type", "not llama");
  require_llama(m, cfg);
  if (j.contains("num_hidden_layers") && j["num_hidden_layers"] != n_blocks)
    fail("num_hidden_layers", "the config has " + std::to_string(n_blocks) + " blocks");
  if (j.contains("num_attention_heads") && j["num_attention_heads"] != m.heads)
    fail("num_attention_heads", "the config's attention layers have " + std::to_string(m.heads) + " heads");
  const nlohmann::json kv = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                                ? j["num_key_value_heads"]
                                : j.value("num_attention_heads", nlohmann::json(m.heads));
  if (kv != m.kv_heads)
    REMAT_THROW(path, ": num_key_value_heads is ", kv.dump(), ", the config's attention layers have kv_heads ",
                m.kv_heads, " (", cfg.source, ")");
  if (j.contains("hidden_act") && j["hidden_act"] != "silu") fail("hidden_act", "remat's Llama MLP is SiLU-gated");
  if (j.contains("rms_norm_eps") && (!j["rms_norm_eps"].is_number() || !same_float(j["rms_norm_eps"], m.rms_eps)))
    fail("rms_norm_eps", "the config's rmsnorm eps is " + nlohmann::json(m.rms_eps).dump());
  const double theta =
      j.contains("rope_theta") && j["rope_theta"].is_number() ? j["rope_theta"].get<double>() : 10000.0;
  if (std::abs(theta - m.theta) > 1e-9 * m.theta)
    REMAT_THROW(path, ": rope_theta is ", nlohmann::json(theta).dump(), ", the config's rope theta is ",
                nlohmann::json(m.theta).dump(), " (", cfg.source, ")");
  if (j.contains("rope_scaling")) {
    RopeScaling hs;
    if (!hf_scaling(j["rope_scaling"], &hs))
      fail("rope_scaling", "a kind remat's rope does not compute (it has linear and llama3)");
    if (!same_scaling(hs, m.scaling))
      fail("rope_scaling", "the config's rope scaling is " + describe(m.scaling) + " (the rope layers' \"scaling\")");
  } else if (m.scaling.type != RopeScalingType::none) {
    REMAT_THROW(path, ": no rope_scaling, but the config's rope scaling is ", describe(m.scaling), " (", cfg.source,
                ")");
  }
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    for (const GraphParam& p : g.params)
      if (p.name == "h0.qkv.weight" && j["head_dim"] != p.spec.shape[0] / (m.heads + 2 * m.kv_heads))
        fail("head_dim", "the config's heads are " + std::to_string(p.spec.shape[0] / (m.heads + 2 * m.kv_heads)) +
                             " wide (qkv's rows over heads + 2 kv_heads)");
  }
}

std::vector<int64_t> llama_part_rows(const Config& cfg, const std::string& remat_name, int64_t rows) {
  int64_t i = -1;
  if (!match_pattern("h{}.qkv.weight", remat_name, &i) && !match_pattern("h{}.qkv.bias", remat_name, &i)) return {rows};
  const ModelFacts m = model_facts(cfg);
  const int64_t heads = m.heads + 2 * m.kv_heads;
  if (m.heads <= 0 || rows % heads != 0)
    REMAT_THROW(cfg.source, ": ", remat_name, " has ", rows, " rows, not a whole number of heads (", m.heads,
                " query and 2 x ", m.kv_heads, " key/value heads)");
  const int64_t d = rows / heads;
  return {m.heads * d, m.kv_heads * d, m.kv_heads * d};
}

bool has_param(const ExportShapes& x, const std::string& name) {
  for (const std::string& n : x.params)
    if (n == name) return true;
  return false;
}

nlohmann::json llama_export_config(const Config& cfg, const ExportShapes& x) {
  const ModelFacts m = model_facts(cfg);
  require_llama(m, cfg);
  REMAT_CHECK(x.n_blocks > 0 && x.inner > 0 && x.qkv_rows > 0, cfg.source,
              ": not a Llama (blocks h0.. with qkv and gate linears)");
  const bool qkv_bias = has_param(x, "h0.qkv.bias"), o_bias = has_param(x, "h0.o_proj.bias");
  if (qkv_bias != o_bias)
    REMAT_THROW(cfg.source, ": qkv ", qkv_bias ? "has" : "has no", " bias but o_proj ", o_bias ? "has" : "has none",
                "; Hugging Face's attention_bias covers all four projections");
  const int mlp_biases = has_param(x, "h0.gate.bias") + has_param(x, "h0.up.bias") + has_param(x, "h0.down.bias");
  if (mlp_biases != 0 && mlp_biases != 3)
    REMAT_THROW(cfg.source, ": ", mlp_biases,
                " of gate, up and down have a bias; Hugging Face's mlp_bias covers all "
                "three (give all or none a bias)");
  const bool mlp_bias = mlp_biases == 3;
  const int64_t head_dim = x.qkv_rows / (m.heads + 2 * m.kv_heads);
  nlohmann::json c = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", x.embed[0]},
      {"hidden_size", x.embed[1]},
      {"intermediate_size", x.inner},
      {"num_hidden_layers", x.n_blocks},
      {"num_attention_heads", m.heads},
      {"num_key_value_heads", m.kv_heads},
      {"head_dim", head_dim},
      {"hidden_act", "silu"},
      {"max_position_embeddings", x.seq_len},
      {"rms_norm_eps", m.rms_eps},
      {"rope_theta", m.theta},
      {"rope_scaling", nullptr},  // set below when scaled
      {"attention_bias", qkv_bias},
      {"attention_dropout", m.attn_dropout},
      {"initializer_range", 0.02},
      {"tie_word_embeddings", x.tied},
      {"use_cache", true},
  };
  if (mlp_bias) c["mlp_bias"] = true;  // transformers >= 4.41 reads it
  if (m.scaling.type == RopeScalingType::linear) {
    c["rope_scaling"] = {{"type", "linear"}, {"factor", m.scaling.factor}};  // the form every version reads
  } else if (m.scaling.type == RopeScalingType::llama3) {
    c["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", m.scaling.factor},
                         {"low_freq_factor", m.scaling.low_freq_factor},
                         {"high_freq_factor", m.scaling.high_freq_factor},
                         {"original_max_position_embeddings", static_cast<int64_t>(m.scaling.original_max_position)}};
  }
  return c;
}

}  // namespace

const Arch& llama_arch() {
  static const Arch a{HfArch::llama,
                      "hf-llama",
                      "Hugging Face Llama",
                      "",
                      "model.embed_tokens.weight",
                      "lm_head.weight",
                      "the layer names of models/llama_tiny.json: embed, h{i}.attn_norm, h{i}.qkv, h{i}.o_proj, "
                      "h{i}.mlp_norm, h{i}.gate, h{i}.up, h{i}.down, norm_f, head",
                      llama_names(),
                      llama_buffer,
                      llama_recognises,
                      check_llama_config,
                      llama_part_rows,
                      llama_export_config};
  return a;
}

}  // namespace remat::hf
