// Hugging Face GPT-2 checkpoints in and out (interop.h): the name table, the config
// checks, loading with a single copy per tensor, and the export.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "remat/bf16.h"
#include "remat/error.h"
#include "remat/interop.h"
#include "remat/io.h"

namespace remat {

namespace fs = std::filesystem;

const std::vector<Gpt2TensorName>& hf_gpt2_tensor_names() {
  static const std::vector<Gpt2TensorName> table = {
      {"embed.weight", "wte.weight", false},
      {"embed.pos_weight", "wpe.weight", false},
      {"h{}.ln1.weight", "h.{}.ln_1.weight", false},
      {"h{}.ln1.bias", "h.{}.ln_1.bias", false},
      {"h{}.qkv.weight", "h.{}.attn.c_attn.weight", true},
      {"h{}.qkv.bias", "h.{}.attn.c_attn.bias", false},
      {"h{}.proj.weight", "h.{}.attn.c_proj.weight", true},
      {"h{}.proj.bias", "h.{}.attn.c_proj.bias", false},
      {"h{}.ln2.weight", "h.{}.ln_2.weight", false},
      {"h{}.ln2.bias", "h.{}.ln_2.bias", false},
      {"h{}.fc.weight", "h.{}.mlp.c_fc.weight", true},
      {"h{}.fc.bias", "h.{}.mlp.c_fc.bias", false},
      {"h{}.fc2.weight", "h.{}.mlp.c_proj.weight", true},
      {"h{}.fc2.bias", "h.{}.mlp.c_proj.bias", false},
      {"ln_f.weight", "ln_f.weight", false},
      {"ln_f.bias", "ln_f.bias", false},
      // Only a model whose head has its own weight has a parameter head.weight; a tied
      // head shares embed.weight (Hugging Face leaves lm_head.weight out of such files).
      {"head.weight", "lm_head.weight", false},
  };
  return table;
}

namespace {

constexpr const char* kHfPrefix = "transformer.";
constexpr const char* kHfHead = "lm_head.weight";

// `name` against a pattern with at most one "{}" (a block index: digits, no leading zero).
bool match_pattern(const std::string& pattern, const std::string& name, int64_t* index) {
  const size_t at = pattern.find("{}");
  if (at == std::string::npos) return name == pattern;
  const std::string pre = pattern.substr(0, at), post = pattern.substr(at + 2);
  if (name.size() <= pre.size() + post.size() || name.compare(0, pre.size(), pre) != 0 ||
      name.compare(name.size() - post.size(), post.size(), post) != 0)
    return false;
  const std::string digits = name.substr(pre.size(), name.size() - pre.size() - post.size());
  if (digits.size() > 9 || (digits.size() > 1 && digits[0] == '0')) return false;
  for (char c : digits)
    if (c < '0' || c > '9') return false;
  *index = std::stoll(digits);
  return true;
}

std::string fill_pattern(const std::string& pattern, int64_t index) {
  const size_t at = pattern.find("{}");
  if (at == std::string::npos) return pattern;
  return pattern.substr(0, at) + std::to_string(index) + pattern.substr(at + 2);
}

// The Hugging Face name of a remat parameter; false when the table has none.
bool hf_name_of(const std::string& remat_name, std::string* hf, bool* conv1d) {
  for (const Gpt2TensorName& row : hf_gpt2_tensor_names()) {
    int64_t i = -1;
    if (match_pattern(row.remat, remat_name, &i)) {
      *hf = fill_pattern(row.hf, i);
      *conv1d = row.conv1d;
      return true;
    }
  }
  return false;
}

// A Hugging Face tensor name without save_pretrained's "transformer." prefix.
std::string canonical_hf(const std::string& name) {
  const std::string p = kHfPrefix;
  return name.compare(0, p.size(), p) == 0 ? name.substr(p.size()) : name;
}

Shape transposed(const Shape& s) { return Shape{s[1], s[0]}; }

// ---- element copies --------------------------------------------------------------------------

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf, NaN
  } else if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        man <<= 1;
        ++e;
      } while ((man & 0x400u) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

template <DType D>
inline float load(const unsigned char* p) {
  if constexpr (D == DType::f32) {
    float f;
    std::memcpy(&f, p, sizeof f);
    return f;
  } else if constexpr (D == DType::bf16) {
    return bf16_to_float(static_cast<uint16_t>(p[0] | (p[1] << 8)));
  } else {
    return f16_to_f32(static_cast<uint16_t>(p[0] | (p[1] << 8)));
  }
}

// The file is copied in pieces of about this many bytes, each released from the mapping
// once copied: resident memory grows by one piece beyond the destination.
constexpr size_t kPieceBytes = size_t{4} << 20;

template <DType D>
void copy_entry(const SafetensorsFile& f, const SafetensorsEntry& e, bool transpose, float* dst) {
  constexpr size_t es = D == DType::f32 ? 4 : 2;
  const unsigned char* src = f.data(e);
  const int64_t numel = e.shape.numel();
  if (!transpose) {
    const auto per = static_cast<int64_t>(kPieceBytes / es);
    for (int64_t i = 0; i < numel; i += per) {
      const int64_t n = std::min(per, numel - i);
      if constexpr (D == DType::f32) {
        std::memcpy(dst + i, src + i * 4, static_cast<size_t>(n) * 4);
      } else {
        for (int64_t k = 0; k < n; ++k) dst[i + k] = load<D>(src + (i + k) * es);
      }
      f.release(e, static_cast<size_t>(i) * es, static_cast<size_t>(i + n) * es);
    }
    return;
  }
  // [rows = in, cols = out] -> dst [cols, rows], a band of source rows at a time, in
  // 32 x 32 tiles so that reads and writes both stay in cache.
  const int64_t rows = e.shape[0], cols = e.shape[1];
  if (rows == 0 || cols == 0) return;
  const int64_t band = std::max<int64_t>(1, static_cast<int64_t>(kPieceBytes / es) / cols);
  constexpr int64_t kTile = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += band) {
    const int64_t r1 = std::min(rows, r0 + band);
    for (int64_t rt = r0; rt < r1; rt += kTile)
      for (int64_t ct = 0; ct < cols; ct += kTile) {
        const int64_t re = std::min(r1, rt + kTile), ce = std::min(cols, ct + kTile);
        for (int64_t r = rt; r < re; ++r)
          for (int64_t c = ct; c < ce; ++c) dst[c * rows + r] = load<D>(src + (r * cols + c) * es);
      }
    f.release(e, static_cast<size_t>(r0 * cols) * es, static_cast<size_t>(r1 * cols) * es);
  }
}

void copy_entry(const SafetensorsFile& f, const SafetensorsEntry& e, bool transpose, float* dst) {
  switch (e.dtype) {
    case DType::f32: return copy_entry<DType::f32>(f, e, transpose, dst);
    case DType::bf16: return copy_entry<DType::bf16>(f, e, transpose, dst);
    case DType::f16: return copy_entry<DType::f16>(f, e, transpose, dst);
    case DType::i32:
    case DType::u8: break;
  }
  REMAT_THROW(f.source(), ": tensor \"", e.name, "\" is ", dtype_name(e.dtype), "; weights must be F32, F16 or BF16");
}

// Copies `e` into parameter `t` (any device), transposing a Conv1D weight.
void load_param(const SafetensorsFile& f, const SafetensorsEntry& e, bool transpose, Tensor& t) {
  if (t.device().is_cpu()) {
    copy_entry(f, e, transpose, t.f32());
    return;
  }
  Tensor host = Tensor::empty(t.shape(), Device::cpu(), DType::f32,
                              AllocTag{MemoryCategory::temporary, "init_from", Phase::setup});
  copy_entry(f, e, transpose, host.f32());
  t.copy_from(host);
}

// ---- the model config --------------------------------------------------------------------------

// Every layer object of `type` in a model's layers (inside repeat blocks too).
void collect_layers(const nlohmann::json& layers, const std::string& type, bool in_block,
                    std::vector<std::pair<const nlohmann::json*, bool>>& out) {
  if (!layers.is_array()) return;
  for (const auto& l : layers) {
    if (!l.is_object()) continue;
    const std::string t = l.value("type", "");
    if (t == "repeat" && l.contains("layers"))
      collect_layers(l["layers"], type, true, out);
    else if (t == type)
      out.emplace_back(&l, in_block);
  }
}

std::vector<const nlohmann::json*> layers_of(const nlohmann::json& model, const std::string& type, int where = 0) {
  std::vector<std::pair<const nlohmann::json*, bool>> all;
  if (model.contains("layers")) collect_layers(model["layers"], type, false, all);
  std::vector<const nlohmann::json*> out;
  for (const auto& [l, in_block] : all)
    if (where == 0 || (where > 0) == in_block) out.push_back(l);
  return out;
}

// The one value of `key` the layers of `type` share (`def` where a layer leaves it out);
// false when there is no such layer. Different values are an error naming `source`.
bool shared_value(const nlohmann::json& model, const std::string& type, const std::string& key,
                  const nlohmann::json& def, const std::string& source, nlohmann::json* value, int where = 0) {
  bool found = false;
  for (const nlohmann::json* l : layers_of(model, type, where)) {
    const nlohmann::json v = l->contains(key) ? (*l)[key] : def;
    if (found && v != *value)
      REMAT_THROW(source, ": the ", type, " layers have different ", key, " (", value->dump(), " and ", v.dump(),
                  "); a GPT-2 has one");
    *value = v;
    found = true;
  }
  return found;
}

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
  if (shared_value(cfg.model, "gelu", "approximate", "none", cfg.source, &v))
    m.activation = v == "tanh" ? "gelu_new" : "gelu";
  if (shared_value(cfg.model, "layernorm", "eps", 1e-5, cfg.source, &v) && v.is_number()) m.ln_eps = v.get<double>();
  if (shared_value(cfg.model, "attention", "heads", 1, cfg.source, &v) && v.is_number_integer())
    m.heads = v.get<int64_t>();
  if (shared_value(cfg.model, "attention", "dropout", 0.0, cfg.source, &v) && v.is_number())
    m.attn_pdrop = v.get<double>();
  if (shared_value(cfg.model, "attention", "causal", true, cfg.source, &v) && v.is_boolean()) m.causal = v.get<bool>();
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

// Checks a Hugging Face config.json against the remat config: what shapes cannot tell.
void check_hf_config_json(const std::string& path, const Config& cfg, int64_t n_blocks);
void check_hf_config(const std::string& path, const Config& cfg, int64_t n_blocks) {
  try {
    check_hf_config_json(path, cfg, n_blocks);
  } catch (const nlohmann::json::exception& e) {  // a value of the wrong JSON type
    REMAT_THROW(path, ": unexpected value: ", e.what());
  }
}

void check_hf_config_json(const std::string& path, const Config& cfg, int64_t n_blocks) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    REMAT_THROW(path, ": not valid JSON: ", e.what());
  }
  if (!j.is_object()) REMAT_THROW(path, ": not a JSON object");
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

// ---- finding the files ---------------------------------------------------------------------------

[[noreturn]] void refuse_pickle(const std::string& file) {
  const std::string dir = fs::path(file).parent_path().string().empty() ? "." : fs::path(file).parent_path().string();
  REMAT_THROW(file,
              " is a pickled PyTorch checkpoint, which remat does not read (unpickling can run arbitrary code). "
              "Convert it to safetensors with transformers, e.g.\n  python3 -c \"from transformers import "
              "GPT2LMHeadModel; GPT2LMHeadModel.from_pretrained('",
              dir, "').save_pretrained('", dir, "-safetensors', safe_serialization=True)\"\nand pass --init-from ", dir,
              "-safetensors");
}

bool looks_pickled(const std::string& file) {
  const std::string ext = fs::path(file).extension().string();
  if (ext == ".bin" || ext == ".pt" || ext == ".pth" || ext == ".ckpt" || ext == ".pkl") return true;
  const MappedFile m(file);
  // torch.save's zip archive, or a bare pickle (protocol 2+ starts with 0x80).
  return (m.size() >= 4 && std::memcmp(m.data(), "PK\x03\x04", 4) == 0) || (m.size() >= 2 && m.data()[0] == 0x80);
}

// The complete checkpoint folder of a run folder (see load_checkpoint), or "".
std::string run_checkpoint(const fs::path& run) {
  for (const char* d : {"checkpoint", "checkpoint.new", "checkpoint.old"})
    if (fs::exists(run / d / "state.json") && fs::exists(run / d / "model.safetensors")) return (run / d).string();
  return "";
}

struct Sources {
  std::vector<SafetensorsFile> files;
  std::string config_json;  // a Hugging Face config.json beside the weights, or ""
};

Sources open_sources(const std::string& path) {
  Sources s;
  std::error_code ec;
  auto add_index = [&](const std::string& index) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_file(index));
    } catch (const nlohmann::json::exception& e) {
      REMAT_THROW(index, ": not valid JSON: ", e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      REMAT_THROW(index, ": no weight_map object (expected a safetensors index)");
    std::map<std::string, size_t> file_of;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) REMAT_THROW(index, ": weight_map/", it.key(), " is not a file name");
      const std::string fname = it.value().get<std::string>();
      if (fname.find('/') != std::string::npos || fname == ".." || fname.empty())
        REMAT_THROW(index, ": weight_map/", it.key(), " names ", fname, ", not a file beside the index");
      if (!file_of.count(fname)) {
        file_of[fname] = s.files.size();
        s.files.push_back(SafetensorsFile::load((fs::path(index).parent_path() / fname).string()));
      }
      if (!s.files[file_of[fname]].has(it.key()))
        REMAT_THROW(index, ": weight_map puts \"", it.key(), "\" in ", fname, ", which has no such tensor");
    }
  };
  if (fs::is_directory(path, ec)) {
    const fs::path d(path);
    const std::string ckpt = run_checkpoint(d);
    if (!ckpt.empty()) {
      s.files.push_back(SafetensorsFile::load((fs::path(ckpt) / "model.safetensors").string()));
    } else if (fs::exists(d / "model.safetensors")) {
      s.files.push_back(SafetensorsFile::load((d / "model.safetensors").string()));
    } else if (fs::exists(d / "model.safetensors.index.json")) {
      add_index((d / "model.safetensors.index.json").string());
    } else if (fs::exists(d / "pytorch_model.bin") || fs::exists(d / "pytorch_model.bin.index.json")) {
      refuse_pickle(
          (d / (fs::exists(d / "pytorch_model.bin") ? "pytorch_model.bin" : "pytorch_model.bin.index.json")).string());
    } else {
      REMAT_THROW(path,
                  ": no weights found (expected model.safetensors, model.safetensors.index.json, or a remat run "
                  "folder with checkpoint/model.safetensors)");
    }
    if (ckpt.empty() && fs::exists(d / "config.json")) s.config_json = (d / "config.json").string();
    return s;
  }
  if (!fs::exists(path, ec)) REMAT_THROW("--init-from ", path, ": no such file or folder");
  const std::string name = fs::path(path).filename().string();
  if (name.size() > 11 && name.compare(name.size() - 11, 11, ".index.json") == 0) {
    if (name.find(".bin") != std::string::npos) refuse_pickle(path);
    add_index(path);
  } else {
    try {
      s.files.push_back(SafetensorsFile::load(path));
    } catch (const Error&) {
      if (looks_pickled(path)) refuse_pickle(path);
      throw;
    }
  }
  const fs::path cj = fs::path(path).parent_path() / "config.json";
  if (fs::exists(cj)) {
    // A Hugging Face config.json only (a remat run folder's config.json has a "model" object).
    try {
      const nlohmann::json j = nlohmann::json::parse(read_file(cj.string()));
      if (j.is_object() && j.contains("n_embd")) s.config_json = cj.string();
    } catch (const nlohmann::json::exception&) {
    }
  }
  return s;
}

struct Found {
  const SafetensorsFile* file;
  const SafetensorsEntry* entry;
};

std::string join(const std::vector<std::string>& v, size_t max = 8) {
  std::string out;
  for (size_t i = 0; i < v.size() && i < max; ++i) out += (i ? ", " : "") + v[i];
  if (v.size() > max) out += ", ... (" + std::to_string(v.size()) + " in all)";
  return out;
}

// The number of GPT-2 blocks of a graph (its parameters h{i}.ln1.weight).
int64_t block_count(const Graph& g) {
  int64_t n_blocks = 0;
  for (const GraphParam& p : g.params) {
    int64_t i = -1;
    if (match_pattern("h{}.ln1.weight", p.name, &i)) n_blocks = std::max(n_blocks, i + 1);
  }
  return n_blocks;
}

// Whether the files name their tensors as Hugging Face GPT-2 does (else: as remat does).
bool has_hf_names(const Sources& src) {
  bool hf = false;
  for (const auto& f : src.files)
    for (const auto& e : f.entries()) {
      const std::string c = canonical_hf(e.name);
      int64_t i = -1;
      if (c == "wte.weight" || match_pattern("h.{}.ln_1.weight", c, &i) ||
          match_pattern("h.{}.attn.c_attn.weight", c, &i))
        hf = true;
    }
  return hf;
}

// Loads a graph's parameters from the tensors of the files, by name.
class ParamLoader {
 public:
  ParamLoader(const Sources& src, const Config& cfg, ParamStore& params, bool hf, bool partial, InitFromReport& r)
      : cfg_(cfg), params_(params), hf_(hf), partial_(partial), r_(r) {
    // Every tensor of the files by name; Hugging Face names without "transformer.", and
    // without the attention mask buffers (counted).
    for (const auto& f : src.files)
      for (const auto& e : f.entries()) {
        const std::string key = hf ? canonical_hf(e.name) : e.name;
        if (hf && is_hf_gpt2_buffer(key)) {
          ++r.ignored_buffers;
          continue;
        }
        if (by_name_.count(key))
          REMAT_THROW(f.source(), ": tensor \"", e.name, "\" appears twice (also in ", by_name_[key].file->source(),
                      ")");
        by_name_[key] = Found{&f, &e};
      }
  }

  // Parameter p from its tensor; under partial, one without a tensor is left as initialised
  // (and listed as missing).
  void load(size_t p) {
    const Graph& g = params_.graph();
    const std::string& name = g.params[p].name;
    std::string key = name;
    bool conv1d = false;
    if (hf_) {
      if (!hf_name_of(name, &key, &conv1d)) {
        if (partial_) return leave_initialised(p);
        REMAT_THROW(cfg_.source, ": parameter \"", name,
                    "\" has no Hugging Face GPT-2 name (a GPT-2 config uses the "
                    "layer names of models/gpt2_124m.json: embed, h{i}.ln1, h{i}.qkv, h{i}.proj, h{i}.ln2, h{i}.fc, "
                    "h{i}.fc2, ln_f, head); pass --init-from-partial to load the others");
      }
      if (key == kHfHead) head_tied_ = false;
    }
    auto it = by_name_.find(key);
    // An untied head loads the embedding when the file ties them (lm_head.weight left out).
    if (it == by_name_.end() && hf_ && key == kHfHead) it = by_name_.find("wte.weight");
    if (it == by_name_.end()) {
      if (partial_) return leave_initialised(p);
      REMAT_THROW(join(r_.files, 2), ": no tensor ",
                  hf_ ? "\"" + key + "\" (remat's \"" + name + "\")" : "\"" + name + "\"",
                  "; pass --init-from-partial to leave missing parameters as initialised");
    }
    const SafetensorsEntry& e = *it->second.entry;
    const Shape& want = g.params[p].spec.shape;
    const Shape want_file = conv1d ? transposed(want) : want;
    if (e.shape != want_file)
      REMAT_THROW(it->second.file->source(), ": tensor \"", e.name, "\"", hf_ ? " (remat's \"" + name + "\")" : "",
                  " has shape ", e.shape.str(), ", the config (", cfg_.source, ") expects ", want_file.str(),
                  conv1d ? " (Conv1D [in, out] of remat's " + want.str() + ")" : "");
    load_param(*it->second.file, e, conv1d, params_.values[p]);
    used_.insert(it->first);
    ++r_.tensors;
    r_.bytes += static_cast<int64_t>(e.end - e.begin);
  }

  // A tied head (no parameter of its own): the files' lm_head.weight, where there is one,
  // must be the embedding.
  void check_tied_head() {
    if (!hf_ || !head_tied_ || !by_name_.count(kHfHead) || !by_name_.count("wte.weight")) return;
    const Found& h = by_name_[kHfHead];
    const Found& w = by_name_["wte.weight"];
    const bool same = h.entry->shape == w.entry->shape && h.entry->dtype == w.entry->dtype &&
                      std::memcmp(h.file->data(*h.entry), w.file->data(*w.entry), h.entry->end - h.entry->begin) == 0;
    h.file->release(*h.entry, 0, h.entry->end - h.entry->begin);
    w.file->release(*w.entry, 0, w.entry->end - w.entry->begin);
    if (same) {
      used_.insert(kHfHead);
    } else if (!partial_) {
      REMAT_THROW(h.file->source(), ": lm_head.weight differs from wte.weight, but the config (", cfg_.source,
                  ") ties head to embed; an untied checkpoint needs a head with its own weight (no tie_weight)");
    }
  }

  // The files' tensors no parameter took: an error unless partial.
  void check_unused() {
    for (const auto& [key, f] : by_name_)
      if (!used_.count(key)) r_.unexpected.push_back(f.entry->name);
    if (!r_.unexpected.empty() && !partial_)
      REMAT_THROW(join(r_.files, 2), ": tensors the config (", cfg_.source,
                  ") has no parameter for: ", join(r_.unexpected), "; pass --init-from-partial to ignore them");
  }

 private:
  void leave_initialised(size_t p) {
    r_.missing.push_back(params_.graph().params[p].name);
    params_.initialise(p);
  }

  const Config& cfg_;
  ParamStore& params_;
  const bool hf_, partial_;
  InitFromReport& r_;
  std::map<std::string, Found> by_name_;
  std::set<std::string> used_;
  bool head_tied_ = true;  // no parameter head.weight of its own
};

}  // namespace

bool is_hf_gpt2_buffer(const std::string& hf_name) {
  int64_t i = -1;
  const std::string n = canonical_hf(hf_name);
  return match_pattern("h.{}.attn.bias", n, &i) || match_pattern("h.{}.attn.masked_bias", n, &i);
}

std::string InitFromReport::describe() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%lld tensors (%.1f MiB) in %.2f s", static_cast<long long>(tensors),
                static_cast<double>(bytes) / (1 << 20), seconds);
  std::string out = "init from " + path + " (" + (format == "hf-gpt2" ? "Hugging Face GPT-2" : "remat") + "): " + buf;
  if (ignored_buffers) out += ", " + std::to_string(ignored_buffers) + " attention mask buffers ignored";
  if (!missing.empty()) out += "\n  --init-from-partial: left as initialised: " + join(missing);
  if (!unexpected.empty()) out += "\n  --init-from-partial: not used: " + join(unexpected);
  return out;
}

InitFromReport init_from(const std::string& path, const Config& cfg, ParamStore& params, bool partial) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  const Graph& g = params.graph();
  REMAT_CHECK(!params.device().is_meta(), "--init-from: the parameters are on meta, which holds no data");
  InitFromReport r;
  r.path = path;
  const Sources src = open_sources(path);
  for (const auto& f : src.files) r.files.push_back(f.source());
  const bool hf = has_hf_names(src);
  r.format = hf ? "hf-gpt2" : "remat";
  ParamLoader loader(src, cfg, params, hf, partial, r);
  if (hf && !src.config_json.empty()) check_hf_config(src.config_json, cfg, block_count(g));
  for (size_t p = 0; p < g.params.size(); ++p) loader.load(p);
  loader.check_tied_head();
  loader.check_unused();
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

// ---- export -------------------------------------------------------------------------------------

namespace {

// A tensor of the export: its Hugging Face name, the checkpoint's entry, whether it is
// transposed (Conv1D's [in, out]) and its shape in the export.
struct ExportTensor {
  std::string name;
  const SafetensorsEntry* entry;
  bool conv1d;
  Shape shape;
};

// What the exported config.json says of the model besides the config's facts.
struct ExportFacts {
  bool tied = true;  // no parameter head.weight of its own
  int64_t n_blocks = 0, n_inner = 0, n_positions = 0;
};

// The checkpoint's tensors in the graph's order, with their Hugging Face names and shapes.
std::vector<ExportTensor> export_tensors(const Graph& g, const SafetensorsFile& f, const std::string& cfg_path,
                                         ExportFacts& facts) {
  std::vector<ExportTensor> outs;
  for (const GraphParam& p : g.params) {
    std::string hf;
    bool conv1d = false;
    if (!hf_name_of(p.name, &hf, &conv1d))
      REMAT_THROW(cfg_path, ": parameter \"", p.name,
                  "\" has no Hugging Face GPT-2 name (a GPT-2 config uses the layer "
                  "names of models/gpt2_124m.json)");
    REMAT_CHECK(f.has(p.name), f.source(), ": no tensor \"", p.name, "\" of the config's parameters");
    const SafetensorsEntry& e = f.entry(p.name);
    REMAT_CHECK(e.shape == p.spec.shape && e.dtype == DType::f32, f.source(), ": tensor \"", p.name, "\" is ",
                dtype_name(e.dtype), e.shape.str(), ", the config has f32", p.spec.shape.str());
    if (hf == kHfHead) facts.tied = false;
    if (p.name == "h0.fc.weight") facts.n_inner = e.shape[0];
    if (p.name == "embed.pos_weight") facts.n_positions = e.shape[0];
    outs.push_back(
        ExportTensor{hf == kHfHead ? hf : kHfPrefix + hf, &e, conv1d, conv1d ? transposed(e.shape) : e.shape});
  }
  facts.n_blocks = block_count(g);
  return outs;
}

// out_dir/model.safetensors: the tensors in order, f32, Conv1D weights transposed; each
// copied in pieces whose pages are released as they go.
void write_hf_safetensors(const std::string& out_dir, const SafetensorsFile& f, const std::vector<ExportTensor>& outs) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};  // transformers refuses safetensors without it
  size_t offset = 0;
  for (const ExportTensor& o : outs) {
    const size_t n = o.entry->end - o.entry->begin;
    header[o.name] = {{"dtype", "F32"}, {"shape", o.shape.dims()}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');
  AtomicFileWriter w((fs::path(out_dir) / "model.safetensors").string());
  unsigned char size[8];
  for (int i = 0; i < 8; ++i) size[i] = static_cast<unsigned char>((uint64_t{h.size()} >> (8 * i)) & 0xff);
  w.write(size, 8);
  w.write(h.data(), h.size());
  std::vector<float> buf;
  for (const ExportTensor& o : outs) {
    const size_t n = o.entry->end - o.entry->begin;
    if (!o.conv1d) {
      for (size_t b = 0; b < n; b += kPieceBytes) {
        const size_t e = std::min(n, b + kPieceBytes);
        w.write(f.data(*o.entry) + b, e - b);
        f.release(*o.entry, b, e);
      }
      continue;
    }
    // Hugging Face's [in, out] is the transpose of remat's [out, in]: the tiled copy of
    // loading, the other way round.
    buf.resize(static_cast<size_t>(o.shape.numel()));
    copy_entry(f, *o.entry, true, buf.data());
    w.write(buf.data(), buf.size() * sizeof(float));
  }
  w.commit();
}

// Hugging Face's config.json of the exported model (wte: the embedding's [vocab, n_embd]).
nlohmann::json hf_config(const ModelFacts& m, const ExportFacts& x, const Shape& wte) {
  nlohmann::json c = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", wte[0]},
      {"n_positions", x.n_positions},
      {"n_embd", wte[1]},
      {"n_layer", x.n_blocks},
      {"n_head", m.heads},
      {"n_inner", x.n_inner == 4 * wte[1] ? nlohmann::json(nullptr) : nlohmann::json(x.n_inner)},
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
      {"torch_dtype", "float32"},
  };
  if (wte[0] == kGpt2Vocab) {  // GPT-2's tokenizer: <|endoftext|>
    c["bos_token_id"] = 50256;
    c["eos_token_id"] = 50256;
  }
  return c;
}

}  // namespace

std::string export_hf_gpt2(const std::string& run_dir, const std::string& out_dir) {
  const fs::path run(run_dir);
  const std::string cfg_path = (run / "config.json").string();
  if (!fs::exists(cfg_path)) REMAT_THROW(run_dir, ": no config.json (expected a folder written by remat train --out)");
  const std::string ckpt = run_checkpoint(run);
  if (ckpt.empty()) REMAT_THROW(run_dir, ": no complete checkpoint (checkpoint/state.json and model.safetensors)");
  const Config cfg = load_config(cfg_path);
  const SafetensorsFile f = SafetensorsFile::load((fs::path(ckpt) / "model.safetensors").string());
  REMAT_CHECK(f.has("embed.weight") && f.entry("embed.weight").shape.rank() == 2, f.source(),
              ": no 2-d embed.weight; not a GPT-2 checkpoint of remat");
  const Shape wte = f.entry("embed.weight").shape;
  const Graph g = build_graph(cfg.model, 1, cfg_path, {{"vocab", wte[0]}});

  ExportFacts facts;
  const std::vector<ExportTensor> outs = export_tensors(g, f, cfg_path, facts);
  REMAT_CHECK(facts.n_blocks > 0 && facts.n_positions > 0, cfg_path,
              ": not a GPT-2 (blocks h0.., a position table embed.pos_weight)");
  const ModelFacts m = model_facts(cfg);
  REMAT_CHECK(!m.activation.empty() && m.heads > 0 && m.causal, cfg_path,
              ": not a GPT-2 (its blocks need gelu, causal attention with integer heads)");

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) REMAT_THROW("cannot create ", out_dir, ": ", ec.message());
  write_hf_safetensors(out_dir, f, outs);
  write_file_atomic((fs::path(out_dir) / "config.json").string(), hf_config(m, facts, wte).dump(2) + "\n");
  return "exported " + ckpt + " (" + std::to_string(outs.size()) + " tensors, " + std::to_string(facts.n_blocks) +
         " blocks) to " + out_dir + "/model.safetensors and config.json (Hugging Face GPT-2)";
}

}  // namespace remat
