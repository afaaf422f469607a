// Hugging Face checkpoints in and out (interop.h): finding the files, loading with a single
// copy per tensor, and the export; what differs between GPT-2 and Llama is in hf_gpt2.cpp
// and hf_llama.cpp (hf_arch.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "interop/hf_arch.h"
#include "remat/bf16.h"
#include "remat/error.h"
#include "remat/interop.h"
#include "remat/io.h"

namespace remat {

namespace fs = std::filesystem;

namespace hf {

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

namespace {

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

}  // namespace

std::vector<const nlohmann::json*> layers_of(const nlohmann::json& model, const std::string& type, int where) {
  std::vector<std::pair<const nlohmann::json*, bool>> all;
  if (model.contains("layers")) collect_layers(model["layers"], type, false, all);
  std::vector<const nlohmann::json*> out;
  for (const auto& [l, in_block] : all)
    if (where == 0 || (where > 0) == in_block) out.push_back(l);
  return out;
}

bool shared_value(const nlohmann::json& model, const std::string& type, const std::string& key,
                  const nlohmann::json& def, const std::string& source, const char* arch, nlohmann::json* value,
                  int where) {
  bool found = false;
  for (const nlohmann::json* l : layers_of(model, type, where)) {
    const nlohmann::json v = l->contains(key) ? (*l)[key] : def;
    if (found && v != *value)
      REMAT_THROW(source, ": the ", type, " layers have different ", key, " (", value->dump(), " and ", v.dump(), "); ",
                  arch);
    *value = v;
    found = true;
  }
  return found;
}

nlohmann::json read_config_json(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    REMAT_THROW(path, ": not valid JSON: ", e.what());
  }
  if (!j.is_object()) REMAT_THROW(path, ": not a JSON object");
  return j;
}

int64_t block_count(const Graph& g) {
  int64_t n_blocks = 0;
  for (const GraphParam& p : g.params) {
    const size_t dot = p.name.find('.');
    int64_t i = -1;
    if (dot != std::string::npos && match_pattern("h{}", p.name.substr(0, dot), &i))
      n_blocks = std::max(n_blocks, i + 1);
  }
  return n_blocks;
}

const Arch& arch(HfArch id) { return id == HfArch::llama ? llama_arch() : gpt2_arch(); }

}  // namespace hf

const std::vector<HfTensorName>& hf_tensor_names(HfArch a) { return hf::arch(a).names; }
bool is_hf_buffer(HfArch a, const std::string& hf_name) {
  const hf::Arch& x = hf::arch(a);
  const std::string p = x.prefix;
  return x.is_buffer(!p.empty() && hf_name.compare(0, p.size(), p) == 0 ? hf_name.substr(p.size()) : hf_name);
}
const char* hf_format_name(HfArch a) { return hf::arch(a).format; }

namespace {

using hf::Arch;
using hf::fill_pattern;
using hf::match_pattern;

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

struct Found {
  const SafetensorsFile* file;
  const SafetensorsEntry* entry;
};

// Copies `parts` (stacked along the first dimension) into parameter `t` (any device),
// transposing a Conv1D weight (one part).
void load_param(const std::vector<Found>& parts, bool transpose, Tensor& t) {
  Tensor host = t.device().is_cpu() ? t
                                    : Tensor::empty(t.shape(), Device::cpu(), DType::f32,
                                                    AllocTag{MemoryCategory::temporary, "init_from", Phase::setup});
  int64_t at = 0;
  for (const Found& p : parts) {
    copy_entry(*p.file, *p.entry, transpose, host.f32() + at);
    at += p.entry->shape.numel();
  }
  if (!t.device().is_cpu()) t.copy_from(host);
}

// ---- finding the files ---------------------------------------------------------------------------

[[noreturn]] void refuse_pickle(const std::string& file) {
  const std::string dir = fs::path(file).parent_path().string().empty() ? "." : fs::path(file).parent_path().string();
  REMAT_THROW(file,
              " is a pickled PyTorch checkpoint, which remat does not read (unpickling can run arbitrary code). "
              "Convert it to safetensors with transformers, e.g.\n  python3 -c \"from transformers import "
              "AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained('",
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
      if (j.is_object() && (j.contains("n_embd") || j.contains("model_type"))) s.config_json = cj.string();
    } catch (const nlohmann::json::exception&) {
    }
  }
  return s;
}

std::string join(const std::vector<std::string>& v, size_t max = 8) {
  std::string out;
  for (size_t i = 0; i < v.size() && i < max; ++i) out += (i ? ", " : "") + v[i];
  if (v.size() > max) out += ", ... (" + std::to_string(v.size()) + " in all)";
  return out;
}

// A file tensor's name without the architecture's save_pretrained prefix.
std::string canonical(const Arch& a, const std::string& name) {
  const std::string p = a.prefix;
  return !p.empty() && name.compare(0, p.size(), p) == 0 ? name.substr(p.size()) : name;
}

// The architecture whose names the files use; nullptr for remat's own names.
const Arch* files_arch(const Sources& src) {
  for (const Arch* a : {&hf::gpt2_arch(), &hf::llama_arch()})
    for (const auto& f : src.files)
      for (const auto& e : f.entries())
        if (a->recognises(canonical(*a, e.name))) return a;
  return nullptr;
}

// The table row of a remat parameter; false when the table has none. `hf` gets the row's
// Hugging Face names for block `index`.
bool row_of(const Arch& a, const std::string& remat_name, std::vector<std::string>* hf, bool* conv1d) {
  for (const HfTensorName& row : a.names) {
    int64_t i = -1;
    if (match_pattern(row.remat, remat_name, &i)) {
      hf->clear();
      for (const char* n : row.hf) hf->push_back(fill_pattern(n, i));
      *conv1d = row.conv1d;
      return true;
    }
  }
  return false;
}

// Loads a graph's parameters from the tensors of the files, by name.
class ParamLoader {
 public:
  ParamLoader(const Sources& src, const Config& cfg, ParamStore& params, const Arch* arch, bool partial,
              InitFromReport& r)
      : cfg_(cfg), params_(params), arch_(arch), partial_(partial), r_(r) {
    // Every tensor of the files by name; Hugging Face names without their prefix, and
    // without the buffers (counted).
    for (const auto& f : src.files)
      for (const auto& e : f.entries()) {
        const std::string key = arch ? canonical(*arch, e.name) : e.name;
        if (arch && arch->is_buffer(key)) {
          ++r.ignored_buffers;
          continue;
        }
        if (by_name_.count(key))
          REMAT_THROW(f.source(), ": tensor \"", e.name, "\" appears twice (also in ", by_name_[key].file->source(),
                      ")");
        by_name_[key] = Found{&f, &e};
      }
  }

  // Parameter p from its tensors; under partial, one without them is left as initialised
  // (and listed as missing).
  void load(size_t p) {
    const Graph& g = params_.graph();
    const std::string& name = g.params[p].name;
    std::vector<std::string> keys{name};
    bool conv1d = false;
    if (arch_) {
      if (!row_of(*arch_, name, &keys, &conv1d)) {
        if (partial_) return leave_initialised(p);
        REMAT_THROW(cfg_.source, ": parameter \"", name, "\" has no ", arch_->title, " name (a config uses ",
                    arch_->layer_names, "); pass --init-from-partial to load the others");
      }
      if (keys.front() == arch_->head) head_tied_ = false;
    }
    const Shape& want = g.params[p].spec.shape;
    const std::vector<int64_t> rows =
        keys.size() > 1 ? arch_->part_rows(cfg_, name, want[0]) : std::vector<int64_t>{want[0]};
    std::vector<Found> parts;
    std::vector<std::string> part_keys;
    for (size_t k = 0; k < keys.size(); ++k) {
      auto it = by_name_.find(keys[k]);
      // An untied head loads the embedding when the file ties them (lm_head.weight left out).
      if (it == by_name_.end() && arch_ && keys[k] == arch_->head) it = by_name_.find(arch_->embed);
      if (it == by_name_.end()) {
        if (partial_) return leave_initialised(p);  // nothing of it used: its other parts stay unused
        REMAT_THROW(join(r_.files, 2), ": no tensor ",
                    arch_ ? "\"" + keys[k] + "\" (remat's \"" + name + "\")" : "\"" + name + "\"",
                    "; pass --init-from-partial to leave missing parameters as initialised");
      }
      const SafetensorsEntry& e = *it->second.entry;
      Shape want_file = conv1d ? transposed(want) : want;
      int64_t first_row = 0;
      for (size_t j = 0; j < k; ++j) first_row += rows[j];
      if (keys.size() > 1) want_file = want_file.rank() == 1 ? Shape{rows[k]} : Shape{rows[k], want[1]};
      if (e.shape != want_file)
        REMAT_THROW(it->second.file->source(), ": tensor \"", e.name, "\"", arch_ ? " (remat's \"" + name + "\")" : "",
                    " has shape ", e.shape.str(), ", the config (", cfg_.source, ") expects ", want_file.str(),
                    conv1d ? " (Conv1D [in, out] of remat's " + want.str() + ")" : "",
                    keys.size() > 1 ? " (part " + std::to_string(k + 1) + " of " + std::to_string(keys.size()) +
                                          ": rows " + std::to_string(first_row) + ".." +
                                          std::to_string(first_row + rows[k] - 1) + " of remat's " + want.str() + ")"
                                    : "");
      parts.push_back(it->second);
      part_keys.push_back(it->first);
    }
    for (size_t k = 0; k < parts.size(); ++k) {
      used_.insert(part_keys[k]);
      r_.bytes += static_cast<int64_t>(parts[k].entry->end - parts[k].entry->begin);
    }
    load_param(parts, conv1d, params_.values[p]);
    ++r_.tensors;
  }

  // A tied head (no parameter of its own): the files' lm_head.weight, where there is one,
  // must be the embedding.
  void check_tied_head() {
    if (!arch_ || !head_tied_ || !by_name_.count(arch_->head) || !by_name_.count(arch_->embed)) return;
    const Found& h = by_name_[arch_->head];
    const Found& w = by_name_[arch_->embed];
    const bool same = h.entry->shape == w.entry->shape && h.entry->dtype == w.entry->dtype &&
                      std::memcmp(h.file->data(*h.entry), w.file->data(*w.entry), h.entry->end - h.entry->begin) == 0;
    h.file->release(*h.entry, 0, h.entry->end - h.entry->begin);
    w.file->release(*w.entry, 0, w.entry->end - w.entry->begin);
    if (same) {
      used_.insert(arch_->head);
    } else if (!partial_) {
      REMAT_THROW(h.file->source(), ": ", arch_->head, " differs from ", arch_->embed, ", but the config (",
                  cfg_.source,
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
  const Arch* arch_;
  const bool partial_;
  InitFromReport& r_;
  std::map<std::string, Found> by_name_;
  std::set<std::string> used_;
  bool head_tied_ = true;  // no parameter head.weight of its own
};

}  // namespace

std::string InitFromReport::describe() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%lld tensors (%.1f MiB) in %.2f s", static_cast<long long>(tensors),
                static_cast<double>(bytes) / (1 << 20), seconds);
  const std::string what = format == "hf-gpt2"    ? hf::gpt2_arch().title
                           : format == "hf-llama" ? hf::llama_arch().title
                                                  : "remat";
  std::string out = "init from " + path + " (" + what + "): " + buf;
  if (ignored_buffers)
    out += ", " + std::to_string(ignored_buffers) +
           (format == "hf-llama" ? " rotary inv_freq buffers ignored" : " attention mask buffers ignored");
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
  const Arch* arch = files_arch(src);
  r.format = arch ? arch->format : "remat";
  ParamLoader loader(src, cfg, params, arch, partial, r);
  if (arch && !src.config_json.empty()) {
    const nlohmann::json j = hf::read_config_json(src.config_json);
    try {
      arch->check_config(j, src.config_json, cfg, g, hf::block_count(g));
    } catch (const nlohmann::json::exception& e) {  // a value of the wrong JSON type
      REMAT_THROW(src.config_json, ": unexpected value: ", e.what());
    }
  }
  for (size_t p = 0; p < g.params.size(); ++p) loader.load(p);
  loader.check_tied_head();
  loader.check_unused();
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

// ---- export -------------------------------------------------------------------------------------

namespace {

// A tensor of the export: its Hugging Face name, the checkpoint's entry, the bytes of it
// this tensor is (a part of a stacked parameter is a band of its rows), whether it is
// transposed (Conv1D's [in, out]) and its shape in the export.
struct ExportTensor {
  std::string name;
  const SafetensorsEntry* entry;
  size_t begin, end;  // within the entry's data
  bool conv1d;
  Shape shape;
  size_t bytes() const { return end - begin; }
};

// The checkpoint's tensors in the graph's order, with their Hugging Face names and shapes.
std::vector<ExportTensor> export_tensors(const Arch& a, const Config& cfg, const Graph& g, const SafetensorsFile& f,
                                         hf::ExportShapes& x) {
  std::vector<ExportTensor> outs;
  for (const GraphParam& p : g.params) {
    std::vector<std::string> hf;
    bool conv1d = false;
    if (!row_of(a, p.name, &hf, &conv1d))
      REMAT_THROW(cfg.source, ": parameter \"", p.name, "\" has no ", a.title, " name (a config uses ", a.layer_names,
                  ")");
    REMAT_CHECK(f.has(p.name), f.source(), ": no tensor \"", p.name, "\" of the config's parameters");
    const SafetensorsEntry& e = f.entry(p.name);
    REMAT_CHECK(e.shape == p.spec.shape && e.dtype == DType::f32, f.source(), ": tensor \"", p.name, "\" is ",
                dtype_name(e.dtype), e.shape.str(), ", the config has f32", p.spec.shape.str());
    x.params.push_back(p.name);
    if (hf.front() == a.head) x.tied = false;
    if (p.name == "h0.fc.weight" || p.name == "h0.gate.weight") x.inner = e.shape[0];
    if (p.name == "h0.qkv.weight") x.qkv_rows = e.shape[0];
    if (p.name == "embed.pos_weight") x.positions = e.shape[0];
    const std::string prefix = hf.front() == a.head ? "" : a.prefix;
    if (hf.size() == 1) {
      outs.push_back(
          ExportTensor{prefix + hf.front(), &e, 0, e.end - e.begin, conv1d, conv1d ? transposed(e.shape) : e.shape});
      continue;
    }
    const std::vector<int64_t> rows = a.part_rows(cfg, p.name, e.shape[0]);
    const size_t row_bytes = (e.end - e.begin) / static_cast<size_t>(e.shape[0]);
    size_t at = 0;
    for (size_t k = 0; k < hf.size(); ++k) {
      const size_t n = static_cast<size_t>(rows[k]) * row_bytes;
      outs.push_back(ExportTensor{prefix + hf[k], &e, at, at + n, false,
                                  e.shape.rank() == 1 ? Shape{rows[k]} : Shape{rows[k], e.shape[1]}});
      at += n;
    }
  }
  x.n_blocks = hf::block_count(g);
  return outs;
}

// The bytes of `o` in the export's dtype (f32 or bf16: half).
size_t out_bytes(const ExportTensor& o, DType dtype) { return dtype == DType::bf16 ? o.bytes() / 2 : o.bytes(); }

// A safetensors file of `outs` in `dtype` (F32, or BF16 rounded to nearest even as torch's
// .to(torch.bfloat16)), Conv1D weights transposed; each copied in pieces whose pages are
// released as they go.
void write_hf_safetensors(const std::string& path, const SafetensorsFile& f, const std::vector<ExportTensor>& outs,
                          DType dtype) {
  const bool half = dtype == DType::bf16;
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};  // transformers refuses safetensors without it
  size_t offset = 0;
  for (const ExportTensor& o : outs) {
    const size_t n = out_bytes(o, dtype);
    header[o.name] = {
        {"dtype", half ? "BF16" : "F32"}, {"shape", o.shape.dims()}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');
  AtomicFileWriter w(path);
  unsigned char size[8];
  for (int i = 0; i < 8; ++i) size[i] = static_cast<unsigned char>((uint64_t{h.size()} >> (8 * i)) & 0xff);
  w.write(size, 8);
  w.write(h.data(), h.size());
  std::vector<float> buf;
  std::vector<uint16_t> narrow;
  auto write_floats = [&](const float* x, size_t count) {
    if (!half) {
      w.write(x, count * sizeof(float));
      return;
    }
    narrow.resize(count);
    for (size_t i = 0; i < count; ++i) narrow[i] = bf16_from_float(x[i]);
    w.write(narrow.data(), count * sizeof(uint16_t));
  };
  for (const ExportTensor& o : outs) {
    if (!o.conv1d) {
      for (size_t b = o.begin; b < o.end; b += kPieceBytes) {
        const size_t e = std::min(o.end, b + kPieceBytes);
        if (half) {
          buf.resize((e - b) / sizeof(float));
          std::memcpy(buf.data(), f.data(*o.entry) + b, e - b);  // the mapping need not be float-aligned
          write_floats(buf.data(), buf.size());
        } else {
          w.write(f.data(*o.entry) + b, e - b);
        }
        f.release(*o.entry, b, e);
      }
      continue;
    }
    // Hugging Face's [in, out] is the transpose of remat's [out, in]: the tiled copy of
    // loading, the other way round.
    buf.resize(static_cast<size_t>(o.shape.numel()));
    copy_entry(f, *o.entry, true, buf.data());
    write_floats(buf.data(), buf.size());
  }
  w.commit();
}

// save_pretrained's shard names: model-00001-of-00003.safetensors.
std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

bool is_shard_name(const std::string& name) {
  return name.size() == 32 && name.compare(0, 6, "model-") == 0 && name.compare(11, 4, "-of-") == 0 &&
         name.compare(20, 12, ".safetensors") == 0;
}

// Writes the weights as one file or as shards of at most `max_bytes` (in order, a new shard
// when the next tensor would not fit) with their index; removes what an earlier export of
// the other layout left. Each file is written whole or not at all (write_hf_safetensors).
// Returns the files written.
std::vector<std::string> write_weights(const fs::path& out, const SafetensorsFile& f,
                                       const std::vector<ExportTensor>& outs, int64_t max_bytes, DType dtype) {
  std::vector<std::vector<ExportTensor>> shards(1);
  size_t in_shard = 0, total = 0;
  for (const ExportTensor& o : outs) {
    const size_t n = out_bytes(o, dtype);
    if (in_shard > 0 && in_shard + n > static_cast<size_t>(max_bytes)) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(o);
    in_shard += n;
    total += n;
  }
  std::vector<std::string> written;
  std::error_code ec;
  if (shards.size() == 1) {
    write_hf_safetensors((out / "model.safetensors").string(), f, outs, dtype);
    written.push_back("model.safetensors");
    fs::remove(out / "model.safetensors.index.json", ec);
    for (const auto& d : fs::directory_iterator(out, ec))
      if (is_shard_name(d.path().filename().string())) fs::remove(d.path(), ec);
    return written;
  }
  // The index goes first and comes back last: an export that stops half-way leaves shards
  // no index names, never an earlier export's index over a mix of old and new shards.
  fs::remove(out / "model.safetensors.index.json", ec);
  fs::remove(out / "model.safetensors", ec);  // transformers would read it before the index
  nlohmann::json map = nlohmann::json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = shard_name(i, shards.size());
    write_hf_safetensors((out / name).string(), f, shards[i], dtype);
    for (const ExportTensor& o : shards[i]) map[o.name] = name;
    written.push_back(name);
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
  write_file_atomic((out / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  written.push_back("model.safetensors.index.json");
  for (const auto& d : fs::directory_iterator(out, ec)) {
    const std::string n = d.path().filename().string();
    if (is_shard_name(n) && std::find(written.begin(), written.end(), n) == written.end()) fs::remove(d.path(), ec);
  }
  return written;
}

}  // namespace

std::string export_hf(const std::string& run_dir, const std::string& out_dir, HfArch arch_id, int64_t max_shard_bytes,
                      DType dtype) {
  const Arch& a = hf::arch(arch_id);
  const fs::path run(run_dir);
  const std::string cfg_path = (run / "config.json").string();
  if (!fs::exists(cfg_path)) REMAT_THROW(run_dir, ": no config.json (expected a folder written by remat train --out)");
  const std::string ckpt = run_checkpoint(run);
  if (ckpt.empty()) REMAT_THROW(run_dir, ": no complete checkpoint (checkpoint/state.json and model.safetensors)");
  REMAT_CHECK(max_shard_bytes > 0, "--max-shard-size must be positive");
  REMAT_CHECK(dtype == DType::f32 || dtype == DType::bf16, "export: dtype ", dtype_name(dtype),
              " (expected f32 or bf16)");
  const Config cfg = load_config(cfg_path);
  const SafetensorsFile f = SafetensorsFile::load((fs::path(ckpt) / "model.safetensors").string());
  REMAT_CHECK(f.has("embed.weight") && f.entry("embed.weight").shape.rank() == 2, f.source(),
              ": no 2-d embed.weight; not a ", a.title, " checkpoint of remat");
  hf::ExportShapes x;
  x.embed = f.entry("embed.weight").shape;
  const Graph g = build_graph(cfg.model, 1, cfg_path, {{"vocab", x.embed[0]}});
  if (!g.input_ids.empty() && g.layer(g.input_ids.front()).out_shape.rank() >= 2)
    x.seq_len = g.layer(g.input_ids.front()).out_shape[1];
  const std::vector<ExportTensor> outs = export_tensors(a, cfg, g, f, x);
  nlohmann::json config = a.export_config(cfg, x);
  config["torch_dtype"] = dtype == DType::bf16 ? "bfloat16" : "float32";

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) REMAT_THROW("cannot create ", out_dir, ": ", ec.message());
  const std::vector<std::string> files = write_weights(fs::path(out_dir), f, outs, max_shard_bytes, dtype);
  write_file_atomic((fs::path(out_dir) / "config.json").string(), config.dump(2) + "\n");
  const std::string what =
      files.size() == 1 ? out_dir + "/model.safetensors"
                        : std::to_string(files.size() - 1) + " shards and " + out_dir + "/model.safetensors.index.json";
  return "exported " + ckpt + " (" + std::to_string(outs.size()) + " tensors, " + std::to_string(x.n_blocks) +
         " blocks) to " + what + " and config.json (" + a.title + ", " + (dtype == DType::bf16 ? "bf16" : "f32") + ")";
}

}  // namespace remat
