// The `remat` command as a user meets it: bad option values are usage errors naming the
// option and the value, run folders are not overwritten by accident, errors carry no
// source paths, --version and --quiet.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

namespace {

const std::string kTiny = std::string(REMAT_SOURCE_DIR) + "/tests/configs/mpi_tiny.json";

struct Result {
  int rc = -1;         // the exit status
  std::string output;  // stdout and stderr together
};

// Runs `remat ARGS` with stdout and stderr captured; `env` is prepended (VAR=value ...).
Result run(const std::string& args, const std::string& env = "") {
  // ctest runs the cases of this file in parallel processes: one output file each.
  const std::string out = (fs::temp_directory_path() / ("remat_cli_" + std::to_string(::getpid()) + ".txt")).string();
  const int status = std::system((env + " " + std::string(REMAT_CLI) + " " + args + " > " + out + " 2>&1").c_str());
  std::ifstream in(out);
  std::stringstream ss;
  ss << in.rdbuf();
  fs::remove(out);
  Result r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.output = ss.str();
  return r;
}

bool contains_loss(const std::string& line) { return line.find("\"loss\"") != std::string::npos; }

std::string tmp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("remat_cli_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  return p.string();
}

// Records of metrics.jsonl with a loss (one per logged step).
int loss_records(const std::string& run_dir) {
  std::ifstream m(run_dir + "/metrics.jsonl");
  int n = 0;
  for (std::string l; std::getline(m, l);) n += contains_loss(l);
  return n;
}

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

}  // namespace

// A negative count was taken for "not given" (a -1 sentinel) and silently replaced by the
// config's value; now every such option rejects it, naming the option and the value, with
// the exit status of a usage error.
TEST(Cli, NegativeNumbersAreUsageErrorsNamingTheOption) {
  const struct {
    std::string args, option, value;
  } cases[] = {
      {"train " + kTiny + " --batch -4", "--batch", "-4"},
      {"train " + kTiny + " --batch -1", "--batch", "-1"},
      {"train " + kTiny + " --batch 0", "--batch", "0"},
      {"train " + kTiny + " --steps -1", "--steps", "-1"},
      {"train " + kTiny + " --epochs -1", "--epochs", "-1"},
      {"train " + kTiny + " --seed -1", "--seed", "-1"},
      {"train " + kTiny + " --micro-batch -2", "--micro-batch", "-2"},
      {"eval " + kTiny + " --batch -3", "--batch", "-3"},
      {"eval " + kTiny + " --seed -1", "--seed", "-1"},
      {"eval " + kTiny + " --max-batches -1", "--max-batches", "-1"},
      {"memprof " + kTiny + " --batch -1", "--batch", "-1"},
      {"memprof " + kTiny + " --micro-batch -1", "--micro-batch", "-1"},
      {"memprof " + kTiny + " --seq -8", "--seq", "-8"},
      {"plan " + kTiny + " --batch -1", "--batch", "-1"},
      {"plan " + kTiny + " --micro-batch -5", "--micro-batch", "-5"},
      {"plan " + kTiny + " --seq -1", "--seq", "-1"},
      {"plan " + kTiny + " --offload --link-gbps 0", "--link-gbps", "0"},
      {"plan " + kTiny + " --offload --tflops -3", "--tflops", "-3"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const Result r = run(c.args);
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_TRUE(contains(r.output, c.option + ": " + c.value + ": must be")) << r.output;
  }
  // The offload model's options without --offload: an error saying what is missing.
  const Result lone = run("plan " + kTiny + " --host-budget 1GiB");
  EXPECT_NE(lone.rc, 0);
  EXPECT_TRUE(contains(lone.output, "--host-budget, --link-gbps and --tflops weigh offload: add --offload"))
      << lone.output;
  // In range, the same options run.
  const Result ok = run("memprof " + kTiny + " --batch 4 --micro-batch 0 --seq 8 --policy none");
  EXPECT_EQ(ok.rc, 0) << ok.output;
  EXPECT_TRUE(contains(ok.output, "batch 4")) << ok.output;
}

// Other usage errors of the option parser exit with the same status.
TEST(Cli, UsageErrorsExitWithStatus2) {
  const Result unknown = run("train " + kTiny + " --bogus");
  EXPECT_EQ(unknown.rc, 2) << unknown.output;
  EXPECT_TRUE(contains(unknown.output, "--bogus")) << unknown.output;
  EXPECT_FALSE(contains(unknown.output, "did you mean")) << "--bogus is near no option: " << unknown.output;
  // A typo gets the command's nearest option.
  const Result typo = run("train " + kTiny + " --stpes 3");
  EXPECT_EQ(typo.rc, 2) << typo.output;
  EXPECT_TRUE(contains(typo.output, "unknown option --stpes; did you mean --steps?")) << typo.output;
  const Result plan_typo = run("plan " + kTiny + " --bugdet=8GiB");
  EXPECT_TRUE(contains(plan_typo.output, "did you mean --budget?")) << plan_typo.output;
  EXPECT_EQ(run("").rc, 2);  // no subcommand
  EXPECT_EQ(run("train --help").rc, 0);
}

// --out into a folder that holds a run used to overwrite its checkpoint and append to its
// metrics.jsonl; now it is an error that names the folder and the ways on (--resume to
// continue, --overwrite to start over, which truncates metrics.jsonl).
TEST(Cli, OutIntoAnExistingRunNeedsResumeOrOverwrite) {
  const std::string dir = tmp_dir("out");
  const std::string train = "train " + kTiny + " --device cpu --quiet --steps 2 --out " + dir;
  fs::create_directories(dir);  // an empty folder is fine
  const Result first = run(train);
  ASSERT_EQ(first.rc, 0) << first.output;
  ASSERT_EQ(loss_records(dir), 2);
  const Result again = run(train);
  EXPECT_EQ(again.rc, 1) << again.output;
  EXPECT_TRUE(contains(again.output, "--out " + dir + ": the folder holds a run (checkpoint, metrics.jsonl)"))
      << again.output;
  EXPECT_TRUE(contains(again.output, "--resume " + dir)) << again.output;
  EXPECT_TRUE(contains(again.output, "--overwrite")) << again.output;
  EXPECT_EQ(loss_records(dir), 2);  // untouched
  // A folder with only metrics.jsonl (a run stopped before its first checkpoint) is a run too.
  fs::remove_all(dir + "/checkpoint");
  EXPECT_EQ(run(train).rc, 1);
  const Result over = run(train + " --overwrite");
  EXPECT_EQ(over.rc, 0) << over.output;
  EXPECT_EQ(loss_records(dir), 2);  // started over, not appended to
  EXPECT_TRUE(fs::exists(dir + "/checkpoint/state.json"));
  const Result both = run(train + " --overwrite --resume " + dir);
  EXPECT_EQ(both.rc, 2) << both.output;
  // A path that cannot be a folder: a clear error naming it, not an unexpected one.
  const Result proc = run("train " + kTiny + " --device cpu --quiet --steps 1 --out /proc/remat_no_such/run");
  EXPECT_EQ(proc.rc, 1) << proc.output;
  EXPECT_TRUE(contains(proc.output, "remat: error: --out /proc/remat_no_such/run: cannot create the run folder"))
      << proc.output;
  fs::remove_all(dir);
}

// A resume says which learning-rate schedule it follows: the run's own, or with
// --reschedule one fitted to the new length.
TEST(Cli, ResumeSaysWhichScheduleItUses) {
  const std::string dir = tmp_dir("schedule");
  fs::create_directories(dir);
  std::ifstream in(kTiny);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string cfg = ss.str();
  cfg.replace(cfg.find("\"optimizer\""), 0, R"("schedule": {"type": "cosine", "min_lr_ratio": 0.1}, )");
  std::ofstream(dir + "/cosine.json") << cfg;
  const std::string train = "train " + dir + "/cosine.json --device cpu ";
  ASSERT_EQ(run(train + "--quiet --steps 2 --out " + dir + "/run").rc, 0);
  const Result extended = run(train + "--steps 5 --resume " + dir + "/run");
  EXPECT_EQ(extended.rc, 0) << extended.output;
  EXPECT_TRUE(contains(extended.output,
                       "schedule: cosine schedule of the run: 2 steps; steps 3-5 run at its final lr 1.000e-03 "
                       "(--reschedule fits it to 5 steps)"))
      << extended.output;
  const Result fitted = run(train + "--steps 6 --reschedule --resume " + dir + "/run");
  EXPECT_EQ(fitted.rc, 0) << fitted.output;
  EXPECT_TRUE(contains(fitted.output, "schedule: cosine schedule fitted to 6 steps (--reschedule; the run's was 2)"))
      << fitted.output;
  EXPECT_EQ(run(train + "--steps 4 --reschedule").rc, 2);  // --reschedule needs --resume
  fs::remove_all(dir);
}

// Errors tell the user the file, field and value at fault, not remat's source file or the
// text of a failed check (they were printed as "(src/graph/config.cpp:34)" and "[check
// `in[0].rank() == 3 && ...` failed]"); REMAT_LOG=debug still shows them.
TEST(Cli, ErrorsShowNoSourcePathsOrCheckText) {
  const std::string dir = tmp_dir("errors");
  fs::create_directories(dir);
  std::ofstream(dir + "/no_model.json") << R"({"name": "bad", "training": {"batch": 4}})";
  // A check inside a layer, wrapped by the graph builder with the layer's place in the config.
  std::ofstream(dir + "/bad_attention.json") << R"({"name": "bad", "model": {
    "input": {"type": "tokens", "seq_len": 8}, "layers": [
      {"type": "embedding", "name": "embed", "vocab": 16, "dim": 16, "positions": 8},
      {"type": "flatten"},
      {"type": "linear", "name": "qkv", "out_features": 48},
      {"type": "attention", "name": "attn", "heads": 2}]},
    "data": {"dataset": "synthetic_text", "vocab": 16, "synthetic_size": 64},
    "training": {"batch": 4, "steps": 1}})";
  const struct {
    std::string args, message;
  } cases[] = {
      {"memprof " + dir + "/no_model.json", "remat: error: " + dir + "/no_model.json: /model: missing (required)\n"},
      {"memprof " + dir + "/bad_attention.json",
       "remat: error: " + dir +
           "/bad_attention.json: /model/layers/3: layer \"attn\" (attention): attention: input "
           "[4, 48] must be [B, T, (heads + 2 kv_heads) d] with heads 2, kv_heads 2\n"},
      {"plan " + kTiny + " --device meta",
       "remat: error: plan --device meta: name the device to plan for (cpu, cuda, cuda-emu)\n"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const Result r = run(c.args);
    EXPECT_EQ(r.rc, 1);
    EXPECT_EQ(r.output, c.message);  // the whole output: nothing after the message
    const Result debug = run(c.args, "REMAT_LOG=debug");
    EXPECT_TRUE(contains(debug.output, "error source:")) << debug.output;
    EXPECT_TRUE(contains(debug.output, ".cpp:")) << debug.output;
  }
  const Result check = run("plan " + kTiny + " --device meta", "REMAT_LOG=debug");
  EXPECT_TRUE(contains(check.output, "[check `!dev.is_meta()` failed] (tools/remat/memprof.cpp:")) << check.output;
  fs::remove_all(dir);
}

// A data path that does not exist is named with where it was set (the config's field or
// --data) before anything is loaded; it said only "cannot open PATH".
TEST(Cli, AMissingDataPathNamesTheConfigAndField) {
  const std::string dir = tmp_dir("missing_data");
  fs::create_directories(dir);
  std::ofstream(dir + "/text.json") << R"({"name": "t", "model": {
    "input": {"type": "tokens", "seq_len": 8}, "layers": [
      {"type": "embedding", "vocab": "$vocab", "dim": 8}, {"type": "linear", "out_features": "$vocab"}]},
    "data": {"dataset": "text", "path": ")" +
                                           dir + R"(/nope.txt"}, "training": {"batch": 4, "steps": 1}})";
  const Result r = run("train " + dir + "/text.json --device cpu");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.output,
            "remat: error: " + dir + "/text.json: /data/path: " + dir + "/nope.txt: no such file or folder\n");
  const Result d = run("train " + dir + "/text.json --device cpu --data " + dir + "/other");
  EXPECT_EQ(d.output, "remat: error: --data: " + dir + "/other: no such file or folder\n");
  const Result f =
      run("train " + std::string(REMAT_SOURCE_DIR) + "/models/fashion_cnn.json --device cpu --data " + dir + "/fm");
  EXPECT_TRUE(contains(f.output, "--data: " + dir + "/fm: no such file or folder (a folder of the four Fashion-MNIST"))
      << f.output;
  fs::remove_all(dir);
}

// `remat --version` prints the version CMake sets; `--quiet` keeps the final summary line
// (it printed nothing at all).
TEST(Cli, VersionAndQuietSummary) {
  const Result version = run("--version");
  EXPECT_EQ(version.rc, 0) << version.output;
  EXPECT_EQ(version.output, std::string("remat ") + REMAT_VERSION + "\n");
  const Result quiet = run("train " + kTiny + " --device cpu --quiet --steps 2");
  EXPECT_EQ(quiet.rc, 0) << quiet.output;
  EXPECT_EQ(quiet.output.rfind("done: 2 steps, final loss ", 0), 0u) << quiet.output;
  EXPECT_EQ(std::count(quiet.output.begin(), quiet.output.end(), '\n'), 1) << quiet.output;
  const Result loud = run("train " + kTiny + " --device cpu --steps 2");
  EXPECT_TRUE(contains(loud.output, "\ndone: 2 steps, final loss ")) << loud.output;
  EXPECT_TRUE(contains(loud.output, "memory at the peak of a training step")) << loud.output;
  // The console states the precision up front and names the plan in the report (it said
  // "policy from the config").
  EXPECT_TRUE(contains(loud.output, "2 steps on cpu in fp32\n")) << loud.output;
  const Result bf16 = run("train " + kTiny + " --device cpu --steps 1 --precision bf16 --policy every:2");
  EXPECT_TRUE(contains(bf16.output, "1 step on cpu in bf16\n")) << bf16.output;
  EXPECT_TRUE(contains(bf16.output, "memory at the peak of a training step (policy every:2, bf16):")) << bf16.output;
  // An offloading run reports the pinned host tier beside the device's.
  const Result offload = run("train " + kTiny + " --device cuda-emu --steps 1 --policy none+offload");
  EXPECT_EQ(offload.rc, 0) << offload.output;
  EXPECT_TRUE(contains(offload.output, "(policy none+offload, fp32):")) << offload.output;
  EXPECT_TRUE(contains(offload.output, "pinned host peak")) << offload.output;
  EXPECT_FALSE(contains(loud.output, "pinned host peak")) << loud.output;
}

// The progress line's peak on a device holding the whole data set says how much of it the
// data is (memory.html and memprof show the step without it).
TEST(Cli, ProgressPeakSaysHowMuchIsTheStagedData) {
  const std::string dir = tmp_dir("staged");
  const Result r = run("train " + std::string(REMAT_SOURCE_DIR) +
                       "/tests/configs/fashion_cnn_tiny.json --steps 2 --out " + dir + " --device cpu");
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "of it the staged data)")) << r.output;
  fs::remove_all(dir);
}

// A run's reserved bytes from its second step on are what memprof predicts: the profile
// simulates a second step (docs/memory.md, "A run's later steps"). llama_tiny's selective
// plan at batch 16 reserves 405.50 KiB in its first step and 425.50 KiB in every step after.
TEST(Cli, TrainingReservesWhatMemprofPredicts) {
  const std::string cfg = std::string(REMAT_SOURCE_DIR) + "/tests/configs/llama_tiny.json";
  const std::string dir = tmp_dir("reserved");
  const Result train = run("train " + cfg + " --policy selective --batch 16 --steps 3 --device cpu --out " + dir);
  ASSERT_EQ(train.rc, 0) << train.output;
  const Result memprof = run("memprof " + cfg + " --policy selective --batch 16 --device cpu");
  ASSERT_EQ(memprof.rc, 0) << memprof.output;
  auto figure = [](const std::string& out) {  // "peak reserved   425.50 KiB" -> "425.50 KiB"
    const size_t at = out.find("peak reserved");
    if (at == std::string::npos) return std::string("(none)");
    std::istringstream line(out.substr(at + 13, out.find('\n', at) - at - 13));
    std::string value, unit;
    line >> value >> unit;
    return value + " " + unit;
  };
  EXPECT_EQ(figure(train.output), "425.50 KiB") << train.output;
  EXPECT_EQ(figure(memprof.output), figure(train.output)) << memprof.output;
  fs::remove_all(dir);
}
