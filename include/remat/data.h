// Data sets and batching: Fashion-MNIST (IDX files, gzip or raw), character-level text,
// and synthetic data for tests. Readers validate every header field against the file
// size before reading or allocating, and name the file and field in their errors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "remat/tensor.h"

namespace remat {

// Images [N, C, H, W] f32 (already normalised) and labels [N] i32, on the host.
struct ImageDataset {
  Tensor images;
  Tensor labels;
  int num_classes = 0;
  std::string source;  // for messages
};

// Reads an IDX image file (magic 0x00000803, u8 pixels, [N, H, W]) and an IDX label file
// (magic 0x00000801, u8 labels, [N]); each may be gzip-compressed (detected by magic).
// Pixels become (p / 255 - mean) / std as f32 [N, 1, H, W]. Errors name the file and
// what is wrong (bad magic, truncated, counts that disagree, label >= num_classes).
// Fashion-MNIST's pixel mean and standard deviation (of p / 255), which training normalises by.
constexpr float kFashionMnistMean = 0.2860f, kFashionMnistStd = 0.3530f;
ImageDataset load_idx(const std::string& images_path, const std::string& labels_path, float mean = kFashionMnistMean,
                      float std = kFashionMnistStd, int num_classes = 10);

// The largest decompressed IDX file accepted, a sanity cap against gzip bombs and
// headers that claim absurd sizes: 1 GiB.
constexpr size_t kMaxIdxBytes = size_t{1} << 30;

// One IDX array of unsigned bytes (type code 0x08): its dims and prod(dims) bytes.
struct IdxArray {
  std::vector<int64_t> dims;
  std::string data;
  std::string name;  // for messages
};
// The two halves of load_idx, also the entry points of the fuzz target. parse_idx takes
// the bytes of one IDX file (raw or gzip) and checks the header against the byte count
// before it allocates for the data; a gzip stream is inflated into a buffer that grows
// with the output and never beyond what the header implies (nor max_bytes).
IdxArray parse_idx(std::string bytes, const std::string& name, size_t max_bytes = kMaxIdxBytes);
// images [N, H, W] and labels [N] -> a data set; checks dims, counts and label range.
ImageDataset idx_dataset(const IdxArray& images, const IdxArray& labels, float mean = kFashionMnistMean,
                         float std = kFashionMnistStd, int num_classes = 10);

// NumPy .npy files (numpy.lib.format versions 1.0, 2.0 and 3.0): C-order arrays of a
// little-endian float (f4, f8), signed or unsigned integer (1 to 8 bytes) or bool type.
struct NpyArray {
  std::vector<int64_t> shape;
  char kind = 'f';     // 'f' float, 'i' signed, 'u' unsigned, 'b' bool
  int item_bytes = 4;  // bytes per element
  std::string data;    // prod(shape) * item_bytes bytes
  std::string name;    // for messages
  int64_t numel() const;
  std::string dtype() const;   // NumPy's name: "<f4", "|u1", ...
  double at(int64_t k) const;  // element k of the flattened array, as a double
};
// Parses one .npy file's bytes, checking the header (magic, version, dtype, order, shape)
// against the byte count before it copies any data. Errors name the file and what is
// wrong, and say how to save the array so that it reads (e.g. astype('float32')).
NpyArray parse_npy(const std::string& bytes, const std::string& name);
NpyArray load_npy(const std::string& path);
// Images x and class ids y as a data set. x: [N, C, H, W]; [N, H, W] is one channel and
// [N, D] is [N, 1, 1, D]; any numeric type (u1 pixels are divided by 255, other values
// kept), every value finite. y: [N] or [N, 1] of integers in [0, num_classes).
ImageDataset npy_dataset(const NpyArray& x, const NpyArray& y, int num_classes);
// x alone as images, by npy_dataset's rules: f32 [N, C, H, W] on the host.
Tensor npy_images(const NpyArray& x);
// Writes an f32 or i32 tensor as a C-order little-endian .npy file (format 1.0, as np.save
// writes it), atomically.
void save_npy(const std::string& path, const Tensor& t);

// Where Debian's dataset-fashion-mnist package puts the files; `split` is "train" or "test".
// Returns {images_path, labels_path}; throws a clear error naming the package if absent.
std::pair<std::string, std::string> fashion_mnist_paths(const std::string& dir, const std::string& split);
std::string default_fashion_mnist_dir();

// Character-level text: the vocabulary is the sorted set of bytes present.
struct TextDataset {
  std::vector<int32_t> tokens;
  std::string vocab;  // vocab[id] = the byte
  std::string source;
  int vocab_size() const { return static_cast<int>(vocab.size()); }
  std::string decode(const std::vector<int32_t>& ids) const;
  // Ids of `text`; bytes not in the vocabulary are an error.
  std::vector<int32_t> encode(const std::string& text) const;
};
TextDataset load_text(const std::string& path);  // raw or gzip; a file with a NUL byte is refused as binary
// Whether `s` is well-formed UTF-8 (no overlong forms, no surrogates, nothing past U+10FFFF).
bool is_valid_utf8(const std::string& s);
// `bytes` as a terminal may show them: well-formed UTF-8 kept, newlines and tabs kept, every
// other control byte and every byte of a malformed sequence replaced by U+FFFD.
std::string printable_text(const std::string& bytes);
TextDataset text_from_string(const std::string& text, const std::string& source = "<string>");
// Default corpus for character models: the fortune files of Debian's `fortunes` package
// (concatenated in sorted path order), or an error naming the package.
// REMAT_TEXT_CORPUS overrides the default directory (like REMAT_FASHION_MNIST_DIR for
// default_fashion_mnist_dir). load_text_corpus concatenates the regular files of `dir` (not
// recursive) in sorted name order, skipping *.dat and *.u8 (fortune's index files and its
// UTF-8 aliases), hidden files and symlinks to files already included; a file that does
// not end in a newline gets one. Given a file instead of a directory, it loads that file.
std::string default_text_corpus_dir();
TextDataset load_text_corpus(const std::string& dir);

// Deterministic batch order. Each epoch is a permutation of [0, n) drawn from
// (seed, epoch) only, so a run resumed at (epoch, position) sees the same batches.
// The permutation is a Fisher-Yates shuffle (i = n-1 down to 1, swap i with a uniform
// j in [0, i], drawn by rejection so it is unbiased) driven by std::mt19937_64 seeded with
// splitmix64(splitmix64(seed) ^ epoch); all of it is fixed by the C++ standard, so the
// order is the same with every compiler and standard library. Without shuffle, every
// epoch is 0, 1, ..., n-1. With drop_last the last n % batch samples of an epoch are not
// used; without it the last batch is smaller. position() counts batches taken in the
// current epoch (0..batches_per_epoch()); seek(epoch, position) restores a saved pair.
//
// Length grouping (a translation corpus's data.length_buckets): after the epoch's shuffle,
// its whole batches are cut into pools of `pool_batches` batches (the n % batch samples
// after them, dropped or the last batch, stay as shuffled), each pool is sorted by length
// (stable, so ties keep the shuffled order), and the epoch's whole batches are then
// shuffled among themselves (Fisher-Yates again, seeded by (seed, epoch) through another
// splitmix64 round; without shuffle they stay in pool order). A batch then holds samples of
// like length, so it can be cut short, and long and short batches still come in random
// order. The pools and the order are fixed by (seed, epoch) as before.
class BatchSampler {
 public:
  BatchSampler(int64_t n, int64_t batch, uint64_t seed, bool shuffle, bool drop_last = true);
  // Indices of the next batch; moves to the next epoch when the current one is exhausted.
  std::vector<int64_t> next();
  int64_t batches_per_epoch() const;
  int64_t epoch() const { return epoch_; }
  int64_t position() const { return position_; }  // batches taken in this epoch
  void seek(int64_t epoch, int64_t position);
  // Groups every epoch's batches by `lengths` (one per sample, n of them), from the
  // current epoch on; pool_batches >= 1.
  void group_by_length(std::vector<int64_t> lengths, int64_t pool_batches);

 private:
  void shuffle_epoch();
  void group_epoch();
  int64_t n_, batch_;
  uint64_t seed_;
  bool shuffle_, drop_last_;
  int64_t epoch_ = 0, position_ = 0;
  std::vector<int64_t> order_;
  std::vector<int64_t> lengths_;  // empty: no grouping
  int64_t pool_batches_ = 0;
};

// A batch on a device: one tensor per model input, by the names the model declares
// (Graph::input_ids; model.inputs in the config). The built-in data sets give two:
// images: "input" [B, C, H, W] f32 and "targets" [B] i32 (class labels);
// text: "input" [B, T] i32 tokens and "targets" [B, T] i32 (the next token of each position).
class Batch {
 public:
  Batch() = default;
  // The built-in data sets' pair, "input" and "targets".
  Batch(Tensor input, Tensor targets);
  // Adds the tensor of `name`, or replaces it.
  Batch& set(const std::string& name, Tensor t);
  bool has(const std::string& name) const;
  // The tensor of `name`; throws naming the tensors the batch has when it has none.
  const Tensor& at(const std::string& name) const;
  // Every (name, tensor), in the order they were set.
  const std::vector<std::pair<std::string, Tensor>>& items() const { return items_; }
  // The built-in data sets' tensors: at("input"), at("targets").
  const Tensor& input() const;
  const Tensor& targets() const;

 private:
  std::vector<std::pair<std::string, Tensor>> items_;
};
// Row i of the batch is image indices[i]; with `hflip` (one entry per index), rows whose
// entry is nonzero are mirrored left-right (x -> W-1-x in every channel and row).
Batch image_batch(const ImageDataset& d, const std::vector<int64_t>& indices, Device device,
                  const std::vector<uint8_t>& hflip = {});

// Training-time horizontal flips (data.augment.hflip). Whether sample `index` of a training
// set of n samples is mirrored in epoch `epoch` is drawn from Philox (include/remat/philox.h):
// word epoch * n + index of the stream of seed ^ kAugmentStream is mirrored when
// uniform(word) < p (p >= 1: always; p <= 0: never). It depends only on (seed, epoch,
// index), never on the batch size, the position in the batch or earlier draws, so a
// resumed run mirrors the same samples as an uninterrupted one.
constexpr uint64_t kAugmentStream = 0x6175676d656e7431ULL;  // "augment1"
std::vector<uint8_t> hflip_draws(uint64_t seed, int64_t epoch, int64_t n, const std::vector<int64_t>& indices,
                                 double p);
// Window i starts at token i * stride... : for text, `starts` are token offsets; each
// window is tokens[s, s + T) with targets tokens[s + 1, s + T + 1).
Batch text_batch(const TextDataset& d, const std::vector<int64_t>& starts, int64_t seq_len, Device device);
// Number of windows of length T (+1 for the target) in a text of n tokens, stride T.
int64_t text_windows(const TextDataset& d, int64_t seq_len);

// Synthetic data for tests, the same on every platform for a given seed (no std::
// distributions, whose algorithms differ between standard libraries). Images: class k has
// a fixed prototype of +-1 values; sample i is its prototype plus N(0, 0.5^2) noise, with
// a uniform label; sample i depends on (seed, i) only, so a longer set extends a shorter
// one. Text: token t+1 is (7 * token t + 3) mod V with probability 3/4, else uniform, so a
// bigram model can learn it; vocab is V consecutive bytes from ' ' (or from 256 - V).
ImageDataset synthetic_images(int64_t n, int channels, int height, int width, int num_classes, uint64_t seed);
TextDataset synthetic_text(int64_t n_tokens, int vocab_size, uint64_t seed);

}  // namespace remat
