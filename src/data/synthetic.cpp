// Synthetic data sets for tests and smoke runs (see data.h for the recipes).
#include <algorithm>
#include <cstdint>

#include "data/random.h"
#include "remat/data.h"
#include "remat/error.h"
#include "remat/memory.h"

namespace remat {

namespace {

constexpr double kImageNoise = 0.5;
// Distinct streams for the parts of a synthetic set, so changing one never shifts another.
constexpr uint64_t kPrototypeStream = 0x70726f746f747970ULL;
constexpr uint64_t kSampleStream = 0x73616d706c657321ULL;

uint64_t stream_seed(uint64_t seed, uint64_t stream, uint64_t index) {
  return detail::splitmix64(detail::splitmix64(seed ^ stream) + index);
}

}  // namespace

ImageDataset synthetic_images(int64_t n, int channels, int height, int width, int num_classes, uint64_t seed) {
  REMAT_CHECK(n > 0 && channels > 0 && height > 0 && width > 0, "synthetic_images: sizes n=", n, " c=", channels,
              " h=", height, " w=", width, " must be positive");
  REMAT_CHECK(num_classes >= 1, "synthetic_images: num_classes ", num_classes, " must be at least 1");
  const int64_t per = int64_t{channels} * height * width;
  const Shape shape{n, channels, height, width};  // throws if n * per overflows

  std::vector<float> prototypes(static_cast<size_t>(num_classes) * static_cast<size_t>(per));
  for (int k = 0; k < num_classes; ++k) {
    detail::SplitMix g(stream_seed(seed, kPrototypeStream, static_cast<uint64_t>(k)));
    for (int64_t j = 0; j < per; ++j) prototypes[static_cast<size_t>(k * per + j)] = (g() >> 63) ? 1.0f : -1.0f;
  }

  TagScope scope(MemoryCategory::input, "data", Phase::setup);
  ImageDataset d;
  d.num_classes = num_classes;
  d.source = "synthetic images (n=" + std::to_string(n) + ", seed=" + std::to_string(seed) + ")";
  d.images = Tensor::empty(shape, Device::cpu(), DType::f32);
  d.labels = Tensor::empty(Shape{n}, Device::cpu(), DType::i32);
  float* px = d.images.f32();
  int32_t* lb = d.labels.i32();
  for (int64_t i = 0; i < n; ++i) {
    detail::SplitMix g(stream_seed(seed, kSampleStream, static_cast<uint64_t>(i)));
    const auto label = static_cast<int32_t>(detail::uniform_below(g, static_cast<uint64_t>(num_classes)));
    lb[i] = label;
    const float* proto = prototypes.data() + static_cast<size_t>(label) * static_cast<size_t>(per);
    for (int64_t j = 0; j < per; ++j) px[i * per + j] = proto[j] + static_cast<float>(kImageNoise * g.normal());
  }
  return d;
}

TextDataset synthetic_text(int64_t n_tokens, int vocab_size, uint64_t seed) {
  REMAT_CHECK(n_tokens > 0, "synthetic_text: n_tokens ", n_tokens, " must be positive");
  REMAT_CHECK(vocab_size >= 1 && vocab_size <= 256, "synthetic_text: vocab_size ", vocab_size,
              " must be in [1, 256] (tokens are bytes)");
  TextDataset d;
  d.source = "synthetic text (n=" + std::to_string(n_tokens) + ", vocab=" + std::to_string(vocab_size) +
             ", seed=" + std::to_string(seed) + ")";
  const int first = std::min(32, 256 - vocab_size);
  for (int c = 0; c < vocab_size; ++c) d.vocab.push_back(static_cast<char>(first + c));
  const auto v = static_cast<uint64_t>(vocab_size);
  detail::SplitMix g(stream_seed(seed, kSampleStream, 0));
  d.tokens.resize(static_cast<size_t>(n_tokens));
  uint64_t t = detail::uniform_below(g, v);
  for (int64_t i = 0; i < n_tokens; ++i) {
    d.tokens[static_cast<size_t>(i)] = static_cast<int32_t>(t);
    t = detail::uniform_below(g, 4) != 0 ? (7 * t + 3) % v : detail::uniform_below(g, v);
  }
  return d;
}

}  // namespace remat
