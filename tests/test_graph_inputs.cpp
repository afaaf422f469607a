// Named model inputs and the loss as a layer: the explicit form (model.inputs, a loss layer
// last) builds the same graph as the shorthand (model.input, model.loss) and trains bitwise
// the same; a model with several inputs binds a batch by name; bad declarations, batches and
// data are refused with the file, the pointer or the input named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "remat/config.h"
#include "remat/exec.h"
#include "remat/graph.h"
#include "remat/train.h"
#include "support/expect_error.h"
#include "support/golden.h"
#include "support/models.h"

namespace {

using nlohmann::json;
using remat::Batch;
using remat::Device;
using remat::Graph;
using remat::Tensor;
using remat::test::batch_for;

namespace fs = std::filesystem;

// The explicit form of a shorthand model: "input" and "targets" declared, the loss a layer.
json explicit_form(json model) {
  const json in = model["input"];
  const bool tokens = in.value("type", "image") == "tokens";
  json input = in;
  input["name"] = "input";
  input["type"] = tokens ? "tokens" : "image";
  json targets = tokens ? json{{"name", "targets"}, {"type", "tokens"}, {"seq_len", in["seq_len"]}}
                        : json{{"name", "targets"}, {"type", "labels"}};
  model.erase("input");
  model["inputs"] = json::array({input, targets});
  json loss = {{"type", "cross_entropy"}, {"name", "loss"}};
  loss["inputs"] = json::array({model["layers"].back().value("name", ""), "targets"});
  if (model.contains("loss")) {
    for (auto it = model["loss"].begin(); it != model["loss"].end(); ++it) loss[it.key()] = it.value();
    model.erase("loss");
  }
  model["layers"].push_back(loss);
  return model;
}

// Losses of `steps` training steps and the gradients after the last, under `policy`.
struct StepRun {
  std::vector<float> losses;
  std::vector<std::vector<float>> grads;
};
StepRun run_steps(const Graph& g, const std::string& policy, int steps = 2) {
  remat::Backend& be = remat::backend_for(Device::cpu());
  remat::ParamStore ps(g, Device::cpu(), 5);
  remat::Executor ex(g, ps, be, remat::make_plan(g, policy));
  remat::RngGenerator gen(9);
  StepRun r;
  for (int s = 0; s < steps; ++s) {
    ps.zero_grads(be);
    r.losses.push_back(ex.train_step(batch_for(g, static_cast<uint32_t>(s)), gen).loss);
  }
  for (const Tensor& t : ps.grads)
    if (t.defined()) r.grads.push_back(t.to_vector());
  return r;
}

const json& shipped(const std::string& name) {
  static std::map<std::string, json> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    std::ifstream f(std::string(REMAT_SOURCE_DIR) + "/" + name);
    it = cache.emplace(name, json::parse(f)).first;
  }
  return it->second;
}

}  // namespace

// Every shorthand model of models/ and tests/configs, scaled down, written in the explicit
// form: the same layers, shapes and parameters, and bitwise the same losses and gradients
// under a plain and a checkpointed plan.
TEST(GraphInputs, ExplicitFormIsTheShorthandBitwise) {
  int compared = 0;
  for (const char* dir : {"models", "tests/configs"})
    for (const auto& e : fs::directory_iterator(fs::path(REMAT_SOURCE_DIR) / dir)) {
      if (e.path().extension() != ".json") continue;
      const json cfg = json::parse(std::ifstream(e.path()));
      if (!cfg.contains("model") || !cfg["model"].contains("input")) continue;
      SCOPED_TRACE(e.path().filename().string());
      // Scaled down where the model's width is a number (seq_mix_tiny's is a variable, and small).
      const json& m = cfg["model"];
      const json small = remat::test::model_dim(m) > 0 ? remat::test::shrink_model(m) : m;
      const Graph a = remat::build_graph(small, 2, "short.json", {{"vocab", 11}});
      const Graph b = remat::build_graph(explicit_form(small), 2, "explicit.json", {{"vocab", 11}});
      ASSERT_EQ(a.summary(), b.summary());
      ASSERT_EQ(a.input_ids, b.input_ids);
      EXPECT_EQ(a.loss_id, b.loss_id);
      EXPECT_EQ(a.logits_id, b.logits_id);
      EXPECT_EQ(a.targets_id, b.targets_id);
      for (const char* policy : {"none", "sqrt"}) {
        const StepRun ra = run_steps(a, policy), rb = run_steps(b, policy);
        EXPECT_EQ(ra.losses, rb.losses) << policy;
        EXPECT_EQ(ra.grads, rb.grads) << policy;
      }
      ++compared;
    }
  EXPECT_GE(compared, 8);
}

// models/gpt_char_rms.json is written in the explicit form; its shorthand twin is the same.
TEST(GraphInputs, ShippedExplicitModelMatchesItsShorthand) {
  const json model = remat::test::shrink_model(shipped("models/gpt_char_rms.json")["model"]);
  ASSERT_TRUE(model.contains("inputs"));
  json shorthand = model;
  shorthand.erase("inputs");
  shorthand["input"] = {{"type", "tokens"}, {"seq_len", model["inputs"][0]["seq_len"]}};
  shorthand["layers"].erase(shorthand["layers"].size() - 1);
  const Graph a = remat::build_graph(model, 2, "explicit.json", {{"vocab", 11}});
  const Graph b = remat::build_graph(shorthand, 2, "short.json", {{"vocab", 11}});
  EXPECT_EQ(a.summary(), b.summary());
  EXPECT_EQ(a.layer(a.loss_id).type, "cross_entropy");
  EXPECT_EQ(a.layer(a.input(remat::kTargetsName)).out_shape, a.layer(a.input(remat::kInputName)).out_shape);
  const StepRun ra = run_steps(a, "selective"), rb = run_steps(b, "selective");
  EXPECT_EQ(ra.losses, rb.losses);
  EXPECT_EQ(ra.grads, rb.grads);
}

namespace {

// Two image-like inputs summed, a classifier, labels under another name.
json two_input_model() {
  return json::parse(R"({
    "inputs": [
      {"name": "left", "type": "tensor", "shape": [6]},
      {"name": "right", "type": "tensor", "shape": [6]},
      {"name": "label", "type": "labels"}
    ],
    "layers": [
      {"type": "add", "name": "sum", "inputs": ["left", "right"]},
      {"type": "linear", "name": "fc", "out_features": 8},
      {"type": "gelu", "name": "act"},
      {"type": "dropout", "name": "drop", "p": 0.3},
      {"type": "linear", "name": "head", "out_features": 3},
      {"type": "cross_entropy", "name": "xent", "inputs": ["head", "label"], "ignore_index": 1}
    ]
  })");
}

}  // namespace

// A model of three inputs binds them by name: every policy gives bitwise the plain step, and
// the losses and gradients are those of the one-input model fed the sum computed on the host
// (an independent path to the same numbers).
TEST(GraphInputs, SeveralNamedInputsBindByNameAndMatchTheOneInputModel) {
  const Graph g = remat::build_graph(two_input_model(), 4, "two.json");
  ASSERT_EQ(g.input_ids.size(), 3u);
  EXPECT_EQ(g.layer(g.input("left")).out_shape, (remat::Shape{4, 6}));
  EXPECT_EQ(g.layer(g.input("label")).out_dtype, remat::DType::i32);
  EXPECT_EQ(g.targets_id, g.input("label"));
  EXPECT_EQ(g.layer(g.logits_id).name, "head");
  EXPECT_EQ(g.layer(g.loss_id).ignore_index(), 1);

  json one = two_input_model();
  one["inputs"] =
      json::parse(R"([{"name": "x", "type": "tensor", "shape": [6]}, {"name": "label", "type": "labels"}])");
  one["layers"].erase(0);
  one["layers"][0]["inputs"] = {"x"};
  const Graph g1 = remat::build_graph(one, 4, "one.json");

  remat::Backend& be = remat::backend_for(Device::cpu());
  const Tensor left = remat::test::random_tensor({4, 6}, 1), right = remat::test::random_tensor({4, 6}, 2);
  const Tensor label = Tensor::from_ints({0, 2, 1, 2}, {4});
  std::vector<float> sum = left.to_vector();
  const std::vector<float> r = right.to_vector();
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += r[i];
  Batch two;
  two.set("label", label).set("right", right).set("left", left);  // any order
  const Batch single = Batch().set("x", Tensor::from_vector(sum, {4, 6})).set("label", label);

  auto step = [&](const Graph& graph, const Batch& batch, const std::string& policy) {
    remat::ParamStore ps(graph, Device::cpu(), 3);
    remat::Executor ex(graph, ps, be, remat::make_plan(graph, policy));
    remat::RngGenerator gen(4);
    ps.zero_grads(be);
    StepRun out;
    out.losses.push_back(ex.train_step(batch, gen).loss);
    for (const Tensor& t : ps.grads) out.grads.push_back(t.to_vector());
    return out;
  };
  const StepRun ref = step(g1, single, "none");
  EXPECT_TRUE(std::isfinite(ref.losses[0]));
  for (const char* policy : {"none", "all", "sqrt", "selective", "every:2"}) {
    const StepRun got = step(g, two, policy);
    EXPECT_EQ(got.losses, ref.losses) << policy;
    EXPECT_EQ(got.grads, ref.grads) << policy;
  }
}

TEST(GraphInputs, BatchesAreCheckedByName) {
  const Graph g = remat::build_graph(two_input_model(), 4, "two.json");
  remat::Backend& be = remat::backend_for(Device::cpu());
  remat::ParamStore ps(g, Device::cpu(), 3);
  remat::Executor ex(g, ps, be, remat::make_plan(g, "none"));
  remat::RngGenerator gen(4);
  const Tensor x = remat::test::random_tensor({4, 6}, 1);
  const Tensor label = Tensor::from_ints({0, 2, 1, 2}, {4});
  EXPECT_REMAT_ERROR(ex.train_step(Batch().set("left", x).set("label", label), gen),
                     "the batch has no tensor for the model input \"right\" [4, 6] f32");
  EXPECT_REMAT_ERROR(ex.train_step(Batch().set("left", x).set("right", x.view({4, 3, 2})).set("label", label), gen),
                     "batch tensor \"right\" ");
  EXPECT_REMAT_ERROR(ex.train_step(Batch().set("left", x).set("right", x).set("label", x.view({24})), gen),
                     "does not match the model input [4] i32");
  EXPECT_REMAT_ERROR(ex.train_step(Batch().set("left", x).set("right", x).set("label", label).set("mask", label), gen),
                     "batch tensor \"mask\" is no input of the model");
  EXPECT_REMAT_ERROR(Batch().set("left", x).at("right"), "the batch has no tensor \"right\" (it has: left)");
  EXPECT_REMAT_ERROR(g.require_input("input", "data.dataset text"),
                     "data.dataset text needs a model input \"input\"; the model declares left, right, label");
}

TEST(GraphInputs, BadDeclarationsNameThePointer) {
  auto bad = [](const std::string& model, const char* msg) {
    EXPECT_REMAT_ERROR(remat::build_graph(json::parse(model), 2, "models/x.json"), msg);
  };
  const std::string in =
      R"("inputs": [{"name": "x", "type": "tensor", "shape": [4]}, {"name": "y", "type": "labels"}])";
  const std::string head = R"({"type": "linear", "name": "head", "out_features": 3})";
  const std::string loss = R"({"type": "cross_entropy", "inputs": ["head", "y"]})";
  EXPECT_NO_THROW(remat::build_graph(json::parse("{" + in + R"(, "layers": [)" + head + ", " + loss + "]}"), 2, "x"));
  bad("{" + in + R"(, "input": {"type": "image", "shape": [1, 2, 2]}, "layers": [)" + head + ", " + loss + "]}",
      "models/x.json: /model/input: give either \"input\" (the shorthand) or \"inputs\", not both");
  bad("{" + in + R"(, "loss": {"ignore_index": 0}, "layers": [)" + head + ", " + loss + "]}",
      "models/x.json: /model/loss: with \"inputs\", the loss is the last layer of \"layers\"");
  bad("{" + in + R"(, "layers": [)" + head + "]}",
      "models/x.json: /model/layers: no loss layer: with \"inputs\", the last layer is the loss (e.g. {\"type\": "
      "\"cross_entropy\", \"inputs\": [\"head\", \"targets\"]})");
  bad("{" + in + R"(, "layers": [)" + head + ", " + loss + R"(, {"type": "relu", "inputs": ["head"]}]})",
      "/model/layers: the loss \"cross_entropy1\" must be the last layer, but \"relu2\" comes after it");
  bad("{" + in + R"(, "layers": [)" + head + ", " + loss + R"(, {"type": "cross_entropy", "name": "again",
       "inputs": ["head", "y"]}]})",
      "/model/layers: two loss layers, \"cross_entropy1\" and \"again\": a model has one loss");
  bad(R"({"inputs": [{"name": "x", "type": "tensor", "shape": [4]}, {"name": "x", "type": "labels"}], "layers": []})",
      "models/x.json: /model/inputs/1/name: duplicate input name \"x\"");
  bad(R"({"inputs": [{"name": "a.b", "type": "labels"}], "layers": []})",
      "/model/inputs/0/name: expected a name without dots or spaces, got \"a.b\"");
  bad(R"({"inputs": [{"name": "x", "type": "audio"}], "layers": []})",
      "/model/inputs/0/type: expected one of image, tokens, labels, tensor, got \"audio\"");
  bad(R"({"inputs": [{"name": "x", "type": "tensor", "shape": [4], "dtype": "f16"}], "layers": []})",
      "/model/inputs/0/dtype: expected one of f32, i32, got \"f16\"");
  bad(R"({"inputs": [{"name": "x", "type": "tensor", "shape": [4], "seq_len": 3}], "layers": []})",
      "/model/inputs/0/seq_len: unknown key");
  bad(R"({"inputs": [], "layers": []})", "/model/inputs: expected at least one input");
  // The loss reads class ids: an f32 second input is refused at build, with the layer named.
  bad(R"({"inputs": [{"name": "x", "type": "tensor", "shape": [4]}, {"name": "y", "type": "tensor", "shape": [1]}],
          "layers": [)" +
          head + ", " + loss + "]}",
      "/model/layers/1: layer \"cross_entropy1\" (cross_entropy): cross_entropy: input 1 (y) is f32, expected i32");
  // The shorthand appends its own loss.
  bad(R"({"input": {"type": "image", "shape": [1, 2, 2]}, "layers": [{"type": "flatten"}, )" + head +
          R"(, {"type": "cross_entropy", "inputs": ["head", "targets"]}]})",
      "/model/layers: the shorthand \"input\" appends the loss itself");
}

// `remat train` checks that the data set gives what the model takes before the first step:
// the inputs' names, the images' shape, the classes.
TEST(GraphInputs, TrainingRefusesDataTheModelCannotTake) {
  const fs::path dir = fs::temp_directory_path() / ("remat_inputs_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto train = [&](const std::string& model, const std::string& data) {
    const std::string path = (dir / "m.json").string();
    std::ofstream(path) << R"({"model": )" << model << R"(, "data": )" << data
                        << R"(, "training": {"batch": 4, "steps": 1}})";
    remat::TrainOptions o;
    o.config = path;
    o.quiet = true;
    o.device = "cpu";
    return remat::train(o);
  };
  const std::string images = R"({"dataset": "synthetic_images", "image_shape": [1, 4, 4], "classes": 3})";
  const std::string cnn = R"({"input": {"type": "image", "shape": [1, 4, 4]},
      "layers": [{"type": "flatten"}, {"type": "linear", "out_features": 3}]})";
  EXPECT_GT(train(cnn, images).steps, 0);
  EXPECT_REMAT_ERROR(train(R"({"input": {"type": "image", "shape": [1, 5, 4]},
      "layers": [{"type": "flatten"}, {"type": "linear", "out_features": 3}]})",
                           images),
                     "m.json: data.dataset synthetic_images gives images [4, 1, 4, 4] f32 for \"input\", but the model "
                     "declares [4, 1, 5, 4] f32");
  EXPECT_REMAT_ERROR(train(R"({"input": {"type": "image", "shape": [1, 4, 4]},
      "layers": [{"type": "flatten"}, {"type": "linear", "out_features": 2}]})",
                           images),
                     "m.json: data.dataset synthetic_images has 3 classes, but the loss \"loss\" reads 2 logits");
  EXPECT_REMAT_ERROR(train(two_input_model().dump(), images),
                     "m.json: data.dataset synthetic_images needs a model input \"input\"; the model declares left, "
                     "right, label");
  fs::remove_all(dir);
}
