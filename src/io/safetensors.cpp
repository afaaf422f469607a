#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <limits>

#include "remat/error.h"
#include "remat/io.h"

namespace remat {

namespace {

constexpr uint64_t kMaxHeader = 100u << 20;  // as the reference implementation

const char* st_dtype(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::u8: return "U8";
  }
  return "?";
}

}  // namespace

SafetensorsFile SafetensorsFile::load(const std::string& path) {
  auto map = std::make_shared<const MappedFile>(path);
  SafetensorsFile f;
  f.source_ = path;
  f.base_ = map->data();
  f.map_ = map.get();
  f.holder_ = std::move(map);
  f.parse_header(f.map_->size());
  return f;
}

SafetensorsFile SafetensorsFile::parse(std::string bytes, const std::string& src) {
  auto owned = std::make_shared<const std::string>(std::move(bytes));
  SafetensorsFile f;
  f.source_ = src;
  f.base_ = reinterpret_cast<const unsigned char*>(owned->data());
  f.holder_ = owned;
  f.parse_header(owned->size());
  return f;
}

void SafetensorsFile::parse_header(size_t size) {
  const std::string& src = source_;
  SafetensorsFile& f = *this;  // the parser as it was written for a local object
  auto bad = [&](const std::string& msg) -> void { REMAT_THROW(src, ": not a valid safetensors file: ", msg); };
  if (size < 8) bad("file is " + std::to_string(size) + " bytes, shorter than the 8-byte header size");
  uint64_t hsize = 0;
  for (int i = 7; i >= 0; --i) hsize = (hsize << 8) | base_[i];
  if (hsize > kMaxHeader) bad("header size " + std::to_string(hsize) + " exceeds 100 MiB");
  if (hsize > size - 8)
    bad("header size " + std::to_string(hsize) + " runs past the end of the file (" + std::to_string(size) + " bytes)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(base_ + 8, base_ + 8 + hsize);
  } catch (const nlohmann::json::exception& e) {
    bad(std::string("header is not JSON: ") + e.what());
  }
  if (!header.is_object()) bad("header is not a JSON object");
  f.data_start_ = 8 + hsize;
  const size_t data_size = size - f.data_start_;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) bad("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) bad("__metadata__/" + m.key() + " is not a string");
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor \"" + name + "\"";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      bad(where + " needs dtype, shape and data_offsets");
    if (!v["dtype"].is_string()) bad(where + ": dtype is not a string");
    SafetensorsEntry e;
    e.name = name;
    const std::string dt = v["dtype"].get<std::string>();
    if (dt == "F32")
      e.dtype = DType::f32;
    else if (dt == "I32")
      e.dtype = DType::i32;
    else if (dt == "BF16")
      e.dtype = DType::bf16;
    else if (dt == "F16")
      e.dtype = DType::f16;
    else if (dt == "U8")
      e.dtype = DType::u8;
    else
      bad(where + ": unsupported dtype " + dt);
    const auto& sh = v["shape"];
    if (!sh.is_array() || sh.size() > static_cast<size_t>(Shape::kMaxDims))
      bad(where + ": shape must be an array of at most 5 dims");
    std::vector<int64_t> dims;
    uint64_t numel = 1;
    for (const auto& d : sh) {
      if (!d.is_number_unsigned()) bad(where + ": shape entries must be non-negative integers");
      uint64_t x = d.get<uint64_t>();
      if (x > 0 && numel > std::numeric_limits<uint64_t>::max() / 8 / x) bad(where + ": shape overflows");
      numel *= x;
      dims.push_back(static_cast<int64_t>(x));
    }
    e.shape = Shape(dims);
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad(where + ": data_offsets must be two non-negative integers");
    const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (b > en || en > data_size)
      bad(where + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(en) +
          "] outside the data section of " + std::to_string(data_size) + " bytes");
    if (en - b != numel * dtype_size(e.dtype))
      bad(where + ": " + std::to_string(en - b) + " bytes of data for shape " + e.shape.str() + " of " + dt);
    e.begin = b;
    e.end = en;
    f.entries_.push_back(e);
  }
  // Empty tensors occupy no bytes; among the rest, after sorting by start, a tensor that
  // overlaps any earlier one overlaps its predecessor.
  std::vector<const SafetensorsEntry*> used;
  for (const auto& e : f.entries_)
    if (e.end > e.begin) used.push_back(&e);
  std::sort(used.begin(), used.end(), [](const auto* a, const auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < used.size(); ++i)
    if (used[i]->begin < used[i - 1]->end)
      bad("tensors \"" + used[i - 1]->name + "\" and \"" + used[i]->name + "\" overlap");
}

void SafetensorsFile::release(const SafetensorsEntry& e, size_t begin, size_t end) const {
  if (map_) map_->release(data_start_ + e.begin + begin, data_start_ + e.begin + std::min(end, e.end - e.begin));
}

bool SafetensorsFile::has(const std::string& name) const {
  return std::any_of(entries_.begin(), entries_.end(), [&](const auto& e) { return e.name == name; });
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return e;
  REMAT_THROW(source_, ": no tensor named \"", name, "\"");
}

Tensor SafetensorsFile::tensor(const std::string& name, Device device) const {
  const SafetensorsEntry& e = entry(name);
  REMAT_CHECK(e.dtype == DType::f32 || e.dtype == DType::i32 || e.dtype == DType::u8, source_, ": tensor \"", name,
              "\" has dtype ", dtype_name(e.dtype), "; only f32, i32 and u8 can be loaded");
  Tensor host = Tensor::empty(e.shape, Device::cpu(), e.dtype);
  if (e.end > e.begin) std::memcpy(host.raw_data(), data(e), e.end - e.begin);
  return device.is_cpu() ? host : host.to(device);
}

std::string encode_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string data;
  for (const auto& [name, t] : tensors) {
    REMAT_CHECK(t.defined(), "save_safetensors: tensor \"", name, "\" is undefined");
    REMAT_CHECK(!header.contains(name), "save_safetensors: duplicate tensor name \"", name, "\"");
    Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
    const size_t begin = data.size();
    data.append(static_cast<const char*>(host.raw_data()), host.nbytes());
    header[name] = {
        {"dtype", st_dtype(t.dtype())}, {"shape", t.shape().dims()}, {"data_offsets", {begin, data.size()}}};
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');  // align the data section to 8 bytes
  std::string out(8, '\0');
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += h;
  out += data;
  return out;
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  write_file_atomic(path, encode_safetensors(tensors, metadata));
}

}  // namespace remat
