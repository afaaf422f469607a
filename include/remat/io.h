// Files: atomic writes (nothing half-written survives a crash) and safetensors.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "remat/tensor.h"

namespace remat {

// Writes `bytes` to `path` through a temporary file in the same folder, flushed and then
// renamed over `path`: readers see the old file or the new one, never a partial one.
void write_file_atomic(const std::string& path, const std::string& bytes);
// Reads a whole file; throws remat::Error naming the path when it cannot.
std::string read_file(const std::string& path);

// One tensor of a safetensors file.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  size_t begin = 0;  // byte range in the data section
  size_t end = 0;
};

// A parsed, validated safetensors file (https://github.com/huggingface/safetensors format:
// u64 little-endian header size, JSON header, data). Validation checks the header size
// against the file size, every dtype, shape and byte range against the data section, and
// that ranges do not overlap, before anything is allocated for the tensors.
class SafetensorsFile {
 public:
  static SafetensorsFile load(const std::string& path);
  static SafetensorsFile parse(std::string bytes, const std::string& name_for_errors);

  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const;
  const SafetensorsEntry& entry(const std::string& name) const;
  // A new tensor (f32 or i32) holding the named entry's data, on `device`.
  Tensor tensor(const std::string& name, Device device = Device::cpu()) const;

 private:
  std::string source_;
  std::string bytes_;
  size_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (any device; copied to host) in safetensors format, atomically.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
std::string encode_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

}  // namespace remat
