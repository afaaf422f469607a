// What the fuzz targets do with one input, shared with test_data.cpp, which replays the
// committed seed corpus through the same code in every build (no clang needed).
//
// A remat::Error is the expected answer to a bad input. Anything else that escapes is a
// bug: another exception type, a crash, or a broken invariant, which is raised as
// remat::fuzz::InvariantBroken (uncaught in a fuzz target, so libFuzzer reports it).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "remat/data.h"
#include "remat/error.h"
#include "remat/io.h"

namespace remat::fuzz {

struct InvariantBroken : std::logic_error {
  using std::logic_error::logic_error;
};

#define REMAT_FUZZ_ASSERT(cond)                                                                          \
  do {                                                                                                   \
    if (!(cond)) throw ::remat::fuzz::InvariantBroken(std::string("fuzz invariant broken: ") + #cond); \
  } while (0)

// IDX input layout: u16 little-endian length L, then L bytes of a label file, then the
// rest as an image file (a short input leaves the image file empty). Returns 1 when a data
// set was built from the pair, else 0.
inline int run_idx_input(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t rest = size - 2;
  const size_t nl = std::min<size_t>(rest, size_t{data[0]} | (size_t{data[1]} << 8));
  const char* p = reinterpret_cast<const char*>(data) + 2;
  std::optional<IdxArray> labels, images;
  auto parse = [](std::string bytes, const char* name, std::optional<IdxArray>& out) {
    try {
      IdxArray a = parse_idx(std::move(bytes), name);
      size_t count = 1;
      for (int64_t d : a.dims) {
        REMAT_FUZZ_ASSERT(d > 0);
        count *= static_cast<size_t>(d);
      }
      REMAT_FUZZ_ASSERT(!a.dims.empty() && a.data.size() == count && count <= kMaxIdxBytes);
      out = std::move(a);
    } catch (const Error&) {
    }
  };
  parse(std::string(p, nl), "labels.idx", labels);
  parse(std::string(p + nl, rest - nl), "images.idx", images);
  if (!labels || !images) return 0;
  try {
    ImageDataset d = idx_dataset(*images, *labels);
    const int64_t n = d.images.size(0);
    REMAT_FUZZ_ASSERT(d.labels.numel() == n && d.images.numel() == static_cast<int64_t>(images->data.size()));
    for (int32_t l : d.labels.to_ints()) REMAT_FUZZ_ASSERT(l >= 0 && l < d.num_classes);
    Batch b = image_batch(d, {n - 1, 0}, Device::cpu());
    REMAT_FUZZ_ASSERT(b.input.size(0) == 2 && b.targets.numel() == 2);
    return 1;
  } catch (const Error&) {
    return 0;
  }
}

// Safetensors input: the whole file. Returns 1 when it parsed.
inline int run_safetensors_input(const uint8_t* data, size_t size) {
  try {
    SafetensorsFile f = SafetensorsFile::parse(std::string(reinterpret_cast<const char*>(data), size), "fuzz.safetensors");
    std::vector<std::pair<size_t, size_t>> ranges;
    for (const SafetensorsEntry& e : f.entries()) {
      REMAT_FUZZ_ASSERT(e.begin <= e.end && e.end <= size);
      REMAT_FUZZ_ASSERT(e.end - e.begin == static_cast<size_t>(e.shape.numel()) * dtype_size(e.dtype));
      if (e.end > e.begin) ranges.emplace_back(e.begin, e.end);
      if (e.dtype == DType::f32 || e.dtype == DType::i32) {
        Tensor t = f.tensor(e.name);
        REMAT_FUZZ_ASSERT(t.nbytes() == e.end - e.begin && t.shape() == e.shape);
      }
    }
    // The parser promises that tensors do not overlap.
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) REMAT_FUZZ_ASSERT(ranges[i].first >= ranges[i - 1].second);
    return 1;
  } catch (const Error&) {
    return 0;
  }
}

}  // namespace remat::fuzz
