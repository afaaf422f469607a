// remat train's evaluation: accuracy counts the rows the loss counts, i.e. it skips the
// targets equal to the model's loss.ignore_index (not always -100); remat eval of an image
// run agrees with it; remat predict classifies images of a .npy file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "remat/config.h"
#include "remat/data.h"
#include "remat/evaluate.h"
#include "remat/io.h"
#include "remat/train.h"
#include "support/expect_error.h"

namespace fs = std::filesystem;
using remat::Device;
using remat::Tensor;

TEST(Eval, AccuracySkipsTheTargetsTheLossIgnores) {
  // seq_mix_tiny: synthetic text (vocab 10, 2048 tokens, 10% held out), seq_len 8, loss
  // ignore_index 0. Its 25 evaluation windows make evaluation batches of 1.
  const std::string cfg_path = std::string(REMAT_SOURCE_DIR) + "/tests/configs/seq_mix_tiny.json";
  const fs::path dir = fs::temp_directory_path() / ("remat_eval_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  remat::TrainOptions o;
  o.config = cfg_path;
  o.steps = 2;
  o.out = dir.string();
  o.quiet = true;
  o.sample = false;
  const remat::TrainResult r = remat::train(o);

  // The same evaluation by hand, from the final weights.
  const remat::Config cfg = remat::load_config(cfg_path);
  const remat::TextDataset all = remat::synthetic_text(2048, 10, 0);
  remat::TextDataset ev = all;
  const auto n_eval = static_cast<int64_t>(2048 * 0.1);
  ev.tokens.assign(all.tokens.end() - n_eval, all.tokens.end());
  const int64_t t = 8, windows = remat::text_windows(ev, t);
  ASSERT_EQ(windows, 25);
  remat::Graph g = remat::build_graph(cfg.model, 1, cfg_path, {{"vocab", 10}});
  remat::ParamStore ps(g, Device::cpu(), 0);
  const remat::SafetensorsFile w = remat::SafetensorsFile::load((dir / "checkpoint" / "model.safetensors").string());
  for (size_t p = 0; p < g.params.size(); ++p) ps.values[p].copy_from(w.tensor(g.params[p].name));
  remat::Executor ex(g, ps, remat::backend_for(Device::cpu()), remat::make_plan(g, "none"));
  int64_t correct = 0, counted = 0, correct_all = 0, rows = 0;
  for (int64_t k = 0; k < windows; ++k) {
    const remat::Batch b = remat::text_batch(ev, {k * t}, t, Device::cpu());
    const std::vector<float> logits = ex.evaluate(b, nullptr).to_vector();
    const int32_t* target = b.targets().i32();
    for (int64_t i = 0; i < t; ++i) {
      int64_t best = 0;
      for (int64_t j = 1; j < 10; ++j)
        if (logits[static_cast<size_t>(i * 10 + j)] > logits[static_cast<size_t>(i * 10 + best)]) best = j;
      const int64_t y = target[i];
      ++rows;
      correct_all += best == y;
      if (y == 0) continue;
      ++counted;
      correct += best == y;
    }
  }
  ASSERT_LT(counted, rows) << "no ignored target in the evaluation set: the test would not tell";
  const double want = static_cast<double>(correct) / static_cast<double>(counted);
  const double with_all_rows = static_cast<double>(correct_all) / static_cast<double>(rows);
  ASSERT_NE(want, with_all_rows) << "ignoring the targets makes no difference here: the test would not tell";
  EXPECT_DOUBLE_EQ(r.eval_accuracy, want);
  fs::remove_all(dir);
}

// `remat eval RUN` of an image classifier: the whole evaluation set in batches of 7 and a
// tail batch of the rest gives the loss and accuracy the trainer's own evaluation (one batch
// of all 64 images) gives; --max-batches stops early; --split is refused, and --data (token
// shards) wants a model of tokens.
TEST(Eval, ImageRunScoresItsEvaluationSetAsTheTrainerDoes) {
  const std::string cfg_path = std::string(REMAT_SOURCE_DIR) + "/tests/configs/fashion_cnn_tiny.json";
  const fs::path dir = fs::temp_directory_path() / ("remat_eval_images_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  remat::TrainOptions o;
  o.config = cfg_path;
  o.steps = 6;
  o.device = "cpu";
  o.out = dir.string();
  o.quiet = true;
  const remat::TrainResult r = remat::train(o);
  ASSERT_GE(r.eval_accuracy, 0.0);

  remat::EvalOptions e;
  e.config = dir.string();
  e.device = "cpu";
  e.batch = 7;
  e.quiet = true;
  const remat::EvalResult res = remat::evaluate(e);
  EXPECT_EQ(res.windows, 64);
  EXPECT_EQ(res.batches, 10);  // 9 of 7, then 1
  EXPECT_EQ(res.tokens, 0);
  ASSERT_TRUE(res.accuracy.has_value());
  EXPECT_EQ(*res.accuracy, r.eval_accuracy);
  EXPECT_NEAR(res.loss, r.eval_loss, 1e-5 * std::abs(r.eval_loss));
  EXPECT_TRUE(std::isnan(res.perplexity));
  EXPECT_EQ(res.init.path, dir.string());

  e.max_batches = 2;
  EXPECT_EQ(remat::evaluate(e).windows, 14);
  e.max_batches = 0;
  e.split = "valid";
  EXPECT_REMAT_ERROR(remat::evaluate(e),
                     "--split valid: a model of data.dataset \"synthetic_images\" evaluates one set");
  e.split.reset();
  e.data_path = dir.string();
  EXPECT_REMAT_ERROR(remat::evaluate(e), "remat eval needs a model of tokens");  // --data: token shards
  fs::remove_all(dir);
}

// `remat predict` of a model trained on .npy arrays (three separable classes): its classes
// for the 24 test images are their labels as NumPy wrote them, in batches of 5 and one of 4;
// the files it writes read back as NumPy's format, the classes the argmax of the logits.
TEST(Predict, ClassifiesImagesOfANpyFile) {
  const std::string src = REMAT_SOURCE_DIR;
  const fs::path dir = fs::temp_directory_path() / ("remat_predict_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  remat::TrainOptions t;
  t.config = src + "/tests/configs/npy_tiny.json";
  t.data_path = src + "/tests/golden/npy/blobs";
  t.device = "cpu";
  t.out = (dir / "run").string();
  t.quiet = true;
  ASSERT_EQ(remat::train(t).eval_accuracy, 1.0);

  remat::PredictOptions o;
  o.config = (dir / "run").string();
  o.input = src + "/tests/golden/npy/blobs/test_x.npy";
  o.out = (dir / "classes.npy").string();
  o.logits_out = (dir / "logits.npy").string();
  o.device = "cpu";
  o.batch = 5;
  o.quiet = true;
  const remat::Predictions p = remat::predict_images(o);
  const remat::NpyArray labels = remat::load_npy(src + "/tests/golden/npy/blobs/test_y.npy");
  ASSERT_EQ(p.classes.size(), 24u);
  for (int64_t k = 0; k < 24; ++k) EXPECT_EQ(p.classes[static_cast<size_t>(k)], labels.at(k)) << k;
  const remat::NpyArray classes = remat::load_npy(o.out), logits = remat::load_npy(o.logits_out);
  EXPECT_EQ(classes.dtype(), "<i4");
  EXPECT_EQ(classes.shape, (std::vector<int64_t>{24}));
  EXPECT_EQ(logits.dtype(), "<f4");
  EXPECT_EQ(logits.shape, (std::vector<int64_t>{24, 3}));
  for (int64_t k = 0; k < 24; ++k) {
    EXPECT_EQ(classes.at(k), p.classes[static_cast<size_t>(k)]);
    const double a = logits.at(3 * k), b = logits.at(3 * k + 1), c = logits.at(3 * k + 2);
    const int best = a >= b && a >= c ? 0 : b >= c ? 1 : 2;
    EXPECT_EQ(best, p.classes[static_cast<size_t>(k)]) << k;
    EXPECT_EQ(static_cast<float>(a), p.logits.f32()[3 * k]);
  }

  // Pixels near float's largest overflow the logits of their image: an error naming the
  // image, not the first class of a NaN (a NaN pixel is refused when the file is read).
  std::vector<float> px(static_cast<size_t>(3 * 16), 0.5f);
  for (size_t k = 16; k < 32; ++k) px[k] = 3e38f;
  remat::save_npy((dir / "huge.npy").string(), Tensor::from_vector(px, remat::Shape{3, 1, 4, 4}));
  o.input = (dir / "huge.npy").string();
  o.out = (dir / "huge_classes.npy").string();
  EXPECT_REMAT_ERROR(remat::predict_images(o), "huge.npy: the logits of image 1 are not finite (");
  EXPECT_FALSE(fs::exists(o.out)) << "nothing written for a failed prediction";

  o.input = src + "/tests/golden/npy/x_f32.npy";  // [2, 1, 2, 3]
  EXPECT_REMAT_ERROR(remat::predict_images(o),
                     "x_f32.npy: images [1, 2, 3], but the model \"npy_tiny\" reads images "
                     "[1, 4, 4]");
  o.config = src + "/tests/configs/gpt_char_tiny.json";
  EXPECT_REMAT_ERROR(remat::predict_images(o), "remat predict classifies images");
  fs::remove_all(dir);
}

// A Fashion-MNIST run trained on normalised pixels: predict normalises its images the same
// way, so its logits for pixels x are the logits another run (the same weights, data not
// Fashion-MNIST) gives for (x - mean) / std.
TEST(Predict, NormalisesPixelsAsAFashionMnistRunTrained) {
  const std::string src = REMAT_SOURCE_DIR;
  const fs::path dir = fs::temp_directory_path() / ("remat_predict_fm_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  remat::TrainOptions t;
  t.config = src + "/tests/configs/fashion_cnn_tiny.json";
  t.steps = 2;
  t.device = "cpu";
  t.out = (dir / "plain").string();
  t.quiet = true;
  remat::train(t);
  fs::copy(dir / "plain", dir / "fashion", fs::copy_options::recursive);
  nlohmann::json cfg = nlohmann::json::parse(remat::read_file((dir / "fashion" / "config.json").string()));
  cfg["data"]["dataset"] = "fashion_mnist";
  remat::write_file_atomic((dir / "fashion" / "config.json").string(), cfg.dump());

  std::vector<float> pixels(3 * 12 * 12), normalised(pixels.size());
  for (size_t k = 0; k < pixels.size(); ++k) {
    pixels[k] = static_cast<float>(k % 256) / 255.0f;
    normalised[k] = (pixels[k] - remat::kFashionMnistMean) / remat::kFashionMnistStd;
  }
  remat::save_npy((dir / "x.npy").string(), Tensor::from_vector(pixels, remat::Shape{3, 12, 12}));
  remat::save_npy((dir / "xn.npy").string(), Tensor::from_vector(normalised, remat::Shape{3, 12, 12}));
  remat::PredictOptions o;
  o.device = "cpu";
  o.quiet = true;
  o.config = (dir / "fashion").string();
  o.input = (dir / "x.npy").string();
  const remat::Predictions fashion = remat::predict_images(o);
  o.config = (dir / "plain").string();
  o.input = (dir / "xn.npy").string();
  const remat::Predictions plain = remat::predict_images(o);
  EXPECT_EQ(fashion.logits.to_vector(), plain.logits.to_vector());
  o.input = (dir / "x.npy").string();
  EXPECT_NE(remat::predict_images(o).logits.to_vector(), plain.logits.to_vector()) << "normalisation changes nothing";
  fs::remove_all(dir);
}
