// Data: IDX files (raw, gzip, crafted), Fashion-MNIST and fortunes when installed,
// the batch sampler, batches, text, synthetic data, and the fuzz seed corpus.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "fuzz/harness.h"
#include "remat/data.h"
#include "remat/io.h"
#include "remat/memory.h"
#include "remat/philox.h"
#include "support/expect_error.h"

namespace fs = std::filesystem;
using remat::BatchSampler;
using remat::Device;
using remat::IdxArray;
using remat::ImageDataset;
using remat::TextDataset;

namespace {

// A directory under the system temp dir, removed with everything in it.
class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(fs::temp_directory_path() / ("remat_test_data_" + std::to_string(::getpid()) + "_" + tag)) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream(file(name), std::ios::binary) << bytes;
    return file(name);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

std::string idx(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data, uint8_t type = 0x08) {
  std::string s{'\0', '\0', static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) s += be32(d);
  s.append(data.begin(), data.end());
  return s;
}

// gzip with zlib here, independently of the reader's inflate code.
std::string gzip(const std::string& raw) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&zs, raw.size()) + 64, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
  zs.avail_in = static_cast<uInt>(raw.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// The message of the remat::Error `f` throws ("" when it throws none).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const remat::Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR_NAMING(statement, file, substring)                                                           \
  do {                                                                                                            \
    const std::string msg_ = error_of([&] { statement; });                                                        \
    EXPECT_FALSE(msg_.empty()) << #statement " did not throw remat::Error";                                       \
    EXPECT_NE(msg_.find(file), std::string::npos) << "message does not name " << (file) << ": " << msg_;          \
    EXPECT_NE(msg_.find(substring), std::string::npos) << "message: " << msg_ << "\n  expected: " << (substring); \
  } while (0)

// Sets an environment variable for one scope and restores it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

const std::vector<uint8_t> kPixels = {0, 51, 102, 153, 204, 255, 10, 20, 30, 40, 50, 60};  // 2 images 2x3
const std::vector<uint8_t> kLabels = {7, 2};

}  // namespace

// ---------------------------------------------------------------------------------------
// IDX
// ---------------------------------------------------------------------------------------

TEST(Idx, RawFilesRoundTripAndNormalise) {
  TempDir dir("raw");
  const auto ip = dir.write("img-idx3-ubyte", idx({2, 2, 3}, kPixels));
  const auto lp = dir.write("lab-idx1-ubyte", idx({2}, kLabels));
  const float mean = 0.25f, sd = 0.5f;
  ImageDataset d = remat::load_idx(ip, lp, mean, sd, 10);
  EXPECT_EQ(d.images.shape(), (remat::Shape{2, 1, 2, 3}));
  EXPECT_EQ(d.images.dtype(), remat::DType::f32);
  EXPECT_EQ(d.labels.to_ints(), (std::vector<int32_t>{7, 2}));
  EXPECT_EQ(d.num_classes, 10);
  EXPECT_NE(d.source.find("img-idx3-ubyte"), std::string::npos);
  const auto px = d.images.to_vector();
  for (size_t i = 0; i < kPixels.size(); ++i) EXPECT_FLOAT_EQ(px[i], (kPixels[i] / 255.0f - mean) / sd) << i;
  EXPECT_EQ(d.images.storage()->block().category, remat::MemoryCategory::input);
}

TEST(Idx, GzipFilesGiveTheSameData) {
  TempDir dir("gz");
  const auto raw = remat::load_idx(dir.write("i", idx({2, 2, 3}, kPixels)), dir.write("l", idx({2}, kLabels)));
  const auto gz =
      remat::load_idx(dir.write("i.gz", gzip(idx({2, 2, 3}, kPixels))), dir.write("l.gz", gzip(idx({2}, kLabels))));
  const auto mixed = remat::load_idx(dir.file("i"), dir.file("l.gz"));
  EXPECT_EQ(gz.images.to_vector(), raw.images.to_vector());
  EXPECT_EQ(gz.labels.to_ints(), raw.labels.to_ints());
  EXPECT_EQ(mixed.images.to_vector(), raw.images.to_vector());
  // Two gzip members (as `cat a.gz b.gz` makes) are one stream.
  const std::string labels = idx({2}, kLabels);
  const auto two = remat::parse_idx(gzip(labels.substr(0, 3)) + gzip(labels.substr(3)), "two.gz");
  EXPECT_EQ(two.dims, (std::vector<int64_t>{2}));
  EXPECT_EQ(two.data, std::string("\x07\x02", 2));
}

TEST(Idx, LargerGzipFileInflatesInSeveralSteps) {
  // 300x17x19 pixels: more than the first inflate buffer, so the buffer has to grow.
  std::vector<uint8_t> px(300 * 17 * 19);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>((i * 37 + i / 7) & 0xff);
  const IdxArray a = remat::parse_idx(gzip(idx({300, 17, 19}, px)), "big.gz");
  EXPECT_EQ(a.dims, (std::vector<int64_t>{300, 17, 19}));
  ASSERT_EQ(a.data.size(), px.size());
  EXPECT_TRUE(std::equal(px.begin(), px.end(), reinterpret_cast<const uint8_t*>(a.data.data())));
}

TEST(Idx, MalformedFilesNameTheFileAndField) {
  const std::string f = "t10k-labels-idx1-ubyte.gz";
  auto parse = [&](const std::string& bytes) { return remat::parse_idx(bytes, f); };
  const std::string good = idx({2, 2, 3}, kPixels);
  EXPECT_ERROR_NAMING(parse(""), f, "fewer than the 4 of the magic number");
  EXPECT_ERROR_NAMING(parse(std::string("\0\0", 2)), f, "truncated IDX header");
  EXPECT_ERROR_NAMING(parse("\x01\x02\x08\x01" + be32(1) + "x"), f, "bad magic 0x01020801");
  EXPECT_ERROR_NAMING(parse(idx({1}, {0, 0, 0, 0}, 0x0D)), f, "type code 0x0d (float) is not supported");
  EXPECT_ERROR_NAMING(parse(std::string("\0\0\x08\0", 4)), f, "dimension count is 0");
  EXPECT_ERROR_NAMING(parse(good.substr(0, 10)), f, "3 dimensions need 16 header bytes, the file has 10");
  EXPECT_ERROR_NAMING(parse(good.substr(0, good.size() - 1)), f, "truncated data: dims [2, 2, 3] need 12 bytes");
  EXPECT_ERROR_NAMING(parse(good + "zz"), f, "2 trailing bytes");
  EXPECT_ERROR_NAMING(parse(idx({2, 0, 3}, {})), f, "dimension 1 is 0");
  // Dims whose product overflows 64 bits, and a product just over the 1 GiB cap.
  EXPECT_ERROR_NAMING(parse(idx({0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, {})), f,
                      "dims [4294967295, 4294967295, 4294967295] describe more data than the limit of 1 GiB");
  EXPECT_ERROR_NAMING(parse(idx({1u << 15, 1u << 15}, {})), f, "limit of 1 GiB");
  // The same through gzip.
  EXPECT_ERROR_NAMING(parse(gzip("\x01\x02\x08\x01" + be32(1) + "x")), f, "bad magic");
  EXPECT_ERROR_NAMING(parse(gzip(good.substr(0, good.size() - 1))), f, "the inflated stream has 11");
  EXPECT_ERROR_NAMING(parse(gzip(good.substr(0, 6))), f, "truncated IDX header");
}

TEST(Idx, GzipBombsAndDamagedStreamsAreRefused) {
  const std::string f = "bomb-idx3-ubyte.gz";
  // A header that claims 40000x40000 bytes (1.6 GB), in a stream of a few bytes: refused
  // from the header alone, before anything is inflated beyond it.
  EXPECT_ERROR_NAMING(remat::parse_idx(gzip(idx({1, 40000, 40000}, {})), f), f, "limit of 1 GiB");
  // A header that claims 4 bytes, followed by 64 MiB of zeros (compressing to ~64 KiB):
  // inflation stops one byte after the 16 bytes the file may hold.
  std::string bomb = idx({1, 2, 2}, {1, 2, 3, 4});
  bomb.append(size_t{64} << 20, '\0');
  const std::string z = gzip(bomb);
  EXPECT_LT(z.size(), size_t{1} << 20);
  EXPECT_ERROR_NAMING(remat::parse_idx(z, f), f, "inflates to more than 20 bytes");
  // A caller's own, smaller cap.
  EXPECT_ERROR_NAMING(remat::parse_idx(gzip(idx({4, 4}, std::vector<uint8_t>(16))), f, 16), f, "limit of 16 bytes");
  // Damaged streams: truncated, and a flipped byte (zlib's CRC-32 or inflate catches it).
  std::string good = gzip(idx({2, 2, 3}, kPixels));
  EXPECT_ERROR_NAMING(remat::parse_idx(good.substr(0, good.size() - 5), f), f, "gzip stream is truncated");
  std::string flipped = good;
  flipped[flipped.size() - 6] = static_cast<char>(flipped[flipped.size() - 6] ^ 0x55);  // inside the CRC
  EXPECT_ERROR_NAMING(remat::parse_idx(flipped, f), f, "gzip stream is corrupt");
  EXPECT_ERROR_NAMING(remat::parse_idx(good + "garbage!", f), f, "gzip stream is corrupt in member 2");
}

TEST(Idx, PairsAreChecked) {
  TempDir dir("pairs");
  const auto ip = dir.write("images-idx3-ubyte", idx({2, 2, 3}, kPixels));
  const auto lp = dir.write("t10k-labels-idx1-ubyte", idx({6}, {1, 2, 3, 4, 11, 5}));
  EXPECT_ERROR_NAMING(remat::load_idx(ip, lp), lp, "label count 6 does not match the image count 2 of");
  const auto lp2 = dir.write("t10k-labels-idx1-ubyte.gz", gzip(idx({6}, {1, 2, 3, 4, 9, 11})));
  const auto ip2 = dir.write("i6", idx({6, 1, 1}, {1, 2, 3, 4, 5, 6}));
  EXPECT_REMAT_ERROR(remat::load_idx(ip2, lp2), "t10k-labels-idx1-ubyte.gz: label 11 at index 5 is >= num_classes 10");
  EXPECT_NO_THROW(remat::load_idx(ip2, lp2, 0.3f, 0.3f, 12));
  const auto lp3 = dir.write("edge-labels", idx({6}, {0, 1, 2, 3, 4, 10}));  // == num_classes
  EXPECT_REMAT_ERROR(remat::load_idx(ip2, lp3), "edge-labels: label 10 at index 5 is >= num_classes 10");
  EXPECT_NO_THROW(remat::load_idx(ip2, lp3, 0.3f, 0.3f, 11));
  // Images and labels swapped: the dims say which is which.
  EXPECT_ERROR_NAMING(remat::load_idx(lp2, ip2), lp2, "an image file has 3 dims [N, H, W]; this one has [6]");
  EXPECT_ERROR_NAMING(remat::load_idx(ip2, ip2), ip2, "a label file has 1 dim [N]");
  EXPECT_REMAT_ERROR(remat::load_idx(ip2, lp2, 0.3f, 0.0f), "std 0 must be finite and positive");
  EXPECT_REMAT_ERROR(remat::load_idx(ip2, dir.file("missing")), "cannot open " + dir.file("missing"));
  // A hand-made IdxArray whose data does not match its dims is refused too.
  IdxArray img{{2, 1, 1}, "x", "hand-made"};
  IdxArray lab{{2}, "\x01\x01", "labels"};
  EXPECT_REMAT_ERROR(remat::idx_dataset(img, lab), "hand-made: 1 bytes of pixels for dims [2, 1, 1]");
}

TEST(FashionMnist, PathsAndDefaultDirectory) {
  {
    ScopedEnv env("REMAT_FASHION_MNIST_DIR", "/some/where");
    EXPECT_EQ(remat::default_fashion_mnist_dir(), "/some/where");
  }
  {
    ScopedEnv env("REMAT_FASHION_MNIST_DIR", "");
    EXPECT_EQ(remat::default_fashion_mnist_dir(), "/usr/share/datasets/fashion-mnist");
  }
  TempDir dir("fmnist");
  EXPECT_REMAT_ERROR(remat::fashion_mnist_paths(dir.path().string(), "train"), "dataset-fashion-mnist");
  EXPECT_REMAT_ERROR(remat::fashion_mnist_paths(dir.path().string(), "valid"), "unknown split \"valid\"");
  dir.write("t10k-images-idx3-ubyte", "x");  // raw is found when there is no .gz
  dir.write("t10k-labels-idx1-ubyte.gz", "x");
  const auto [ip, lp] = remat::fashion_mnist_paths(dir.path().string(), "test");
  EXPECT_EQ(ip, dir.file("t10k-images-idx3-ubyte"));
  EXPECT_EQ(lp, dir.file("t10k-labels-idx1-ubyte.gz"));
}

TEST(FashionMnist, RealFilesIfInstalled) {
  const std::string dir = remat::default_fashion_mnist_dir();
  if (!fs::exists(fs::path(dir) / "train-labels-idx1-ubyte.gz") &&
      !fs::exists(fs::path(dir) / "train-labels-idx1-ubyte"))
    GTEST_SKIP() << "Fashion-MNIST not installed in " << dir << " (Debian package dataset-fashion-mnist)";
  for (const auto& [split, n] : {std::pair<std::string, int64_t>{"train", 60000}, {"test", 10000}}) {
    const auto [ip, lp] = remat::fashion_mnist_paths(dir, split);
    const ImageDataset d = remat::load_idx(ip, lp);
    ASSERT_EQ(d.images.shape(), (remat::Shape{n, 1, 28, 28})) << split;
    ASSERT_EQ(d.labels.shape(), (remat::Shape{n})) << split;
    std::vector<int64_t> per_class(10, 0);
    for (int32_t l : d.labels.to_ints()) {
      ASSERT_TRUE(l >= 0 && l < 10) << l;
      ++per_class[static_cast<size_t>(l)];
    }
    for (int64_t c : per_class) EXPECT_EQ(c, n / 10) << split;  // Fashion-MNIST is balanced
    double sum = 0, sq = 0;
    const float* px = d.images.f32();
    for (int64_t i = 0; i < d.images.numel(); ++i) {
      sum += px[i];
      sq += double(px[i]) * px[i];
    }
    const double mean = sum / static_cast<double>(d.images.numel());
    const double sd = std::sqrt(sq / static_cast<double>(d.images.numel()) - mean * mean);
    EXPECT_NEAR(mean, 0.0, 0.01) << split;  // the defaults are the training set's statistics
    EXPECT_NEAR(sd, 1.0, 0.01) << split;
  }
}

// ---------------------------------------------------------------------------------------
// Batch sampler
// ---------------------------------------------------------------------------------------

namespace {
std::vector<std::vector<int64_t>> take(BatchSampler& s, int k) {
  std::vector<std::vector<int64_t>> out;
  for (int i = 0; i < k; ++i) out.push_back(s.next());
  return out;
}
}  // namespace

TEST(BatchSampler, EachEpochIsAPermutation) {
  for (bool drop_last : {false, true}) {
    BatchSampler s(103, 10, 42, true, drop_last);
    EXPECT_EQ(s.batches_per_epoch(), drop_last ? 10 : 11);
    for (int epoch = 0; epoch < 3; ++epoch) {
      std::vector<int64_t> seen;
      for (int64_t b = 0; b < s.batches_per_epoch(); ++b) {
        const auto batch = s.next();
        EXPECT_EQ(s.epoch(), epoch);
        EXPECT_EQ(batch.size(), (!drop_last && b == 10) ? 3u : 10u);
        seen.insert(seen.end(), batch.begin(), batch.end());
      }
      std::set<int64_t> distinct(seen.begin(), seen.end());
      EXPECT_EQ(distinct.size(), seen.size()) << "an index repeats within an epoch";
      EXPECT_EQ(seen.size(), drop_last ? 100u : 103u);
      EXPECT_TRUE(*distinct.begin() >= 0 && *distinct.rbegin() < 103);
    }
  }
}

TEST(BatchSampler, DeterministicFromSeedAndEpochOnly) {
  BatchSampler a(50, 7, 9, true), b(50, 7, 9, true), c(50, 7, 10, true);
  const auto ra = take(a, 30), rb = take(b, 30), rc = take(c, 30);
  EXPECT_EQ(ra, rb);
  EXPECT_NE(ra, rc);
  EXPECT_NE(ra[0], ra[7]) << "epochs 0 and 1 should be shuffled differently";
  // Seeking straight to epoch 3 gives what a sampler that went through epochs 0-2 gives.
  BatchSampler d(50, 7, 9, true);
  d.seek(3, 0);
  EXPECT_EQ(take(d, 7), std::vector<std::vector<int64_t>>(ra.begin() + 21, ra.begin() + 28));
  // Pinned values, computed by an independent Python implementation of the algorithm data.h
  // documents (mt19937_64, splitmix64, rejection, Fisher-Yates). The order is part of what a
  // checkpoint resumes, so a change to the mixing or the shuffle has to be deliberate.
  BatchSampler p(10, 10, 1, true);
  EXPECT_EQ(p.next(), (std::vector<int64_t>{5, 0, 8, 7, 3, 1, 9, 6, 4, 2}));
}

TEST(BatchSampler, SeekResumesExactly) {
  for (int k : {0, 1, 6, 7, 8, 20, 33}) {
    BatchSampler a(45, 6, 123, true);  // 7 batches per epoch
    take(a, k);
    const int64_t epoch = a.epoch(), pos = a.position();
    BatchSampler b(45, 6, 123, true);
    b.seek(epoch, pos);
    EXPECT_EQ(take(a, 15), take(b, 15)) << "after " << k << " batches (epoch " << epoch << ", position " << pos << ")";
  }
  BatchSampler s(45, 6, 1, true);
  EXPECT_REMAT_ERROR(s.seek(0, 8), "position 8 is outside [0, 7]");
  EXPECT_REMAT_ERROR(s.seek(-1, 0), "epoch -1 is negative");
}

// Length grouping (data.length_buckets) against a reference built from the ungrouped
// sampler's order: each pool of 20 batches sorted by length, cut into batches. The grouped
// epoch holds those batches (as sets; their order shuffled, a partial last batch last), so
// a batch's lengths span little where the ungrouped batches' span most of the range.
TEST(BatchSampler, LengthGroupingSortsPoolsAndShufflesTheirBatches) {
  const int64_t n = 1003, batch = 10, pool = 20;
  std::vector<int64_t> lengths(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) lengths[static_cast<size_t>(i)] = 1 + (i * 7919) % 32;
  for (bool drop_last : {true, false}) {
    BatchSampler plain(n, batch, 5, true, drop_last), grouped(n, batch, 5, true, drop_last);
    grouped.group_by_length(lengths, pool);
    auto span = [&](const std::vector<int64_t>& b) {
      int64_t lo = 99, hi = 0;
      for (int64_t i : b)
        lo = std::min(lo, lengths[static_cast<size_t>(i)]), hi = std::max(hi, lengths[static_cast<size_t>(i)]);
      return static_cast<double>(hi - lo);
    };
    double plain_span = 0, grouped_span = 0;
    for (int epoch = 0; epoch < 3; ++epoch) {
      std::vector<int64_t> order;
      for (const auto& b : take(plain, static_cast<int>(plain.batches_per_epoch()))) {
        order.insert(order.end(), b.begin(), b.end());
        plain_span += span(b);
      }
      // The reference: the shuffled order, its whole batches' samples in pools sorted,
      // batches cut; the samples after them (the partial last batch) as shuffled.
      std::vector<int64_t> full = order;
      const size_t grouped_end = static_cast<size_t>(n / batch * batch);
      for (size_t at = 0; at < grouped_end; at += pool * batch) {
        const auto end = full.begin() + static_cast<ptrdiff_t>(std::min(grouped_end, at + pool * batch));
        std::stable_sort(full.begin() + static_cast<ptrdiff_t>(at), end, [&](int64_t x, int64_t y) {
          return lengths[static_cast<size_t>(x)] < lengths[static_cast<size_t>(y)];
        });
      }
      std::multiset<std::vector<int64_t>> expect, got;
      const int64_t batches = grouped.batches_per_epoch();
      for (int64_t b = 0; b < batches; ++b) {
        const auto first = full.begin() + b * batch;
        std::vector<int64_t> v(first, first + std::min<int64_t>(batch, static_cast<int64_t>(full.size()) - b * batch));
        std::sort(v.begin(), v.end());
        expect.insert(v);
      }
      std::vector<std::vector<int64_t>> in_order;
      for (int64_t b = 0; b < batches; ++b) {
        auto v = grouped.next();
        EXPECT_EQ(grouped.epoch(), epoch);
        grouped_span += span(v);
        std::sort(v.begin(), v.end());
        in_order.push_back(v);
        got.insert(v);
      }
      EXPECT_EQ(got, expect) << "epoch " << epoch << (drop_last ? ", drop_last" : "");
      if (!drop_last) {
        EXPECT_EQ(in_order.back().size(), 3u) << "the partial batch stays last";
      }
      // Not the pool order: the batches were shuffled (the pool order has ascending runs).
      std::vector<std::vector<int64_t>> pool_order;
      for (int64_t b = 0; b < batches; ++b) {
        const auto first = full.begin() + b * batch;
        std::vector<int64_t> v(first, first + std::min<int64_t>(batch, static_cast<int64_t>(full.size()) - b * batch));
        std::sort(v.begin(), v.end());
        pool_order.push_back(v);
      }
      EXPECT_NE(in_order, pool_order);
    }
    const double epochs_batches = 3.0 * static_cast<double>(grouped.batches_per_epoch());
    EXPECT_LT(grouped_span / epochs_batches, 2.5) << "a grouped batch's lengths span little";
    EXPECT_GT(plain_span / epochs_batches, 20.0) << "an ungrouped batch's lengths span most of 1..32";
  }
  // Resuming mid-epoch sees the same grouped batches; without shuffle the pools' batches
  // come in order, each ascending.
  for (int k : {27, 150}) {  // in epoch 0, and in epoch 1 (100 batches an epoch)
    BatchSampler a(n, batch, 9, true);
    a.group_by_length(lengths, pool);
    take(a, k);
    BatchSampler c(n, batch, 9, true);
    c.group_by_length(lengths, pool);
    c.seek(a.epoch(), a.position());
    EXPECT_EQ(take(a, 80), take(c, 80)) << "after " << k << " batches";  // on into the next epoch
  }
  BatchSampler a(n, batch, 9, true);
  a.group_by_length(lengths, pool);
  BatchSampler ordered(n, batch, 9, false);
  ordered.group_by_length(lengths, pool);
  const auto first = ordered.next(), second = ordered.next();
  EXPECT_TRUE(std::is_sorted(first.begin(), first.end(), [&](int64_t x, int64_t y) {
    return lengths[static_cast<size_t>(x)] < lengths[static_cast<size_t>(y)];
  }));
  EXPECT_LE(lengths[static_cast<size_t>(first.back())], lengths[static_cast<size_t>(second.front())]);
  EXPECT_REMAT_ERROR(a.group_by_length({1, 2}, pool), "2 lengths for 1003 samples");
  EXPECT_REMAT_ERROR(a.group_by_length(lengths, 0), "pool of 0 batches");
}

TEST(BatchSampler, ShuffleIsUniform) {
  // All 24 orders of 4 elements, over 24000 epochs: each about 1000 times. A biased shuffle
  // (e.g. j drawn from [0, n) or Sattolo's [0, i)) fails this.
  BatchSampler s(4, 4, 2024, true);
  std::map<std::vector<int64_t>, int> counts;
  for (int e = 0; e < 24000; ++e) ++counts[s.next()];
  EXPECT_EQ(counts.size(), 24u);
  for (const auto& [order, c] : counts) EXPECT_TRUE(c > 850 && c < 1150) << c;
}

TEST(BatchSampler, SequentialAndArgumentChecks) {
  BatchSampler s(5, 2, 7, false, false);
  EXPECT_EQ(take(s, 4), (std::vector<std::vector<int64_t>>{{0, 1}, {2, 3}, {4}, {0, 1}}));
  EXPECT_EQ(s.epoch(), 1);
  EXPECT_REMAT_ERROR(BatchSampler(0, 2, 0, true), "empty");
  EXPECT_REMAT_ERROR(BatchSampler(5, 0, 0, true), "batch size 0 must be positive");
  EXPECT_REMAT_ERROR(BatchSampler(5, 6, 0, true, true), "no batch");
  EXPECT_EQ(BatchSampler(5, 6, 0, true, false).next().size(), 5u);
}

// ---------------------------------------------------------------------------------------
// Batches
// ---------------------------------------------------------------------------------------

TEST(Batches, ImageBatchCopiesRowsAndIsTaggedInput) {
  const ImageDataset d = remat::synthetic_images(10, 2, 3, 4, 5, 1);
  const auto& alloc = remat::allocator_for(Device::cpu());
  const int64_t before = alloc.stats().by_category[remat::MemoryCategory::input];
  {
    remat::Batch b = remat::image_batch(d, {7, 0, 7}, Device::cpu());
    EXPECT_EQ(b.input().shape(), (remat::Shape{3, 2, 3, 4}));
    EXPECT_EQ(b.targets().shape(), (remat::Shape{3}));
    const auto all = d.images.to_vector(), in = b.input().to_vector();
    const auto labels = d.labels.to_ints();
    for (int i = 0; i < 3; ++i) {
      const int k = i == 1 ? 0 : 7;
      EXPECT_TRUE(std::equal(in.begin() + i * 24, in.begin() + (i + 1) * 24, all.begin() + k * 24)) << i;
      EXPECT_EQ(b.targets().to_ints()[static_cast<size_t>(i)], labels[static_cast<size_t>(k)]);
    }
    EXPECT_EQ(b.input().storage()->block().category, remat::MemoryCategory::input);
    EXPECT_EQ(b.targets().storage()->block().category, remat::MemoryCategory::input);
    EXPECT_GE(alloc.stats().by_category[remat::MemoryCategory::input] - before,
              static_cast<int64_t>(b.input().nbytes() + b.targets().nbytes()));
  }
  EXPECT_EQ(alloc.stats().by_category[remat::MemoryCategory::input], before);
  EXPECT_REMAT_ERROR(remat::image_batch(d, {3, 10}, Device::cpu()), "index 10 at position 1 is outside [0, 10)");
  EXPECT_REMAT_ERROR(remat::image_batch(d, {-1}, Device::cpu()), "index -1");
  EXPECT_REMAT_ERROR(remat::image_batch(d, {}, Device::cpu()), "no indices");
  // meta: shapes and accounting, no data.
  remat::Batch m = remat::image_batch(d, {1, 2}, Device::meta());
  EXPECT_EQ(m.input().shape(), (remat::Shape{2, 2, 3, 4}));
  EXPECT_EQ(m.input().storage()->block().category, remat::MemoryCategory::input);
}

TEST(Batches, HflipMirrorsEveryRowOfTheFlaggedSamples) {
  const ImageDataset d = remat::synthetic_images(10, 2, 3, 5, 4, 3);  // odd width: the middle column stays
  const std::vector<int64_t> idx{4, 9, 4};
  const remat::Batch plain = remat::image_batch(d, idx, Device::cpu());
  const remat::Batch flipped = remat::image_batch(d, idx, Device::cpu(), {1, 0, 1});
  EXPECT_EQ(flipped.targets().to_ints(), plain.targets().to_ints());  // labels are unchanged
  const auto p = plain.input().to_vector(), f = flipped.input().to_vector();
  const int64_t c = 2, h = 3, w = 5;
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x) {
          const auto at = [&](int64_t xx) { return static_cast<size_t>(((i * c + ch) * h + y) * w + xx); };
          EXPECT_EQ(f[at(x)], p[at(i == 1 ? x : w - 1 - x)]) << i << " " << ch << " " << y << " " << x;
        }
  // Mirroring twice gives the image back: a mirror, not some other permutation.
  ImageDataset once;
  once.images = flipped.input();
  once.labels = flipped.targets();
  once.source = "flipped";
  EXPECT_EQ(remat::image_batch(once, {0, 1, 2}, Device::cpu(), {1, 0, 1}).input().to_vector(), p);
  EXPECT_REMAT_ERROR(remat::image_batch(d, idx, Device::cpu(), {1, 0}), "2 flip flags for 3 indices");
}

TEST(Batches, HflipDrawsAreAFairCoinOfSeedEpochAndIndexOnly) {
  const int64_t n = 20000;
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), int64_t{0});
  const auto count = [](const std::vector<uint8_t>& v) { return std::count(v.begin(), v.end(), 1); };
  const std::vector<uint8_t> e0 = remat::hflip_draws(7, 0, n, all, 0.5);
  // Binomial(20000, 1/2): sd 70.7; 5 sd either side.
  EXPECT_NEAR(static_cast<double>(count(e0)), n / 2.0, 5 * 70.7);
  EXPECT_NEAR(static_cast<double>(count(remat::hflip_draws(7, 0, n, all, 0.25))), n / 4.0, 5 * 61.2);
  EXPECT_EQ(count(remat::hflip_draws(7, 0, n, all, 0.0)), 0);
  EXPECT_EQ(count(remat::hflip_draws(7, 0, n, all, 1.0)), n);
  // Another epoch (or seed) draws afresh: about half of the samples change.
  const std::vector<uint8_t> e1 = remat::hflip_draws(7, 1, n, all, 0.5);
  const std::vector<uint8_t> s8 = remat::hflip_draws(8, 0, n, all, 0.5);
  int64_t differ_epoch = 0, differ_seed = 0;
  for (size_t i = 0; i < e0.size(); ++i) {
    differ_epoch += e0[i] != e1[i];
    differ_seed += e0[i] != s8[i];
  }
  EXPECT_NEAR(static_cast<double>(differ_epoch), n / 2.0, 5 * 70.7);
  EXPECT_NEAR(static_cast<double>(differ_seed), n / 2.0, 5 * 70.7);
  // The documented draw: Philox word epoch * n + index of seed ^ kAugmentStream, uniform < p.
  for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{777}, n - 1}) {
    const uint32_t word = remat::philox::word(7 ^ remat::kAugmentStream, static_cast<uint64_t>(n + i));
    EXPECT_EQ(e1[static_cast<size_t>(i)], remat::philox::uniform(word) < 0.5f) << i;
  }
  // A sample's flip depends on its index, not on its batch or position: any subset, in any
  // order, draws the same flags.
  const std::vector<int64_t> some{19999, 3, 12345, 3, 0};
  const std::vector<uint8_t> sub = remat::hflip_draws(7, 1, n, some, 0.5);
  for (size_t i = 0; i < some.size(); ++i) EXPECT_EQ(sub[i], e1[static_cast<size_t>(some[i])]) << some[i];
  EXPECT_REMAT_ERROR(remat::hflip_draws(7, 0, n, {n}, 0.5), "index 20000 is outside [0, 20000)");
  EXPECT_REMAT_ERROR(remat::hflip_draws(7, 0, n, {0}, 1.5), "probability 1.5");
}

TEST(Batches, ImageBatchOnCudaMatchesCpu) {
  if (!remat::cuda_status().available) GTEST_SKIP() << "no CUDA device";
  const ImageDataset d = remat::synthetic_images(6, 1, 4, 4, 3, 2);
  const remat::Batch c = remat::image_batch(d, {5, 1}, Device::cpu());
  const remat::Batch g = remat::image_batch(d, {5, 1}, Device::cuda());
  EXPECT_TRUE(g.input().device().is_cuda());
  EXPECT_EQ(g.input().storage()->block().category, remat::MemoryCategory::input);
  EXPECT_EQ(g.input().to_vector(), c.input().to_vector());
  EXPECT_EQ(g.targets().to_ints(), c.targets().to_ints());
}

TEST(Batches, TextBatchShiftsTargets) {
  const TextDataset t = remat::text_from_string("abcdefghij");
  EXPECT_EQ(remat::text_windows(t, 3), 3);  // starts 0, 3, 6 (6..9 + target 9)
  EXPECT_EQ(remat::text_windows(t, 9), 1);
  EXPECT_EQ(remat::text_windows(t, 10), 0);
  remat::Batch b = remat::text_batch(t, {0, 6}, 3, Device::cpu());
  EXPECT_EQ(b.input().shape(), (remat::Shape{2, 3}));
  EXPECT_EQ(b.targets().shape(), (remat::Shape{2, 3}));
  EXPECT_EQ(t.decode(b.input().to_ints()), "abcghi");
  EXPECT_EQ(t.decode(b.targets().to_ints()), "bcdhij");
  EXPECT_EQ(b.input().storage()->block().category, remat::MemoryCategory::input);
  EXPECT_REMAT_ERROR(remat::text_batch(t, {7}, 3, Device::cpu()), "start 7 at position 0 is outside [0, 6]");
  EXPECT_REMAT_ERROR(remat::text_batch(t, {-2}, 3, Device::cpu()), "start -2");
  EXPECT_REMAT_ERROR(remat::text_batch(t, {0}, 0, Device::cpu()), "seq_len 0 must be positive");
  EXPECT_REMAT_ERROR(remat::text_batch(t, {0}, 10, Device::cpu()), "too few for one window of 10");
  EXPECT_REMAT_ERROR(remat::text_windows(t, -1), "seq_len -1");
}

// ---------------------------------------------------------------------------------------
// Text
// ---------------------------------------------------------------------------------------

TEST(Text, VocabularyEncodeDecode) {
  const TextDataset t = remat::text_from_string("hello world\n", "greeting");
  EXPECT_EQ(t.vocab, std::string("\n dehlorw"));
  EXPECT_EQ(t.vocab_size(), 9);
  EXPECT_EQ(t.tokens.size(), 12u);
  EXPECT_EQ(t.decode(t.tokens), "hello world\n");
  EXPECT_EQ(t.encode("low"), (std::vector<int32_t>{5, 6, 8}));
  EXPECT_REMAT_ERROR(t.encode("hex"), "greeting: byte 0x78 'x' at position 2 is not in the vocabulary of 9");
  EXPECT_REMAT_ERROR(t.decode({1, 9}), "token id 9 at position 1 is outside the vocabulary of 9");
  EXPECT_REMAT_ERROR(t.decode({-1}), "token id -1");
  EXPECT_REMAT_ERROR(remat::text_from_string("", "nothing"), "nothing: the text is empty");
  // All 256 byte values survive.
  std::string bytes;
  for (int c = 255; c >= 0; --c) bytes.push_back(static_cast<char>(c));
  const TextDataset all = remat::text_from_string(bytes);
  EXPECT_EQ(all.vocab_size(), 256);
  EXPECT_EQ(all.tokens.front(), 255);
  EXPECT_EQ(all.decode(all.tokens), bytes);
}

TEST(Text, FilesRawAndGzip) {
  TempDir dir("text");
  const std::string text = "To be, or not to be:\nthat is the question.\n";
  const TextDataset raw = remat::load_text(dir.write("a.txt", text));
  const TextDataset gz = remat::load_text(dir.write("a.txt.gz", gzip(text)));
  EXPECT_EQ(raw.decode(raw.tokens), text);
  EXPECT_EQ(gz.tokens, raw.tokens);
  EXPECT_EQ(gz.vocab, raw.vocab);
  EXPECT_EQ(raw.source, dir.file("a.txt"));
  EXPECT_REMAT_ERROR(remat::load_text(dir.write("empty", "")), dir.file("empty") + ": the text is empty");
  const std::string broken = dir.write("b.gz", gzip(text).substr(0, 20));
  EXPECT_REMAT_ERROR(remat::load_text(broken), broken + ": gzip stream is truncated");
  EXPECT_REMAT_ERROR(remat::load_text(dir.file("none")), "cannot open " + dir.file("none"));
}

TEST(Text, CorpusDirectoryConcatenatesSortedFiles) {
  TempDir dir("corpus");
  dir.write("b", "bee\n%\n");
  dir.write("a", "ant\n%");  // no final newline: one is added
  dir.write("a.dat", std::string("\0\0\0\2", 4));
  dir.write(".hidden", "secret");
  dir.write("c.gz", gzip("cat\n"));
  fs::create_symlink("a", dir.path() / "a.u8");
  fs::create_symlink("b", dir.path() / "0-link-to-b");  // a duplicate: skipped
  fs::create_symlink(fs::temp_directory_path() / "remat-no-such-file", dir.path() / "dangling");
  fs::create_directories(dir.path() / "off");
  dir.write("off/rude", "rude\n");
  TempDir other("corpus_other");
  fs::create_symlink(other.write("d", "dog\n"), dir.path() / "d");  // a link to a new file: kept
  const TextDataset t = remat::load_text_corpus(dir.path().string());
  EXPECT_EQ(t.decode(t.tokens), "ant\n%\nbee\n%\ncat\ndog\n");
  EXPECT_EQ(t.source, dir.path().string());
  // A file instead of a directory.
  EXPECT_EQ(remat::load_text_corpus(dir.file("b")).tokens.size(), 6u);
  EXPECT_REMAT_ERROR(remat::load_text_corpus(dir.file("nope")), "Install the Debian package fortunes");
  TempDir empty("corpus_empty");
  EXPECT_REMAT_ERROR(remat::load_text_corpus(empty.path().string()), "holds no text files");
  {
    ScopedEnv env("REMAT_TEXT_CORPUS", dir.file("b"));
    EXPECT_EQ(remat::default_text_corpus_dir(), dir.file("b"));
  }
  ScopedEnv env("REMAT_TEXT_CORPUS", "");
  EXPECT_EQ(remat::default_text_corpus_dir(), "/usr/share/games/fortunes");
}

// A program or an image in a text folder was read as text and trained on; now it is refused,
// naming the file (a NUL byte marks it: text has none).
TEST(Text, BinaryFilesAreRefusedNamingTheFile) {
  TempDir dir("corpus_binary");
  dir.write("a.txt", "some text\n");
  const char elf[] = {'\x7f', 'E', 'L', 'F', '\x02', '\x01', '\x01', '\0', '\0', '\0'};
  dir.write("program", std::string(elf, sizeof elf));
  EXPECT_REMAT_ERROR(remat::load_text_corpus(dir.path().string()),
                     dir.file("program") + ": a binary file, not text (a NUL byte at offset 7)");
  EXPECT_REMAT_ERROR(remat::load_text(dir.file("program")), "a binary file, not text");
  dir.write("z.gz", gzip(std::string("text\0more", 9)));
  EXPECT_REMAT_ERROR(remat::load_text(dir.file("z.gz")), "a NUL byte at offset 4");
}

// Samples of a byte-level model are printed through printable_text: a terminal never gets
// raw control bytes or malformed UTF-8.
TEST(Text, PrintableTextReplacesControlBytesAndMalformedUtf8) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(remat::printable_text("plain\ttext\n"), "plain\ttext\n");
  EXPECT_EQ(remat::printable_text("Gr\xC3\xB6\xC3\x9F"
                                  "e \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "Gr\xC3\xB6\xC3\x9F"
            "e \xE2\x82\xAC \xF0\x9F\x98\x80");
  EXPECT_EQ(remat::printable_text("a\x1b[31mb"), "a" + r + "[31mb");  // an escape sequence
  EXPECT_EQ(remat::printable_text("\x07\r\x7f"), r + r + r);          // bell, CR, DEL
  EXPECT_EQ(remat::printable_text("x\xC3"), "x" + r);                 // cut short
  EXPECT_EQ(remat::printable_text("\xC0\xAF"), r + r);                // overlong '/'
  EXPECT_EQ(remat::printable_text("\xED\xA0\x80"), r + r + r);        // a surrogate
  EXPECT_EQ(remat::printable_text("\xC2\x85"), r);                    // C1 control NEL
  EXPECT_TRUE(
      remat::is_valid_utf8("Gr\xC3\xB6\xC3\x9F"
                           "e"));
  EXPECT_FALSE(remat::is_valid_utf8("\xFF"));
  EXPECT_FALSE(remat::is_valid_utf8("\xF4\x90\x80\x80"));  // past U+10FFFF
}

TEST(Text, FortunesIfInstalled) {
  const std::string dir = remat::default_text_corpus_dir();
  if (!fs::is_directory(dir)) GTEST_SKIP() << "no text corpus in " << dir << " (Debian package fortunes)";
  // Expected size, counted independently: regular non-link files, not *.dat / *.u8.
  size_t expected = 0;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_symlink() || !e.is_regular_file() || name[0] == '.') continue;
    if (name.size() > 4 && (name.substr(name.size() - 4) == ".dat" || name.substr(name.size() - 3) == ".u8")) continue;
    const std::string content = remat::read_file(e.path().string());
    expected += content.size() + (content.empty() || content.back() != '\n' ? 1 : 0);
    names.push_back(e.path().string());
  }
  if (names.empty()) GTEST_SKIP() << dir << " holds no fortune files";
  const TextDataset t = remat::load_text_corpus(dir);
  EXPECT_EQ(t.tokens.size(), expected);
  EXPECT_GT(t.vocab_size(), 60);
  EXPECT_NE(t.vocab.find('%'), std::string::npos);
  std::sort(names.begin(), names.end());
  const std::string first = remat::read_file(names.front()).substr(0, 200);
  EXPECT_EQ(t.decode({t.tokens.begin(), t.tokens.begin() + static_cast<long>(first.size())}), first);
  EXPECT_GT(remat::text_windows(t, 256), 1000);
}

// ---------------------------------------------------------------------------------------
// Synthetic data
// ---------------------------------------------------------------------------------------

TEST(Synthetic, ImagesAreDeterministicAndLearnable) {
  const ImageDataset a = remat::synthetic_images(600, 1, 6, 6, 4, 11);
  const ImageDataset b = remat::synthetic_images(600, 1, 6, 6, 4, 11);
  const ImageDataset c = remat::synthetic_images(600, 1, 6, 6, 4, 12);
  const ImageDataset prefix = remat::synthetic_images(50, 1, 6, 6, 4, 11);
  EXPECT_EQ(a.images.shape(), (remat::Shape{600, 1, 6, 6}));
  EXPECT_EQ(a.images.to_vector(), b.images.to_vector());
  EXPECT_EQ(a.labels.to_ints(), b.labels.to_ints());
  EXPECT_NE(a.images.to_vector(), c.images.to_vector());
  const auto av = a.images.to_vector(), pv = prefix.images.to_vector();
  EXPECT_TRUE(std::equal(pv.begin(), pv.end(), av.begin()));
  EXPECT_EQ(a.images.storage()->block().category, remat::MemoryCategory::input);
  // Learnable: class means from the first 300 samples classify the other 300 well.
  const auto labels = a.labels.to_ints();
  std::vector<std::vector<double>> mean(4, std::vector<double>(36, 0.0));
  std::vector<int> count(4, 0);
  for (int i = 0; i < 300; ++i) {
    const auto k = static_cast<size_t>(labels[static_cast<size_t>(i)]);
    ASSERT_LT(k, 4u);
    ++count[k];
    for (int j = 0; j < 36; ++j) mean[k][static_cast<size_t>(j)] += av[static_cast<size_t>(i * 36 + j)];
  }
  for (int k = 0; k < 4; ++k) EXPECT_GT(count[static_cast<size_t>(k)], 40) << "labels are not spread over classes";
  int correct = 0;
  for (int i = 300; i < 600; ++i) {
    int best = 0;
    double best_d = 1e300;
    for (int k = 0; k < 4; ++k) {
      double dist = 0;
      for (int j = 0; j < 36; ++j) {
        const double diff = av[static_cast<size_t>(i * 36 + j)] - mean[static_cast<size_t>(k)][static_cast<size_t>(j)] /
                                                                      std::max(1, count[static_cast<size_t>(k)]);
        dist += diff * diff;
      }
      if (dist < best_d) best_d = dist, best = k;
    }
    correct += best == labels[static_cast<size_t>(i)];
  }
  EXPECT_GT(correct, 285);
  EXPECT_REMAT_ERROR(remat::synthetic_images(0, 1, 2, 2, 2, 0), "must be positive");
}

TEST(Synthetic, TextIsDeterministicAndPredictable) {
  const TextDataset a = remat::synthetic_text(5000, 20, 3);
  EXPECT_EQ(a.tokens, remat::synthetic_text(5000, 20, 3).tokens);
  EXPECT_NE(a.tokens, remat::synthetic_text(5000, 20, 4).tokens);
  EXPECT_EQ(a.vocab_size(), 20);
  EXPECT_EQ(a.vocab.front(), ' ');
  int follows = 0;
  for (size_t i = 0; i + 1 < a.tokens.size(); ++i) {
    ASSERT_TRUE(a.tokens[i] >= 0 && a.tokens[i] < 20);
    follows += a.tokens[i + 1] == (7 * a.tokens[i] + 3) % 20;
  }
  // 3/4 by the rule plus 1/4 * 1/20 by chance: about 0.7625.
  EXPECT_NEAR(follows / 4999.0, 0.7625, 0.03);
  EXPECT_EQ(remat::synthetic_text(10, 256, 0).vocab_size(), 256);
  EXPECT_REMAT_ERROR(remat::synthetic_text(10, 257, 0), "vocab_size 257");
}

// ---------------------------------------------------------------------------------------
// The fuzz seed corpus, replayed through the fuzz targets' code in every build.
// ---------------------------------------------------------------------------------------

namespace {
void replay(const std::string& kind, int (*run)(const uint8_t*, size_t), int min_valid) {
  const fs::path dir = fs::path(REMAT_SOURCE_DIR) / "tests/fuzz/corpus" / kind;
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  int files = 0, valid = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string bytes = remat::read_file(e.path().string());
    ++files;
    try {
      valid += run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& ex) {
      ADD_FAILURE() << e.path().filename() << ": " << ex.what();
    }
  }
  EXPECT_GE(files, 3) << kind;
  EXPECT_GE(valid, min_valid) << kind << ": too few seeds parse, the corpus no longer reaches the deep paths";
  EXPECT_LT(valid, files) << kind << ": no malformed seeds";
}
}  // namespace

TEST(FuzzCorpus, IdxSeedsReplay) { replay("idx", remat::fuzz::run_idx_input, 4); }
TEST(FuzzCorpus, SafetensorsSeedsReplay) { replay("safetensors", remat::fuzz::run_safetensors_input, 2); }
TEST(FuzzCorpus, TokenShardsSeedsReplay) { replay("token_shards", remat::fuzz::run_token_shard_input, 2); }
TEST(FuzzCorpus, NpySeedsReplay) { replay("npy", remat::fuzz::run_npy_input, 3); }

// ---- .npy arrays (NumPy's own files: tools/reference/gen_npy_golden.py) ------------------------

namespace {

std::string npy_golden(const std::string& name) { return std::string(REMAT_SOURCE_DIR) + "/tests/golden/npy/" + name; }

}  // namespace

// Every readable kind as NumPy wrote it: element k is k * 0.5 (floats) or k (integers), in
// C order, whatever the header's version; u1 images are divided by 255.
TEST(Npy, ReadsWhatNumpyWrote) {
  const remat::NpyArray f32 = remat::load_npy(npy_golden("x_f32.npy"));
  EXPECT_EQ(f32.shape, (std::vector<int64_t>{2, 1, 2, 3}));
  EXPECT_EQ(f32.dtype(), "<f4");
  for (int64_t k = 0; k < 12; ++k) EXPECT_EQ(f32.at(k), 0.5 * static_cast<double>(k)) << k;
  const remat::NpyArray f64 = remat::load_npy(npy_golden("x_f64_v2.npy"));  // format version 2.0
  EXPECT_EQ(f64.shape, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(f64.dtype(), "<f8");
  for (int64_t k = 0; k < 8; ++k) EXPECT_EQ(f64.at(k), 0.5 * static_cast<double>(k)) << k;
  const remat::NpyArray i16 = remat::load_npy(npy_golden("x_i16.npy"));
  for (int64_t k = 0; k < 6; ++k) EXPECT_EQ(i16.at(k), static_cast<double>(k - 3)) << k;
  EXPECT_EQ(remat::load_npy(npy_golden("y_i64.npy")).at(0), 1.0);

  // As a data set: [N, C, H, W] as it is, [N, H, W] one channel, [N, D] as [N, 1, 1, D].
  const ImageDataset a = remat::npy_dataset(f32, remat::load_npy(npy_golden("y_i64.npy")), 2);
  EXPECT_EQ(a.images.shape(), remat::Shape({2, 1, 2, 3}));
  EXPECT_EQ(a.images.to_vector()[11], 5.5f);
  EXPECT_EQ(a.labels.to_ints(), (std::vector<int32_t>{1, 0}));
  const ImageDataset u8 =
      remat::npy_dataset(remat::load_npy(npy_golden("x_u8.npy")), remat::load_npy(npy_golden("y_u8.npy")), 3);
  EXPECT_EQ(u8.images.shape(), remat::Shape({2, 1, 2, 2}));
  const std::vector<float> px = u8.images.to_vector();
  EXPECT_EQ(px[0], 0.0f);
  EXPECT_EQ(px[1], 1.0f);
  EXPECT_EQ(px[2], static_cast<float>(51.0 / 255.0));
  EXPECT_EQ(u8.labels.to_ints(), (std::vector<int32_t>{2, 1}));
  const ImageDataset flat = remat::npy_dataset(f64, remat::load_npy(npy_golden("y_col_i32.npy")), 2);
  EXPECT_EQ(flat.images.shape(), remat::Shape({2, 1, 1, 4}));
  EXPECT_EQ(flat.labels.to_ints(), (std::vector<int32_t>{1, 0}));
}

// What cannot be read says which file, what is wrong and how to save it so it reads.
TEST(Npy, ErrorsNameTheFileAndWhatIsWrong) {
  auto load = [](const char* f) { return remat::load_npy(npy_golden(f)); };
  EXPECT_REMAT_ERROR(load("fortran.npy"), "fortran.npy: the array is in Fortran (column-major) order");
  EXPECT_REMAT_ERROR(load("big_endian.npy"), "big_endian.npy: the dtype '>f4' is big-endian");
  EXPECT_REMAT_ERROR(load("half.npy"), "half.npy: the dtype '<f2' is not one remat reads");
  EXPECT_REMAT_ERROR(load("structured.npy"), "structured.npy: a structured array");
  const std::string bytes = remat::read_file(npy_golden("x_f32.npy"));
  EXPECT_REMAT_ERROR(
      remat::parse_npy(bytes.substr(0, bytes.size() - 4), "cut.npy"),
      "cut.npy: the header says shape (2, 1, 2, 3) of <f4, 48 bytes, but 44 bytes follow it (truncated)");
  EXPECT_REMAT_ERROR(remat::parse_npy(bytes + "xx", "long.npy"), "but 50 bytes follow it");
  EXPECT_REMAT_ERROR(remat::parse_npy("PK\x03\x04 not an array", "a.npz"), "a.npz: not a .npy file");
  EXPECT_REMAT_ERROR(remat::parse_npy(bytes.substr(0, 20), "head.npy"), "head.npy: truncated in the .npy header");
  std::string v9 = bytes;
  v9[6] = 9;
  EXPECT_REMAT_ERROR(remat::parse_npy(v9, "v9.npy"), "v9.npy: .npy format version 9.0 is not one remat reads");
  std::string huge = bytes;  // a shape whose product overflows
  const size_t s = huge.find("(2, 1, 2, 3)");
  ASSERT_NE(s, std::string::npos);
  const std::string shape = "(99999999999, 99999999999)";
  huge.replace(s, 12, shape);
  huge.erase(huge.find('\n') - (shape.size() - 12), shape.size() - 12);  // the padding: the same header length
  EXPECT_REMAT_ERROR(remat::parse_npy(huge, "huge.npy"),
                     "huge.npy: the header says shape (99999999999, 99999999999) "
                     "of <f4, more bytes than the file holds, but 48 bytes follow");
  huge = bytes;
  huge.replace(s, 12, "(12,)       ");  // the same count as another shape: it reads
  EXPECT_EQ(remat::parse_npy(huge, "flat.npy").shape, (std::vector<int64_t>{12}));

  const remat::NpyArray x = load("x_f32.npy");
  EXPECT_REMAT_ERROR(remat::npy_dataset(x, load("y_i64.npy"), 1), "y_i64.npy: label 0 is 1, outside the 1 classes");
  EXPECT_REMAT_ERROR(remat::npy_dataset(x, load("y_float.npy"), 2), "y_float.npy: labels of type <f4");
  EXPECT_REMAT_ERROR(remat::npy_dataset(x, load("x_f32.npy"), 2), "x_f32.npy: labels of shape (2, 1, 2, 3)");
  EXPECT_REMAT_ERROR(remat::npy_dataset(load("x_nan.npy"), load("y_i64.npy"), 2), "x_nan.npy: element 1 is nan");
  EXPECT_REMAT_ERROR(remat::npy_dataset(load("y_i64.npy"), load("y_i64.npy"), 2), "y_i64.npy: images of shape (2,);");
  const remat::NpyArray three = remat::load_npy(npy_golden("blobs/test_y.npy"));
  EXPECT_REMAT_ERROR(remat::npy_dataset(x, three, 3), "test_y.npy: 24 labels for the 2 images of");
}
