// IDX files (the MNIST format): a big-endian header of two zero bytes, a type code, a
// dimension count and one u32 per dimension, then the elements in row-major order.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "data/gzip.h"
#include "remat/data.h"
#include "remat/error.h"
#include "remat/io.h"
#include "remat/memory.h"

namespace remat {

namespace {

constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
constexpr size_t kMaxIdxHeader = 4 + 4 * 255;  // magic + up to 255 dims

const char* idx_type_name(unsigned code) {
  switch (code) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "short";
    case 0x0C: return "int";
    case 0x0D: return "float";
    case 0x0E: return "double";
    default: return "unknown";
  }
}

std::string hex(uint64_t v, int digits) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%0*llx", digits, static_cast<unsigned long long>(v));
  return buf;
}

std::string dims_str(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

struct IdxHeader {
  std::vector<int64_t> dims;
  size_t header_bytes = 0;
  size_t data_bytes = 0;  // prod(dims), checked against max_bytes
};

// Reads the header from the first n bytes of the (decompressed) file. `what` is "the file"
// or "the inflated stream", for messages.
IdxHeader parse_header(const unsigned char* p, size_t n, const std::string& name, size_t max_bytes, const char* what) {
  if (n < 4)
    REMAT_THROW(name, ": truncated IDX header: ", what, " has ", n, " bytes, fewer than the 4 of the magic number");
  const uint32_t magic = (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
  if (p[0] != 0 || p[1] != 0)
    REMAT_THROW(name, ": bad magic ", hex(magic, 8),
                ": not an IDX file (it starts with two zero bytes, a type code and a dimension count)");
  if (p[2] != 0x08)
    REMAT_THROW(name, ": magic ", hex(magic, 8), ": IDX type code ", hex(p[2], 2), " (", idx_type_name(p[2]),
                ") is not supported; only 0x08 (unsigned byte)");
  const size_t ndims = p[3];
  if (ndims == 0) REMAT_THROW(name, ": magic ", hex(magic, 8), ": dimension count is 0");
  IdxHeader h;
  h.header_bytes = 4 + 4 * ndims;
  if (n < h.header_bytes)
    REMAT_THROW(name, ": truncated IDX header: ", ndims, " dimensions need ", h.header_bytes, " header bytes, ", what,
                " has ", n);
  const size_t budget = max_bytes > h.header_bytes ? max_bytes - h.header_bytes : 0;
  size_t count = 1;
  for (size_t i = 0; i < ndims; ++i) {
    const unsigned char* q = p + 4 + 4 * i;
    const uint32_t d = (uint32_t{q[0]} << 24) | (uint32_t{q[1]} << 16) | (uint32_t{q[2]} << 8) | q[3];
    h.dims.push_back(d);
    if (d == 0) REMAT_THROW(name, ": dimension ", i, " is 0");
    // count * d <= budget, without overflow
    if (count > budget / d) {
      std::vector<int64_t> all;
      for (size_t j = 0; j < ndims; ++j) {
        const unsigned char* r = p + 4 + 4 * j;
        all.push_back((int64_t{r[0]} << 24) | (int64_t{r[1]} << 16) | (int64_t{r[2]} << 8) | r[3]);
      }
      REMAT_THROW(name, ": dims ", dims_str(all), " describe more data than the limit of ",
                  detail::describe_bytes(max_bytes), " for an IDX file");
    }
    count *= d;
  }
  h.data_bytes = count;
  return h;
}

void check_normalisation(float mean, float std, int num_classes) {
  REMAT_CHECK(std::isfinite(mean), "IDX normalisation: mean ", mean, " is not finite");
  REMAT_CHECK(std::isfinite(std) && std > 0.0f, "IDX normalisation: std ", std, " must be finite and positive");
  REMAT_CHECK(num_classes >= 1, "IDX labels: num_classes ", num_classes, " must be at least 1");
}

bool is_file(const std::string& p) {
  std::error_code ec;
  return std::filesystem::is_regular_file(p, ec);
}

}  // namespace

IdxArray parse_idx(std::string bytes, const std::string& name, size_t max_bytes) {
  IdxArray out;
  out.name = name;
  if (detail::is_gzip(bytes)) {
    // Inflate the header first, to learn how much data the file may hold, then the whole
    // stream bounded by exactly that.
    const std::string head = detail::gunzip(bytes, kMaxIdxHeader, name, /*stop_at_limit=*/true);
    const IdxHeader h = parse_header(reinterpret_cast<const unsigned char*>(head.data()), head.size(), name, max_bytes,
                                     "the inflated stream");
    const size_t total = h.header_bytes + h.data_bytes;
    std::string all = detail::gunzip(bytes, total, name);
    if (all.size() < total)
      REMAT_THROW(name, ": truncated data: dims ", dims_str(h.dims), " need ", h.data_bytes, " bytes after the ",
                  h.header_bytes, "-byte header, the inflated stream has ", all.size() - h.header_bytes);
    bytes = std::move(all);
    out.dims = h.dims;
  } else {
    const IdxHeader h =
        parse_header(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), name, max_bytes, "the file");
    const size_t have = bytes.size() - h.header_bytes;
    if (have < h.data_bytes)
      REMAT_THROW(name, ": truncated data: dims ", dims_str(h.dims), " need ", h.data_bytes, " bytes after the ",
                  h.header_bytes, "-byte header, the file has ", have);
    if (have > h.data_bytes)
      REMAT_THROW(name, ": ", have - h.data_bytes, " trailing bytes after the ", h.data_bytes,
                  " bytes of data that dims ", dims_str(h.dims), " describe");
    out.dims = h.dims;
  }
  bytes.erase(0, 4 + 4 * out.dims.size());
  out.data = std::move(bytes);
  return out;
}

ImageDataset idx_dataset(const IdxArray& images, const IdxArray& labels, float mean, float std, int num_classes) {
  check_normalisation(mean, std, num_classes);
  if (images.dims.size() != 3)
    REMAT_THROW(images.name, ": an image file has 3 dims [N, H, W]; this one has ", dims_str(images.dims));
  if (labels.dims.size() != 1)
    REMAT_THROW(labels.name, ": a label file has 1 dim [N]; this one has ", dims_str(labels.dims));
  const int64_t n = images.dims[0], h = images.dims[1], w = images.dims[2];
  if (labels.dims[0] != n)
    REMAT_THROW(labels.name, ": label count ", labels.dims[0], " does not match the image count ", n, " of ",
                images.name);
  // parse_idx guarantees data.size() == prod(dims) > 0; a hand-made IdxArray may not.
  REMAT_CHECK(n > 0 && h > 0 && w > 0 && h <= INT64_MAX / w && n <= INT64_MAX / (h * w) &&
                  images.data.size() == static_cast<size_t>(n * h * w),
              images.name, ": ", images.data.size(), " bytes of pixels for dims ", dims_str(images.dims));
  REMAT_CHECK(labels.data.size() == static_cast<size_t>(n), labels.name, ": ", labels.data.size(),
              " bytes of labels for dims ", dims_str(labels.dims));
  for (int64_t i = 0; i < n; ++i) {
    const int label = static_cast<unsigned char>(labels.data[static_cast<size_t>(i)]);
    if (label >= num_classes)
      REMAT_THROW(labels.name, ": label ", label, " at index ", i, " is >= num_classes ", num_classes);
  }

  TagScope scope(MemoryCategory::input, "data", Phase::setup);
  ImageDataset d;
  d.num_classes = num_classes;
  d.source = images.name + " + " + labels.name;
  d.images = Tensor::empty(Shape{n, 1, h, w}, Device::cpu(), DType::f32);
  d.labels = Tensor::empty(Shape{n}, Device::cpu(), DType::i32);
  std::array<float, 256> lut{};
  for (int p = 0; p < 256; ++p) lut[static_cast<size_t>(p)] = (static_cast<float>(p) / 255.0f - mean) / std;
  float* px = d.images.f32();
  const auto* src = reinterpret_cast<const unsigned char*>(images.data.data());
  const size_t count = images.data.size();
  for (size_t i = 0; i < count; ++i) px[i] = lut[src[i]];
  int32_t* lb = d.labels.i32();
  for (int64_t i = 0; i < n; ++i) lb[i] = static_cast<unsigned char>(labels.data[static_cast<size_t>(i)]);
  return d;
}

ImageDataset load_idx(const std::string& images_path, const std::string& labels_path, float mean, float std,
                      int num_classes) {
  check_normalisation(mean, std, num_classes);
  IdxArray labels = parse_idx(read_file(labels_path), labels_path);
  IdxArray images = parse_idx(read_file(images_path), images_path);
  return idx_dataset(images, labels, mean, std, num_classes);
}

std::string default_fashion_mnist_dir() {
  const char* env = std::getenv("REMAT_FASHION_MNIST_DIR");
  return env && *env ? env : kFashionMnistDir;
}

std::pair<std::string, std::string> fashion_mnist_paths(const std::string& dir, const std::string& split) {
  std::string prefix;
  if (split == "train")
    prefix = "train";
  else if (split == "test")
    prefix = "t10k";
  else
    REMAT_THROW("Fashion-MNIST: unknown split \"", split, "\" (expected \"train\" or \"test\")");
  auto find = [&](const std::string& stem) {
    const std::string base = (std::filesystem::path(dir) / stem).string();
    for (const std::string& p : {base + ".gz", base})
      if (is_file(p)) return p;
    REMAT_THROW("Fashion-MNIST ", split, " files not found: neither ", base, ".gz nor ", base,
                " exists. Install the Debian package dataset-fashion-mnist (it puts them in ", kFashionMnistDir,
                "), or point REMAT_FASHION_MNIST_DIR at a directory holding them");
  };
  return {find(prefix + "-images-idx3-ubyte"), find(prefix + "-labels-idx1-ubyte")};
}

}  // namespace remat
