// The training loop: resume is bitwise, checkpoints round-trip, NaN stops the run,
// bad files give clear errors, the shipped configs run a step.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <map>

#include <nlohmann/json.hpp>

#include "remat/graph.h"
#include "remat/io.h"
#include "remat/train.h"
#include "support/expect_error.h"

namespace fs = std::filesystem;

namespace {

std::string tmp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("remat_train_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  return p.string();
}

std::string write_config(const std::string& dir, const std::string& extra_training = "", double lr = 0.01,
                         const std::string& extra_data = "", int steps = 8) {
  fs::create_directories(dir);
  const std::string path = dir + "/tiny.json";
  std::ofstream(path) << R"({
    "name": "tiny",
    "model": {
      "input": {"type": "image", "shape": [1, 6, 6]},
      "layers": [
        {"type": "flatten"},
        {"type": "linear", "name": "proj", "out_features": 24},
        {"type": "repeat", "name": "b", "count": 4, "checkpoint": true, "layers": [
          {"type": "linear", "name": "fc1", "out_features": 32},
          {"type": "gelu", "name": "act"},
          {"type": "linear", "name": "fc2", "out_features": 24},
          {"type": "dropout", "name": "drop", "p": 0.2},
          {"type": "add", "name": "res", "inputs": ["in", "drop"]}
        ]},
        {"type": "linear", "name": "head", "out_features": 4}
      ]
    },
    "data": {"dataset": "synthetic_images", "image_shape": [1, 6, 6], "classes": 4, "synthetic_size": 96)" +
                             extra_data + R"(},
    "optimizer": {"type": "adamw", "lr": )" +
                             std::to_string(lr) + R"(, "weight_decay": 0.01},
    "schedule": {"type": "cosine", "warmup_steps": 2},
    "training": {"batch": 8, "steps": )" +
                             std::to_string(steps) + R"(, "policy": "sqrt", "log_every": 1)" + extra_training + R"(}
  })";
  return path;
}

}  // namespace

// training.precision bf16 on the cpu: it learns as fp32 does (the same masters, rounded
// working copies), an interrupted run resumes bitwise, the checkpoint holds the fp32
// masters, and a checkpoint of either precision resumes in the other.
TEST(Train, Bf16TrainsResumesBitwiseAndKeepsFp32Masters) {
  const std::string dir = tmp_dir("bf16");
  const std::string cfg = write_config(dir, R"(, "checkpoint_every": 1)");
  remat::TrainOptions o;
  o.config = cfg;
  o.quiet = true;
  o.device = "cpu";
  o.out = dir + "/fp32";
  const remat::TrainResult f32 = remat::train(o);
  o.precision = "bf16";
  o.out = dir + "/bf16";
  const remat::TrainResult b16 = remat::train(o);
  ASSERT_EQ(b16.losses.size(), f32.losses.size());
  for (size_t i = 0; i < b16.losses.size(); ++i) {
    EXPECT_TRUE(std::isfinite(b16.losses[i]));
    EXPECT_NEAR(b16.losses[i], f32.losses[i], 0.03 * f32.losses[i]) << "step " << i + 1;
  }
  EXPECT_NE(b16.losses, f32.losses);  // it did compute in bf16
  // The checkpoint holds the fp32 masters, one per parameter (no working copies).
  const auto w16 = remat::SafetensorsFile::load(o.out + "/checkpoint/model.safetensors");
  const auto w32 = remat::SafetensorsFile::load(dir + "/fp32/checkpoint/model.safetensors");
  ASSERT_EQ(w16.entries().size(), w32.entries().size());
  for (const auto& e : w16.entries()) EXPECT_EQ(e.dtype, remat::DType::f32) << e.name;

  // Interrupted after step 5, resumed: bitwise the uninterrupted bf16 run.
  remat::TrainOptions first = o;
  first.out = dir + "/split";
  first.on_step = [](int64_t step, float) {
    if (step == 5) throw remat::Error("interrupted");
  };
  EXPECT_REMAT_ERROR(remat::train(first), "interrupted");
  remat::TrainOptions resume = o;
  resume.out.clear();
  resume.resume = dir + "/split";
  const remat::TrainResult r = remat::train(resume);
  ASSERT_EQ(r.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(r.losses[i], b16.losses[4 + i]) << "step " << 5 + i;
  const auto wr = remat::SafetensorsFile::load(resume.resume + "/checkpoint/model.safetensors");
  for (const auto& e : w16.entries())
    EXPECT_EQ(w16.tensor(e.name).to_vector(), wr.tensor(e.name).to_vector()) << e.name;

  // A bf16 checkpoint resumes in fp32 and an fp32 one in bf16 (the masters are fp32 in both).
  for (const auto& [from, precision] : {std::pair<std::string, std::string>{"/split", "fp32"}, {"/fp32", "bf16"}}) {
    remat::TrainOptions other = o;
    other.out.clear();
    other.resume = dir + from;
    other.precision = precision;
    other.steps = 10;
    const remat::TrainResult x = remat::train(other);
    ASSERT_EQ(x.losses.size(), 2u) << from;
    EXPECT_TRUE(std::isfinite(x.last_loss)) << from;
  }
  fs::remove_all(dir);
}

TEST(Train, PrecisionErrors) {
  const std::string dir = tmp_dir("precision");
  remat::TrainOptions o;
  o.config = write_config(dir);
  o.quiet = true;
  o.device = "cpu";
  o.precision = "fp16";
  EXPECT_REMAT_ERROR(remat::train(o), "--precision: fp16 is not supported");
  o.precision = "bf17";
  EXPECT_REMAT_ERROR(remat::train(o), "--precision: unknown precision \"bf17\"");
  fs::remove_all(dir);
}

namespace {
// A layer type with no bf16 ops (Layer::runs_in_bf16 left false): y = x.
class Fp32OnlyIdentity final : public remat::Layer {
 public:
  remat::LayerKind kind() const override { return remat::LayerKind::view; }
  remat::Shape infer(const std::vector<remat::Shape>& in) override { return in.at(0); }
  void forward(remat::ForwardContext& c) const override { c.out = c.in[0].view(out_shape); }
  void backward(remat::BackwardContext& c) const override { c.din = {c.dout.view(out_shape)}; }
};
}  // namespace

// bf16 on a model with a layer that cannot run it: an error naming the layer and its type,
// before anything is built or trained.
TEST(Train, Bf16OnALayerWithoutBf16OpsNamesTheLayer) {
  remat::register_layer_type("test_fp32_only",
                             [](remat::ConfigReader&) { return std::make_unique<Fp32OnlyIdentity>(); });
  const std::string dir = tmp_dir("bf16_layer");
  fs::create_directories(dir);
  std::string cfg_text = remat::read_file(write_config(dir));
  const std::string at = R"({"type": "flatten"},)";
  cfg_text.replace(cfg_text.find(at), at.size(), at + R"( {"type": "test_fp32_only", "name": "legacy"},)");
  std::ofstream(dir + "/legacy.json") << cfg_text;
  remat::TrainOptions o;
  o.config = dir + "/legacy.json";
  o.quiet = true;
  o.device = "cpu";
  o.precision = "bf16";
  EXPECT_REMAT_ERROR(remat::train(o), "layer \"legacy\" (test_fp32_only) has no bf16 ops");
  o.precision = "fp32";
  EXPECT_EQ(remat::train(o).losses.size(), 8u);
  fs::remove_all(dir);
}

TEST(Train, ResumeContinuesBitwise) {
  const std::string dir = tmp_dir("resume");
  const std::string cfg = write_config(dir);
  remat::TrainOptions full;
  full.config = cfg;
  full.quiet = true;
  full.out = dir + "/full";
  const remat::TrainResult a = remat::train(full);
  ASSERT_EQ(a.losses.size(), 8u);

  remat::TrainOptions first = full;
  first.out = dir + "/split";
  first.steps = 5;  // an interrupted run: 5 of 8 steps, then resumed
  // The schedule length is part of the run: stop after 5 of the 8 configured steps.
  first.steps.reset();
  first.on_step = [](int64_t step, float) {
    if (step == 5) throw remat::Error("interrupted");
  };
  // Stopping by exception leaves the checkpoint of the last interval: save every step.
  const std::string cfg_ckpt = write_config(dir + "/c", R"(, "checkpoint_every": 1)");
  first.config = cfg_ckpt;
  EXPECT_REMAT_ERROR(remat::train(first), "interrupted");
  remat::TrainOptions resume;
  resume.config = cfg_ckpt;
  resume.quiet = true;
  resume.resume = dir + "/split";
  const remat::TrainResult b = remat::train(resume);
  ASSERT_EQ(b.losses.size(), 4u);  // steps 5..8: the checkpoint is from step 4
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(b.losses[i], a.losses[4 + i]) << "step " << 5 + i;
  // The weights after the resumed run equal those of the uninterrupted one.
  auto wa = remat::SafetensorsFile::load(full.out + "/checkpoint/model.safetensors");
  auto wb = remat::SafetensorsFile::load(resume.resume + "/checkpoint/model.safetensors");
  for (const auto& e : wa.entries()) {
    EXPECT_EQ(wa.tensor(e.name).to_vector(), wb.tensor(e.name).to_vector()) << e.name;
  }
  // metrics.jsonl: exactly one record per step 1..8, although steps after the step-4
  // checkpoint ran twice (the interrupted run logged them before it stopped).
  std::ifstream m(dir + "/split/metrics.jsonl");
  std::map<int64_t, int> step_records;
  for (std::string l; std::getline(m, l);) {
    auto j = nlohmann::json::parse(l);
    if (j.contains("loss")) step_records[j["step"].get<int64_t>()]++;
  }
  ASSERT_EQ(step_records.size(), 8u);
  for (auto [st, count] : step_records) EXPECT_EQ(count, 1) << "step " << st;
  // Resuming with another batch size would not continue the same run.
  remat::TrainOptions other = resume;
  other.batch = 4;
  EXPECT_REMAT_ERROR(remat::train(other), "resuming would not continue the same run");
  EXPECT_TRUE(fs::exists(dir + "/split/config.json"));
  fs::remove_all(dir);
}

TEST(Train, ResumeWithAugmentationContinuesBitwise) {
  // 20 steps of 12 per epoch, interrupted at step 17: the resumed run starts in epoch 1,
  // whose flips differ from epoch 0's.
  const std::string dir = tmp_dir("resume_aug");
  const std::string aug = R"(, "augment": {"hflip": 0.5})";
  remat::TrainOptions full;
  full.config = write_config(dir, "", 0.01, aug, 20);
  full.quiet = true;
  full.out = dir + "/full";
  const remat::TrainResult a = remat::train(full);
  ASSERT_EQ(a.losses.size(), 20u);
  // The augmentation is on: the same run without it takes other steps.
  remat::TrainOptions plain = full;
  plain.config = write_config(dir + "/p", "", 0.01, "", 20);
  plain.out = "";
  const remat::TrainResult c = remat::train(plain);
  EXPECT_NE(c.losses, a.losses);

  remat::TrainOptions first = full;
  first.config = write_config(dir + "/c", R"(, "checkpoint_every": 1)", 0.01, aug, 20);
  first.out = dir + "/split";
  first.on_step = [](int64_t step, float) {
    if (step == 17) throw remat::Error("interrupted");
  };
  EXPECT_REMAT_ERROR(remat::train(first), "interrupted");
  remat::TrainOptions resume;
  resume.config = first.config;
  resume.quiet = true;
  resume.resume = dir + "/split";
  const remat::TrainResult b = remat::train(resume);
  ASSERT_EQ(b.losses.size(), 4u);  // steps 17..20: the checkpoint is from step 16
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(b.losses[i], a.losses[16 + i]) << "step " << 17 + i;
  auto wa = remat::SafetensorsFile::load(full.out + "/checkpoint/model.safetensors");
  auto wb = remat::SafetensorsFile::load(resume.resume + "/checkpoint/model.safetensors");
  for (const auto& e : wa.entries()) EXPECT_EQ(wa.tensor(e.name).to_vector(), wb.tensor(e.name).to_vector()) << e.name;
  EXPECT_NE(remat::read_file(dir + "/split/config.json").find("\"hflip\": 0.5"), std::string::npos);
  fs::remove_all(dir);
}

TEST(Train, NanLossStopsWithTheStepAndKeepsTheLastCheckpoint) {
  const std::string dir = tmp_dir("nan");
  const std::string cfg = write_config(dir, R"(, "checkpoint_every": 2)", 1000.0);
  remat::TrainOptions o;
  o.config = cfg;
  o.quiet = true;
  o.out = dir + "/run";
  EXPECT_REMAT_ERROR(remat::train(o), "the loss is");
  // Whatever step diverged, a complete checkpoint (or none) is there, never a partial one.
  if (fs::exists(dir + "/run/checkpoint")) {
    EXPECT_TRUE(fs::exists(dir + "/run/checkpoint/state.json"));
    EXPECT_TRUE(fs::exists(dir + "/run/checkpoint/model.safetensors"));
  }
  EXPECT_FALSE(fs::exists(dir + "/run/checkpoint.new"));
  fs::remove_all(dir);
}

TEST(Train, CorruptCheckpointIsAClearError) {
  const std::string dir = tmp_dir("corrupt");
  const std::string cfg = write_config(dir);
  remat::TrainOptions o;
  o.config = cfg;
  o.quiet = true;
  o.out = dir + "/run";
  o.steps = 2;
  remat::train(o);
  const std::string model = dir + "/run/checkpoint/model.safetensors";
  std::string bytes = remat::read_file(model);
  bytes.resize(bytes.size() / 2);
  remat::write_file_atomic(model, bytes);
  remat::TrainOptions r;
  r.config = cfg;
  r.quiet = true;
  r.resume = dir + "/run";
  EXPECT_REMAT_ERROR(remat::train(r), "model.safetensors: not a valid safetensors file");
  fs::remove_all(dir);
}

TEST(Train, BadOptionsAreClearErrors) {
  const std::string dir = tmp_dir("bad");
  const std::string cfg = write_config(dir);
  remat::TrainOptions o;
  o.config = cfg;
  o.quiet = true;
  o.policy = "often";
  EXPECT_REMAT_ERROR(remat::train(o), "unknown checkpoint policy \"often\"");
  o.policy = "";
  o.device = "tpu";
  EXPECT_REMAT_ERROR(remat::train(o), "unknown device \"tpu\"");
  o.device = "meta";
  EXPECT_REMAT_ERROR(remat::train(o), "cannot train on meta");
  o.device = "cpu";
  o.batch = 1000;
  EXPECT_REMAT_ERROR(remat::train(o), "fewer than one batch");
  // An encoder-decoder (inputs src, src_len, tgt, targets): no built-in data set fills it.
  remat::TrainOptions nmt;
  nmt.config = std::string(REMAT_SOURCE_DIR) + "/tests/configs/nmt_tiny.json";
  nmt.quiet = true;
  EXPECT_REMAT_ERROR(remat::train(nmt),
                     "nmt_tiny.json: data.dataset synthetic_text needs a model input \"input\"; the "
                     "model declares src, src_len, tgt, targets");
  fs::remove_all(dir);
}

TEST(Train, CheckpointSurvivesACrashBetweenTheRenames) {
  const std::string dir = tmp_dir("swap");
  const std::string cfg = write_config(dir);
  remat::TrainOptions o;
  o.config = cfg;
  o.quiet = true;
  o.out = dir + "/run";
  o.steps = 2;
  remat::train(o);
  const std::string ck = dir + "/run/checkpoint";
  // A crash after the old checkpoint was moved aside and before the new one was installed:
  fs::rename(ck, ck + ".old");
  remat::TrainOptions r;
  r.config = cfg;
  r.quiet = true;
  r.resume = dir + "/run";
  r.steps = 3;
  remat::TrainResult res = remat::train(r);  // loads .old, saves a new checkpoint
  EXPECT_EQ(res.steps, 3);
  EXPECT_TRUE(fs::exists(ck + "/state.json"));
  EXPECT_FALSE(fs::exists(ck + ".old"));
  // A crash after the new checkpoint was complete but before it was renamed:
  fs::rename(ck, ck + ".new");
  r.steps = 4;
  EXPECT_EQ(remat::train(r).steps, 4);
  fs::remove_all(dir);
}

TEST(Train, EvaluatesAtTheEndOfEveryEpoch) {
  const std::string dir = tmp_dir("epochs");
  const std::string cfg = write_config(dir);
  remat::TrainOptions o;
  o.config = cfg;
  o.quiet = true;
  o.out = dir + "/run";
  o.epochs = 3;  // 96 samples / batch 8 = 12 steps per epoch
  const remat::TrainResult r = remat::train(o);
  EXPECT_EQ(r.steps, 36);
  std::ifstream m(dir + "/run/metrics.jsonl");
  std::vector<int64_t> eval_steps;
  for (std::string l; std::getline(m, l);) {
    auto j = nlohmann::json::parse(l);
    if (j.contains("eval_loss")) eval_steps.push_back(j["step"].get<int64_t>());
  }
  EXPECT_EQ(eval_steps, (std::vector<int64_t>{12, 24, 36}));
  // The held-out samples follow the same classes: well above chance (0.25).
  EXPECT_GT(r.eval_accuracy, 0.6);
  fs::remove_all(dir);
}

// An option set out of range is an error naming it and its value, never taken for "unset"
// (TrainOptions held -1 for "the config's" and ignored every negative value).
TEST(Train, OutOfRangeOptionsAreErrors) {
  const std::string dir = tmp_dir("range");
  const std::string cfg = write_config(dir);
  remat::TrainOptions o;
  o.config = cfg;
  o.quiet = true;
  o.batch = -4;
  EXPECT_REMAT_ERROR(remat::train(o), "--batch -4: must be positive");
  o.batch.reset();
  o.steps = -1;
  EXPECT_REMAT_ERROR(remat::train(o), "--steps -1: must be positive");
  o.steps.reset();
  o.epochs = 0;
  EXPECT_REMAT_ERROR(remat::train(o), "--epochs 0: must be positive");
  o.epochs.reset();
  o.micro_batch = -2;
  EXPECT_REMAT_ERROR(remat::train(o), "--micro-batch -2: must be 0");
  o.micro_batch.reset();
  o.seed = -1;
  EXPECT_REMAT_ERROR(remat::train(o), "--seed -1: must be 0 or more");
  fs::remove_all(dir);
}

namespace {

// The lr of each logged step of a run folder's metrics.jsonl.
std::map<int64_t, double> logged_lr(const std::string& run_dir) {
  std::map<int64_t, double> lr;
  std::ifstream m(run_dir + "/metrics.jsonl");
  for (std::string l; std::getline(m, l);) {
    const auto j = nlohmann::json::parse(l);
    if (j.contains("lr")) lr[j["step"].get<int64_t>()] = j["lr"].get<double>();
  }
  return lr;
}

}  // namespace

// `--resume RUN --steps N` extends a run: the cosine schedule keeps the length recorded in
// the checkpoint (steps past it run at its final rate), through later resumes too; it was
// rebuilt over N steps, so that the rates jumped back up with no word said. --reschedule
// fits it to N.
TEST(Train, ResumeWithMoreStepsKeepsTheRunsSchedule) {
  const std::string dir = tmp_dir("reschedule");
  std::string cfg = write_config(dir);
  {  // a cosine floor of 0.1 lr: the final rate is not 0
    std::string text = remat::read_file(cfg);
    const std::string from = R"("warmup_steps": 2})";
    text.replace(text.find(from), from.size(), R"("warmup_steps": 2, "min_lr_ratio": 0.1})");
    std::ofstream(cfg) << text;
  }
  const remat::Config c = remat::load_config(cfg);
  remat::TrainOptions o;
  o.config = cfg;
  o.quiet = true;
  o.out = dir + "/run";
  o.steps = 4;
  remat::train(o);
  fs::copy(dir + "/run", dir + "/stretched", fs::copy_options::recursive);
  const double final_lr = remat::scheduled_lr(c.optimizer, c.schedule, 4, 4);
  EXPECT_DOUBLE_EQ(final_lr, 0.001);

  remat::TrainOptions r;
  r.config = cfg;
  r.quiet = true;
  r.resume = dir + "/run";
  r.steps = 6;
  EXPECT_EQ(remat::train(r).losses.size(), 2u);
  r.steps = 8;  // and again: the checkpoint of the extended run still records 4 steps
  EXPECT_EQ(remat::train(r).losses.size(), 2u);
  const std::map<int64_t, double> kept = logged_lr(dir + "/run");
  ASSERT_EQ(kept.size(), 8u);
  for (int64_t step = 1; step <= 8; ++step)
    EXPECT_EQ(kept.at(step), remat::scheduled_lr(c.optimizer, c.schedule, step, 4)) << "step " << step;
  for (int64_t step = 5; step <= 8; ++step) EXPECT_EQ(kept.at(step), final_lr) << "step " << step;

  r.resume = dir + "/stretched";
  r.steps = 6;
  r.reschedule = true;
  remat::train(r);
  const std::map<int64_t, double> stretched = logged_lr(dir + "/stretched");
  ASSERT_EQ(stretched.size(), 6u);
  for (int64_t step = 5; step <= 6; ++step)
    EXPECT_EQ(stretched.at(step), remat::scheduled_lr(c.optimizer, c.schedule, step, 6)) << "step " << step;
  EXPECT_GT(stretched.at(5), final_lr);
  fs::remove_all(dir);
}

// A folder of .npy arrays trains a model (tests/configs/npy_tiny.json: three separable
// classes), evaluated on its test arrays, or on the held-out tail of its training arrays
// where it has none; a model that does not match the arrays fails at load, naming both.
TEST(Train, LearnsFromAFolderOfNpyArrays) {
  const std::string src = REMAT_SOURCE_DIR;
  remat::TrainOptions o;
  o.config = src + "/tests/configs/npy_tiny.json";
  o.data_path = src + "/tests/golden/npy/blobs";
  o.device = "cpu";
  o.quiet = true;
  const remat::TrainResult r = remat::train(o);
  EXPECT_EQ(r.steps, 40);
  EXPECT_LT(r.last_loss, 0.1f * r.losses.front());
  EXPECT_GE(r.eval_accuracy, 0.95) << "24 test images of 3 separable classes";
  o.data_path = src + "/tests/golden/npy/blobs_train";  // 96 samples: 86 train, the last 10 evaluate
  o.steps = 1;
  EXPECT_GE(remat::train(o).eval_accuracy, 0.0);

  // The model against the arrays, before any step.
  nlohmann::json j = nlohmann::json::parse(remat::read_file(src + "/tests/configs/npy_tiny.json"));
  const fs::path dir = fs::temp_directory_path() / ("remat_npy_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  j["model"]["input"]["shape"] = {1, 5, 5};
  remat::write_file_atomic((dir / "wide.json").string(), j.dump());
  o.config = (dir / "wide.json").string();
  o.data_path = src + "/tests/golden/npy/blobs";
  EXPECT_REMAT_ERROR(remat::train(o),
                     "data.dataset npy gives images [8, 1, 4, 4] f32 for \"input\", but the model "
                     "declares [8, 1, 5, 5] f32");
  j["model"]["input"]["shape"] = {1, 4, 4};
  j["model"]["layers"][3]["out_features"] = 2;
  remat::write_file_atomic((dir / "two.json").string(), j.dump());
  o.config = (dir / "two.json").string();
  EXPECT_REMAT_ERROR(remat::train(o), "data.dataset npy has 3 classes, but the loss");
  o.data_path = src + "/tests/golden/npy";
  EXPECT_REMAT_ERROR(remat::train(o), "has no train_x.npy; the npy data set reads train_x.npy and train_y.npy");
  fs::remove_all(dir);
}
