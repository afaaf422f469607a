// Files: atomic writes (nothing half-written survives a crash), read-only memory maps and
// safetensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
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

// write_file_atomic for a file written piece by piece: the pieces go to a temporary file
// in the same folder, which commit() flushes and renames over `path`. Destroyed without
// commit() (an error on the way), it removes the temporary file and `path` is untouched.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  void write(const void* data, size_t bytes);
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};

// A whole file mapped read-only into memory (mmap). Pages are read from the page cache as
// they are touched and count towards the process's resident memory until release() drops
// them again, so a reader that copies a large file piece by piece and releases each piece
// keeps its resident memory near one piece. Errors name the path. An empty file maps to
// size() == 0 and data() == nullptr. The file must not be truncated while it is mapped
// (reads past the new end would fault); remat replaces its files by rename, which keeps
// the mapped inode intact.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Drops the pages wholly inside [begin, end) from this process's resident memory
  // (madvise MADV_DONTNEED; they stay in the page cache and are read again if touched).
  void release(size_t begin, size_t end) const;

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

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
  // Memory-maps the file (nothing is read but the header until a tensor is used).
  static SafetensorsFile load(const std::string& path);
  static SafetensorsFile parse(std::string bytes, const std::string& name_for_errors);

  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const;
  const SafetensorsEntry& entry(const std::string& name) const;
  // A new tensor (f32 or i32) holding the named entry's data, on `device`.
  Tensor tensor(const std::string& name, Device device = Device::cpu()) const;
  // The entry's bytes in place (in the mapping or the parsed buffer), valid while this
  // object or a copy of it lives: for readers that convert while they copy.
  const unsigned char* data(const SafetensorsEntry& e) const { return base_ + data_start_ + e.begin; }
  // Drops the pages of the entry's bytes [e.begin + begin, e.begin + end) from resident
  // memory when the file is mapped (see MappedFile::release); a no-op after parse().
  void release(const SafetensorsEntry& e, size_t begin, size_t end) const;
  const std::string& source() const { return source_; }

 private:
  void parse_header(size_t size);
  std::string source_;
  std::shared_ptr<const void> holder_;  // the MappedFile or the std::string that base_ points into
  const unsigned char* base_ = nullptr;
  const MappedFile* map_ = nullptr;  // set when holder_ is a mapping
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
