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
#include "remat/token_shards.h"

namespace remat::fuzz {

struct InvariantBroken : std::logic_error {
  using std::logic_error::logic_error;
};

#define REMAT_FUZZ_ASSERT(cond)                                                                        \
  do {                                                                                                 \
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
    REMAT_FUZZ_ASSERT(b.input().size(0) == 2 && b.targets().numel() == 2);
    return 1;
  } catch (const Error&) {
    return 0;
  }
}

// Safetensors input: the whole file. Returns 1 when it parsed.
inline int run_safetensors_input(const uint8_t* data, size_t size) {
  try {
    SafetensorsFile f =
        SafetensorsFile::parse(std::string(reinterpret_cast<const char*>(data), size), "fuzz.safetensors");
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

// .npy input: the whole file. Returns 1 when it parsed and made a data set. A parsed array
// holds exactly its elements' bytes; as images (with as many zero labels), every element
// comes through as the same value.
inline int run_npy_input(const uint8_t* data, size_t size) {
  NpyArray a;
  try {
    a = parse_npy(std::string(reinterpret_cast<const char*>(data), size), "fuzz.npy");
  } catch (const Error&) {
    return 0;
  }
  int64_t n = 1;
  for (int64_t d : a.shape) {
    REMAT_FUZZ_ASSERT(d >= 0);
    n *= d;
  }
  REMAT_FUZZ_ASSERT(a.data.size() == static_cast<size_t>(n) * static_cast<size_t>(a.item_bytes) &&
                    a.data.size() <= size);
  if (a.shape.empty() || a.shape[0] > (1 << 20)) return 0;
  NpyArray y;
  y.shape = {a.shape[0]};
  y.kind = 'u';
  y.item_bytes = 1;
  y.data.assign(static_cast<size_t>(a.shape[0]), '\0');
  y.name = "labels.npy";
  try {
    ImageDataset d = npy_dataset(a, y, 1);
    REMAT_FUZZ_ASSERT(d.images.numel() == n && d.labels.numel() == a.shape[0]);
    const std::vector<float> v = d.images.to_vector();
    const double scale = a.kind == 'u' && a.item_bytes == 1 ? 1.0 / 255.0 : 1.0;
    for (int64_t k = 0; k < n; ++k) REMAT_FUZZ_ASSERT(v[static_cast<size_t>(k)] == static_cast<float>(a.at(k) * scale));
    return 1;
  } catch (const Error&) {
    return 0;
  }
}

// Token shard input: the whole file (llm.c's format). Returns 1 when it validated. A valid
// shard is then read as windows of a few lengths: the first and last window's tokens must
// come back as the file's (targets shifted by one), and the vocabulary check must refuse
// exactly the tokens >= the vocabulary.
inline int run_token_shard_input(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  TokenShards s;
  try {
    s = TokenShards::from_bytes(bytes, "fuzz.bin");
  } catch (const Error&) {
    return 0;
  }
  REMAT_FUZZ_ASSERT(size >= kShardHeaderBytes);
  const auto n = static_cast<int64_t>((size - kShardHeaderBytes) / 2);
  REMAT_FUZZ_ASSERT(s.tokens() == n && n > 0 && kShardHeaderBytes + 2 * static_cast<size_t>(n) == size);
  auto token = [&](int64_t i) {
    const size_t at = kShardHeaderBytes + 2 * static_cast<size_t>(i);
    return static_cast<int32_t>(data[at] | (data[at + 1] << 8));
  };
  for (int64_t t : {int64_t{1}, int64_t{3}, int64_t{16}}) {
    const int64_t w = s.windows(t);
    REMAT_FUZZ_ASSERT(w == (n - 1) / t);
    if (w == 0) continue;
    const std::vector<int64_t> idx{w - 1, 0};
    try {
      const Batch b = s.batch(idx, t, 65536, Device::cpu());
      const std::vector<int32_t> in = b.input().to_ints(), tg = b.targets().to_ints();
      for (size_t k = 0; k < idx.size(); ++k)
        for (int64_t j = 0; j < t; ++j) {
          REMAT_FUZZ_ASSERT(in[k * t + j] == token(idx[k] * t + j));
          REMAT_FUZZ_ASSERT(tg[k * t + j] == token(idx[k] * t + j + 1));
        }
    } catch (const Error&) {
      REMAT_FUZZ_ASSERT(false);  // every uint16 is inside a vocabulary of 65536
    }
    // The last window's largest token (input or target) is the smallest vocabulary it fits.
    int32_t top = 0;
    for (int64_t i = (w - 1) * t; i <= w * t; ++i) top = std::max(top, token(i));
    try {
      s.batch({w - 1}, t, top + 1, Device::cpu());
    } catch (const Error&) {
      REMAT_FUZZ_ASSERT(false);
    }
    bool threw = false;
    try {
      s.batch({w - 1}, t, top, Device::cpu());
    } catch (const Error&) {
      threw = true;
    }
    REMAT_FUZZ_ASSERT(threw);
  }
  return 1;
}

}  // namespace remat::fuzz
