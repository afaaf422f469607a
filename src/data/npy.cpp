// NumPy .npy files (numpy.lib.format): the magic "\x93NUMPY", a major and minor version,
// the header's length (2 bytes little-endian in version 1, 4 in versions 2 and 3), a
// Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (N, ...), }
// padded to a multiple of 64 bytes, then the elements.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "remat/data.h"
#include "remat/error.h"
#include "remat/io.h"
#include "remat/memory.h"

namespace remat {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;

// The text after `key` and its colon in the header dict; throws where the key is absent.
size_t value_of(const std::string& header, const std::string& key, const std::string& name) {
  const size_t k = header.find("'" + key + "'");
  REMAT_CHECK(k != std::string::npos, name, ": the .npy header has no '", key, "': ", header);
  size_t p = header.find(':', k);
  REMAT_CHECK(p != std::string::npos, name, ": the .npy header's '", key, "' has no value: ", header);
  ++p;
  while (p < header.size() && header[p] == ' ') ++p;
  return p;
}

// "<f4" -> kind 'f', 4 bytes; a structured or big-endian type is refused with the fix.
void parse_descr(const std::string& header, NpyArray& a) {
  const size_t p = value_of(header, "descr", a.name);
  REMAT_CHECK(p < header.size() && header[p] == '\'', a.name,
              ": a structured array (fields of several types) is not an array of numbers; save one field, "
              "e.g. np.save(path, arr['x'])");
  const size_t end = header.find('\'', p + 1);
  REMAT_CHECK(end != std::string::npos, a.name, ": the .npy header's 'descr' is not a quoted string: ", header);
  const std::string d = header.substr(p + 1, end - p - 1);
  REMAT_CHECK(d.size() >= 3 && (d[0] == '<' || d[0] == '|' || d[0] == '=' || d[0] == '>'), a.name, ": the dtype '", d,
              "' is not one remat reads (a float, integer or bool type)");
  a.kind = d[1];
  char* rest = nullptr;
  const long bytes = std::strtol(d.c_str() + 2, &rest, 10);
  const bool known =
      *rest == '\0' && ((a.kind == 'f' && (bytes == 4 || bytes == 8)) ||
                        ((a.kind == 'i' || a.kind == 'u') && (bytes == 1 || bytes == 2 || bytes == 4 || bytes == 8)) ||
                        (a.kind == 'b' && bytes == 1));
  REMAT_CHECK(known, a.name, ": the dtype '", d,
              "' is not one remat reads: float32, float64, signed or unsigned integers, bool (save with "
              "arr.astype('float32') for floats)");
  a.item_bytes = static_cast<int>(bytes);
  REMAT_CHECK(d[0] != '>' || bytes == 1, a.name, ": the dtype '", d,
              "' is big-endian; save it little-endian: arr.astype(arr.dtype.newbyteorder('<'))");
}

void parse_shape(const std::string& header, NpyArray& a) {
  size_t p = value_of(header, "shape", a.name);
  REMAT_CHECK(p < header.size() && header[p] == '(', a.name, ": the .npy header's 'shape' is not a tuple: ", header);
  const size_t end = header.find(')', p);
  REMAT_CHECK(end != std::string::npos, a.name, ": the .npy header's 'shape' does not close: ", header);
  ++p;
  while (p < end) {
    while (p < end && (header[p] == ' ' || header[p] == ',')) ++p;
    if (p >= end) break;
    char* next = nullptr;
    const long long v = std::strtoll(header.c_str() + p, &next, 10);
    REMAT_CHECK(next != header.c_str() + p && v >= 0, a.name,
                ": the .npy header's 'shape' is not a tuple of sizes: ", header);
    a.shape.push_back(v);
    p = static_cast<size_t>(next - header.c_str());
  }
}

template <typename T>
double read_as(const std::string& data, int64_t k) {
  T v;
  std::memcpy(&v, data.data() + k * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return static_cast<double>(v);
}

// A shape as NumPy writes a tuple: "(2, 3)", and "(5,)" for one dimension.
std::string shape_text(const std::vector<int64_t>& dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return "(" + s + (dims.size() == 1 ? ",)" : ")");
}

}  // namespace

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string NpyArray::dtype() const {
  return std::string(item_bytes == 1 ? "|" : "<") + kind + std::to_string(item_bytes);
}

double NpyArray::at(int64_t k) const {
  switch (kind) {
    case 'f': return item_bytes == 4 ? read_as<float>(data, k) : read_as<double>(data, k);
    case 'b': return data[static_cast<size_t>(k)] != 0 ? 1.0 : 0.0;
    case 'i':
      switch (item_bytes) {
        case 1: return read_as<int8_t>(data, k);
        case 2: return read_as<int16_t>(data, k);
        case 4: return read_as<int32_t>(data, k);
        default: return read_as<int64_t>(data, k);
      }
    default:
      switch (item_bytes) {
        case 1: return read_as<uint8_t>(data, k);
        case 2: return read_as<uint16_t>(data, k);
        case 4: return read_as<uint32_t>(data, k);
        default: return read_as<uint64_t>(data, k);
      }
  }
}

NpyArray parse_npy(const std::string& bytes, const std::string& name) {
  NpyArray a;
  a.name = name;
  REMAT_CHECK(bytes.size() >= kMagicBytes + 4 && bytes.compare(0, kMagicBytes, kMagic, kMagicBytes) == 0, name,
              ": not a .npy file (it does not start with \\x93NUMPY; np.save writes one)");
  const auto major = static_cast<unsigned char>(bytes[6]), minor = static_cast<unsigned char>(bytes[7]);
  REMAT_CHECK((major == 1 || major == 2 || major == 3) && minor == 0, name, ": .npy format version ",
              static_cast<int>(major), ".", static_cast<int>(minor), " is not one remat reads (1.0, 2.0, 3.0)");
  const size_t len_bytes = major == 1 ? 2 : 4;
  REMAT_CHECK(bytes.size() >= 8 + len_bytes, name, ": truncated in the .npy header");
  size_t header_len = 0;
  for (size_t i = 0; i < len_bytes; ++i)
    header_len |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
  const size_t start = 8 + len_bytes;
  REMAT_CHECK(header_len <= bytes.size() - start, name, ": truncated in the .npy header (it says ", header_len,
              " bytes; ", bytes.size() - start, " follow)");
  const std::string header = bytes.substr(start, header_len);
  REMAT_CHECK(header.find('{') != std::string::npos && header.find('}') != std::string::npos, name,
              ": the .npy header is not a dict: ", header);
  parse_descr(header, a);
  const size_t f = value_of(header, "fortran_order", name);
  REMAT_CHECK(header.compare(f, 5, "False") == 0, name,
              ": the array is in Fortran (column-major) order; save it in C order: np.save(path, "
              "np.ascontiguousarray(arr))");
  parse_shape(header, a);
  // The element count against the bytes that follow, before anything is copied (a shape
  // whose product overflows cannot fit).
  const size_t have = bytes.size() - start - header_len;
  size_t want = static_cast<size_t>(a.item_bytes);
  for (int64_t d : a.shape) {
    if (d != 0 && want > (SIZE_MAX / 2) / static_cast<size_t>(d)) {  // the product overflows
      want = SIZE_MAX;
      break;
    }
    want *= static_cast<size_t>(d);
  }
  REMAT_CHECK(want == have, name, ": the header says shape ", shape_text(a.shape), " of ", a.dtype(), ", ",
              want == SIZE_MAX ? std::string("more bytes than the file holds") : std::to_string(want) + " bytes",
              ", but ", have, " bytes follow it", want != SIZE_MAX && want > have ? " (truncated)" : "");
  a.data = bytes.substr(start + header_len);
  return a;
}

NpyArray load_npy(const std::string& path) { return parse_npy(read_file(path), path); }

Tensor npy_images(const NpyArray& x) {
  REMAT_CHECK(x.shape.size() >= 2 && x.shape.size() <= 4, x.name, ": images of shape ", shape_text(x.shape),
              "; expected (N, C, H, W), (N, H, W) or (N, D)");
  REMAT_CHECK(x.kind != 'b', x.name, ": bool images; save them as numbers: arr.astype('float32')");
  const int64_t n = x.shape[0];
  Shape s{n, 1, 1, 1};
  if (x.shape.size() == 4) s = Shape{n, x.shape[1], x.shape[2], x.shape[3]};
  if (x.shape.size() == 3) s = Shape{n, 1, x.shape[1], x.shape[2]};
  if (x.shape.size() == 2) s = Shape{n, 1, 1, x.shape[1]};
  REMAT_CHECK(n > 0 && s.numel() > 0, x.name, ": no images (shape ", shape_text(x.shape), ")");
  TagScope scope(MemoryCategory::input, "data", Phase::setup);
  Tensor images = Tensor::empty(s, Device::cpu(), DType::f32);
  const double scale = x.kind == 'u' && x.item_bytes == 1 ? 1.0 / 255.0 : 1.0;
  float* px = images.f32();
  for (int64_t k = 0; k < s.numel(); ++k) {
    const double v = x.at(k) * scale;
    px[k] = static_cast<float>(v);
    REMAT_CHECK(std::isfinite(px[k]), x.name, ": element ", k, " is ", v,
                std::isfinite(v) ? " (beyond float32's range)" : "", "; every value must be finite");
  }
  return images;
}

ImageDataset npy_dataset(const NpyArray& x, const NpyArray& y, int num_classes) {
  ImageDataset d;
  d.num_classes = num_classes;
  d.source = x.name;
  d.images = npy_images(x);
  const int64_t n = d.images.size(0);
  const bool labels_shape = y.shape.size() == 1 || (y.shape.size() == 2 && y.shape[1] == 1);
  REMAT_CHECK(labels_shape, y.name, ": labels of shape ", shape_text(y.shape), "; expected (N,) or (N, 1) class ids");
  REMAT_CHECK(y.kind == 'i' || y.kind == 'u', y.name, ": labels of type ", y.dtype(),
              "; expected integer class ids (save with arr.astype('int64'))");
  REMAT_CHECK(y.shape[0] == n, y.name, ": ", y.shape[0], " labels for the ", n, " images of ", x.name);
  TagScope scope(MemoryCategory::input, "data", Phase::setup);
  d.labels = Tensor::empty(Shape{n}, Device::cpu(), DType::i32);
  int32_t* py = d.labels.i32();
  for (int64_t k = 0; k < n; ++k) {
    const double v = y.at(k);
    REMAT_CHECK(v >= 0 && v < num_classes, y.name, ": label ", k, " is ", static_cast<long long>(v), ", outside the ",
                num_classes, " classes (data.classes)");
    py[k] = static_cast<int32_t>(v);
  }
  return d;
}

void save_npy(const std::string& path, const Tensor& t) {
  REMAT_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::i32, path, ": .npy files of ", dtype_name(t.dtype()),
              " tensors are not written (f32 and i32 are)");
  const Tensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
  std::vector<int64_t> dims;
  for (int i = 0; i < h.shape().rank(); ++i) dims.push_back(h.shape()[i]);
  std::string header = std::string("{'descr': '") + (t.dtype() == DType::f32 ? "<f4" : "<i4") +
                       "', 'fortran_order': False, 'shape': " + shape_text(dims) + ", }";
  // Padded with spaces and a newline so that the data starts at a multiple of 64 bytes.
  const size_t used = kMagicBytes + 2 + 2 + header.size() + 1;
  header += std::string((64 - used % 64) % 64, ' ') + "\n";
  std::string out(kMagic, kMagicBytes);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xFF);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(static_cast<const char*>(h.raw_data()), h.nbytes());
  write_file_atomic(path, out);
}

}  // namespace remat
