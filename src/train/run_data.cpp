#include "train/run_data.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "remat/error.h"
#include "remat/graph.h"
#include "remat/memory.h"

namespace fs = std::filesystem;

namespace remat {

static_assert(kTranslationVocab == kDefaultTokenizerVocab, "one default tokenizer size for config and corpus");

namespace {

// Samples [b, b + n) of an image set, a copy.
ImageDataset slice_images(const ImageDataset& all, int64_t b, int64_t n) {
  ImageDataset d;
  d.num_classes = all.num_classes;
  d.source = all.source;
  const Shape& s = all.images.shape();
  const int64_t per = all.images.numel() / s[0];
  TagScope scope(MemoryCategory::input, "data", Phase::setup);
  d.images = Tensor::empty(Shape{n, s[1], s[2], s[3]});
  d.labels = Tensor::empty(Shape{n}, Device::cpu(), DType::i32);
  std::copy(all.images.f32() + b * per, all.images.f32() + (b + n) * per, d.images.f32());
  std::copy(all.labels.i32() + b, all.labels.i32() + b + n, d.labels.i32());
  return d;
}

// The npy data set: data.path's train_x.npy and train_y.npy, evaluated on test_x.npy and
// test_y.npy where the folder has them, else on the last eval_fraction of the training
// arrays (which then do not train).
void load_npy_data(const Config& cfg, RunData& d) {
  const DataConfig& dc = cfg.data;
  const std::string files = "train_x.npy and train_y.npy (and test_x.npy and test_y.npy to evaluate on)";
  REMAT_CHECK(!dc.path.empty(), cfg.source, ": /data/path: the npy data set reads ", files,
              " from a folder; set data.path to it (or pass --data)");
  std::error_code ec;
  REMAT_CHECK(fs::is_directory(dc.path, ec), cfg.source, ": /data/path: ", dc.path,
              " is not a folder; the npy data set reads ", files, " from one");
  auto file = [&](const char* f) { return (fs::path(dc.path) / f).string(); };
  for (const char* f : {"train_x.npy", "train_y.npy"})
    REMAT_CHECK(fs::exists(file(f), ec), cfg.source, ": /data/path: ", dc.path, " has no ", f,
                "; the npy data set reads ", files);
  const int classes = static_cast<int>(dc.classes);
  ImageDataset all = npy_dataset(load_npy(file("train_x.npy")), load_npy(file("train_y.npy")), classes);
  const bool has_test = fs::exists(file("test_x.npy"), ec), has_test_y = fs::exists(file("test_y.npy"), ec);
  REMAT_CHECK(has_test == has_test_y, cfg.source, ": /data/path: ", dc.path, " has ",
              has_test ? "test_x.npy but no test_y.npy" : "test_y.npy but no test_x.npy", "; give both or neither");
  if (has_test) {
    d.train_images = std::move(all);
    d.eval_images = npy_dataset(load_npy(file("test_x.npy")), load_npy(file("test_y.npy")), classes);
    const Shape& tr = d.train_images.images.shape();
    const Shape& te = d.eval_images.images.shape();
    REMAT_CHECK(tr[1] == te[1] && tr[2] == te[2] && tr[3] == te[3], file("test_x.npy"), ": images [", te[1], ", ",
                te[2], ", ", te[3], "], but train_x.npy's are [", tr[1], ", ", tr[2], ", ", tr[3], "]");
    return;
  }
  const int64_t n = all.labels.numel();
  const int64_t n_eval = std::max<int64_t>(1, std::llround(static_cast<double>(n) * dc.eval_fraction));
  REMAT_CHECK(n > n_eval, cfg.source, ": ", file("train_x.npy"), " holds ", n,
              " samples, too few to hold out data.eval_fraction ", dc.eval_fraction, " for evaluation");
  d.train_images = slice_images(all, 0, n - n_eval);
  d.eval_images = slice_images(all, n - n_eval, n_eval);
}

}  // namespace

namespace {

// The length translation pair i needs: its source and </s>, or <s> and its target, the longer.
int64_t pair_length(const TranslationSplit& t, int64_t i) {
  return static_cast<int64_t>(
             std::max(t.source[static_cast<size_t>(i)].size(), t.target[static_cast<size_t>(i)].size())) +
         1;
}

}  // namespace

std::vector<int64_t> RunData::train_lengths() const {
  std::vector<int64_t> lengths;
  if (!translation) return lengths;
  for (int64_t i = 0; i < translation->train.size(); ++i) lengths.push_back(pair_length(translation->train, i));
  return lengths;
}

int64_t RunData::bucket_length(const std::vector<int64_t>& idx) const {
  if (!translation || length_buckets.empty()) return 0;
  int64_t longest = 0;
  for (int64_t i : idx) longest = std::max(longest, pair_length(translation->train, i));
  for (int64_t b : length_buckets)
    if (longest <= b) return b;
  return 0;
}

Batch RunData::train_batch(const std::vector<int64_t>& idx, int64_t epoch, Device d, int64_t length) const {
  std::vector<uint8_t> flips;
  if (!text && hflip > 0) flips = hflip_draws(seed, epoch, train_size(), idx, hflip);
  if (translation) {
    const int64_t S = translation->src_len, T = translation->tgt_len;
    return translation_batch(translation->train, idx, length > 0 ? std::min(length, S) : S,
                             length > 0 ? std::min(length, T) : T, d);
  }
  if (shards) return train_shards.batch(idx, seq_len, vocab, d);
  return batch(train_images, train_text, idx, d, flips);
}

Batch RunData::eval_batch(const std::vector<int64_t>& idx, Device d) const {
  if (translation) return translation_batch(translation->valid, idx, translation->src_len, translation->tgt_len, d);
  if (shards) return eval_shards.batch(idx, seq_len, vocab, d);
  return batch(eval_images, eval_text, idx, d, {});
}

Batch RunData::batch(const ImageDataset& images, const TextDataset& txt, const std::vector<int64_t>& idx, Device d,
                     const std::vector<uint8_t>& flips) const {
  if (!text) return image_batch(images, idx, d, flips);
  std::vector<int64_t> starts;
  for (int64_t i : idx) starts.push_back(i * seq_len);
  return text_batch(txt, starts, seq_len, d);
}

RunData load_run_data(const Config& cfg, const nlohmann::json& model) {
  RunData d;
  const DataConfig& dc = cfg.data;
  d.hflip = dc.augment.hflip;
  d.seed = cfg.training.seed;
  // A model without an "input" (an encoder-decoder's src, tgt, ...): fit_data_to_model
  // names what the data set fills and what the model declares.
  const std::string input_type = declared_input_type(model, kInputName);
  const bool tokens = input_type == "tokens";
  if (dc.dataset == "npy") {
    if (tokens) REMAT_THROW(cfg.source, ": /data/dataset: npy gives images but the model takes tokens");
    load_npy_data(cfg, d);
    return d;
  }
  if (dc.dataset == "fashion_mnist" || dc.dataset == "synthetic_images") {
    if (tokens) REMAT_THROW(cfg.source, ": /data/dataset: ", dc.dataset, " gives images but the model takes tokens");
    if (dc.dataset == "fashion_mnist") {
      const std::string dir = dc.path.empty() ? default_fashion_mnist_dir() : dc.path;
      auto tr = fashion_mnist_paths(dir, "train");
      auto te = fashion_mnist_paths(dir, "test");
      d.train_images = load_idx(tr.first, tr.second);
      d.eval_images = load_idx(te.first, te.second);
    } else {
      const auto& s = dc.image_shape;
      REMAT_CHECK(s.size() == 3, cfg.source, ": /data/image_shape: expected [C, H, W]");
      // One set of the seed's classes: the first synthetic_size samples train, the next
      // quarter evaluates (sample i depends only on (seed, i)).
      const int64_t n_train = dc.synthetic_size, n_eval = std::max<int64_t>(dc.synthetic_size / 4, 1);
      ImageDataset all = synthetic_images(n_train + n_eval, static_cast<int>(s[0]), static_cast<int>(s[1]),
                                          static_cast<int>(s[2]), static_cast<int>(dc.classes), cfg.training.seed);
      d.train_images = slice_images(all, 0, n_train);
      d.eval_images = slice_images(all, n_train, n_eval);
    }
    return d;
  }
  if (dc.dataset == "translation") {
    if (!input_type.empty())
      REMAT_THROW(cfg.source, ": /data/dataset: translation fills the inputs src, src_len, tgt and targets; the ",
                  "model declares \"input\" (of type ", input_type, ")");
    d.text = true;
    const bool default_dir = dc.path.empty();
    const std::string dir = default_dir ? default_translation_corpus_dir(dc.vocab) : dc.path;
    d.translation = std::make_shared<TranslationData>(load_translation_data(dir, dc.vocab, default_dir));
    if (d.translation->tokenizer.vocab() != dc.vocab)
      REMAT_THROW(cfg.source, ": /data/vocab: ", dc.vocab, ", but the tokenizer of ", dir, " has ",
                  d.translation->tokenizer.vocab(), " pieces (set data.vocab to it, or build the corpus with ",
                  "`remat corpus --vocab ", dc.vocab, "`)");
    return d;
  }
  if (!tokens && !input_type.empty())
    REMAT_THROW(cfg.source, ": /data/dataset: ", dc.dataset, " gives text but the model takes images");
  d.text = true;
  if (dc.dataset == "token_shards") {
    TokenShardData sd = load_token_shard_data(dc.path, dc.eval_fraction);
    d.shards = true;
    d.train_shards = std::move(sd.train);
    d.eval_shards = std::move(sd.eval);
    d.describe = std::move(sd.describe);
    return d;
  }
  TextDataset all;
  if (dc.dataset == "text") {
    if (dc.path.empty())
      all = load_text_corpus(default_text_corpus_dir());
    else if (fs::is_directory(dc.path))
      all = load_text_corpus(dc.path);
    else
      all = load_text(dc.path);
  } else {
    all = synthetic_text(dc.synthetic_size, static_cast<int>(dc.vocab), cfg.training.seed);
  }
  const auto n = static_cast<int64_t>(all.tokens.size());
  const auto n_eval = static_cast<int64_t>(static_cast<double>(n) * dc.eval_fraction);
  d.train_text = all;
  d.eval_text = all;
  d.train_text.tokens.assign(all.tokens.begin(), all.tokens.end() - n_eval);
  d.eval_text.tokens.assign(all.tokens.end() - n_eval, all.tokens.end());
  return d;
}

namespace {

void fit_translation_to_model(RunData& data, const Graph& g, const std::string& what, const std::string& cfg_source,
                              const std::vector<int64_t>& length_buckets) {
  const Layer& src = g.layer(g.require_input(kSourceName, what));
  const Layer& len = g.layer(g.require_input(kSourceLengthName, what));
  const Layer& tgt = g.layer(g.require_input(kTargetInName, what));
  const Layer& targets = g.layer(g.require_input(kTargetsName, what));
  for (int id : g.input_ids)
    if (id != src.id && id != len.id && id != tgt.id && id != targets.id)
      REMAT_THROW(what, " gives the model inputs src, src_len, tgt and targets; the model also declares \"",
                  g.layer(id).name, "\", which it does not fill");
  const int64_t b = g.batch;
  auto expect = [&](const Layer& in, bool rank2, const std::string& gives) {
    const bool ok = in.out_dtype == DType::i32 && in.out_shape.rank() == (rank2 ? 2 : 1) && in.out_shape[0] == b;
    if (!ok)
      REMAT_THROW(what, " gives ", gives, " for \"", in.name, "\" (", rank2 ? "[B, length]" : "[B]",
                  " i32), but the model declares ", in.out_shape.str(), " ", dtype_name(in.out_dtype));
  };
  expect(src, true, "source pieces");
  expect(len, false, "source lengths");
  expect(tgt, true, "<s> and target pieces");
  expect(targets, true, "target pieces and </s>");
  if (targets.out_shape != tgt.out_shape)
    REMAT_THROW(what, ": \"tgt\" ", tgt.out_shape.str(), " and \"targets\" ", targets.out_shape.str(),
                " must have one shape (the decoder reads one and predicts the other)");
  const Layer& loss = g.layer(g.loss_id);
  if (loss.ignore_index() != std::optional<int>(Tokenizer::kPad))
    REMAT_THROW(what, ": the loss \"", loss.name, "\" must ignore <pad> (\"ignore_index\": ", Tokenizer::kPad,
                "): padded target positions would count as predictions of <pad>");
  const int64_t vocab = g.layer(g.logits_id).out_shape[-1];
  if (vocab != data.translation->tokenizer.vocab())
    REMAT_THROW(what, ": the head \"", g.layer(g.logits_id).name, "\" gives ", vocab, " logits, but the tokenizer has ",
                data.translation->tokenizer.vocab(), " pieces (use \"$vocab\")");
  data.translation->fit(src.out_shape[1], tgt.out_shape[1]);
  data.seq_len = tgt.out_shape[1];
  data.describe = data.translation->describe();
  REMAT_CHECK(data.translation->train.size() >= b, what, ": ", data.translation->train.size(),
              " training pairs fit source ", src.out_shape[1], " and target ", tgt.out_shape[1],
              " pieces, fewer than a batch of ", b);
  REMAT_CHECK(data.translation->valid.size() > 0, what, ": no validation pair fits source ", src.out_shape[1],
              " and target ", tgt.out_shape[1], " pieces");
  const int64_t longest = std::max(src.out_shape[1], tgt.out_shape[1]);
  data.length_buckets.clear();
  for (int64_t b : length_buckets) {
    REMAT_CHECK(b < longest, cfg_source, ": /data/length_buckets: ", b, " is not below the model's lengths (source ",
                src.out_shape[1], ", target ", tgt.out_shape[1], "): the model's own lengths are the last bucket");
    data.length_buckets.push_back(b);
  }
}

}  // namespace

void fit_data_to_model(RunData& data, const Graph& g, const Config& cfg) {
  const std::string what = cfg.source + ": data.dataset " + cfg.data.dataset;
  if (data.translation) return fit_translation_to_model(data, g, what, cfg.source, cfg.data.length_buckets);
  const Layer& input = g.layer(g.require_input(kInputName, what));
  const Layer& targets = g.layer(g.require_input(kTargetsName, what));
  for (int id : g.input_ids)
    if (id != input.id && id != targets.id)
      REMAT_THROW(what, " gives the model inputs \"input\" and \"targets\"; the model also declares \"",
                  g.layer(id).name, "\", which no built-in data set fills");
  const int64_t b = g.batch;
  auto expect = [&](const Layer& in, const Shape& shape, DType dtype, const std::string& gives) {
    if (in.out_shape != shape || in.out_dtype != dtype)
      REMAT_THROW(what, " gives ", gives, " ", shape.str(), " ", dtype_name(dtype), " for \"", in.name,
                  "\", but the model declares ", in.out_shape.str(), " ", dtype_name(in.out_dtype));
  };
  if (!data.text) {
    const Tensor& images = data.train_images.images;
    expect(input, Shape{b, images.size(1), images.size(2), images.size(3)}, DType::f32, "images");
    expect(targets, Shape{b}, DType::i32, "class labels");
    const int64_t classes = g.logits_id >= 0 ? g.layer(g.logits_id).out_shape[-1] : 0;
    const int data_classes = std::max(data.train_images.num_classes, data.eval_images.num_classes);
    if (g.layer(g.loss_id).ignore_index() && data_classes > classes)
      REMAT_THROW(what, " has ", data_classes, " classes, but the loss \"", g.layer(g.loss_id).name, "\" reads ",
                  classes, " logits per sample");
    return;
  }
  if (input.out_shape.rank() != 2 || input.out_dtype != DType::i32)
    REMAT_THROW(what, " gives token windows [B, T] i32 for \"input\", but the model declares ", input.out_shape.str(),
                " ", dtype_name(input.out_dtype));
  data.seq_len = input.out_shape[1];
  expect(targets, input.out_shape, DType::i32, "next tokens");
  if (data.shards) data.vocab = g.layer(g.logits_id).out_shape[-1];
}

}  // namespace remat
