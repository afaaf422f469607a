// The project's lists agree with each other, so that adding an op or a layer cannot
// silently skip a step (docs/adding-an-op.md):
// - the op index at the end of include/remat/backend_ops.def names every op and the files of its
//   validator, cpu and cuda implementations; the validator's file names the op's family;
// - every op is called by a CPU test of its family (tests/ops/test_<family>.cpp) and by a
//   device case of its family (tests/backend_ops/cases_<family>.cpp, cuda-emu and cuda
//   against the cpu); it has bf16 tests in both (or a stated reason in kNoBf16), a PyTorch
//   golden (or a stated reason in kNoGolden), and a backward op gradient checks in both;
// - every aliasing rule of the op list is tested in tests/test_aliasing.cpp;
// - every registered layer type has a row in docs/config.md's table (and every row is a
//   type), and appears in a model config (models/*.json, tests/configs/*.json), which the
//   executor tests run under every checkpoint policy on cpu, and in a config the device
//   executor tests (tests/test_device_exec.cpp) run on cuda-emu;
// - every CUDA kernel file (kernels/*.cu) is described in docs/kernels.md;
// - every repository path the docs name exists.
// Each failure names the file to edit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "remat/graph.h"

namespace {

namespace fs = std::filesystem;
const fs::path kRoot = REMAT_SOURCE_DIR;

std::string read(const fs::path& p) {
  std::ifstream in(p);
  EXPECT_TRUE(in.good()) << "cannot read " << p;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// (Plain string scanning, not <regex>: GCC 12 warns inside libstdc++'s regex compiler
// under -fsanitize=address, and the asan build treats warnings as errors.)
bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Whether `text` holds `name(` where `name` does not continue an identifier on its left.
bool calls(const std::string& text, const std::string& name) {
  const std::string needle = name + "(";
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
    if (at == 0 || !ident_char(text[at - 1])) return true;
  return false;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// The op list's names in its order.
std::vector<std::string> backend_ops_in_order() {
  std::vector<std::string> ops;
  std::istringstream def(read(kRoot / "include/remat/backend_ops.def"));
  for (std::string line; std::getline(def, line);) {
    if (!starts_with(line, "REMAT_OP(")) continue;
    const size_t second = line.find(", ", line.find(',') + 1);
    if (second == std::string::npos) continue;
    const size_t begin = second + 2, end = line.find(',', begin);
    ops.push_back(line.substr(begin, end - begin));
  }
  return ops;
}

// One line of the op index at the end of include/remat/backend_ops.def:
//   "//   Backend::<op>   validate/<family>.cpp cpu/<file>.cpp cuda/<file>.cpp"
struct IndexLine {
  std::string op, validator, cpu, cuda;  // the files relative to src/backends/
};

std::vector<IndexLine> op_index() {
  std::vector<IndexLine> index;
  std::istringstream header(read(kRoot / "include/remat/backend_ops.def"));
  for (std::string line; std::getline(header, line);) {
    if (!starts_with(line, "//   Backend::")) continue;
    std::istringstream words(line.substr(14));
    IndexLine l;
    words >> l.op >> l.validator >> l.cpu >> l.cuda;
    index.push_back(l);
  }
  return index;
}

// The generated entry points cannot be found by grep, so the op list ends with an index of them:
// every op once, in the op list's order, each naming the files that define its validator
// and its cpu and cuda implementations.
TEST(Coverage, TheOpIndexNamesEveryOpAndItsFiles) {
  const std::vector<std::string> ops = backend_ops_in_order();
  const std::vector<IndexLine> index = op_index();
  ASSERT_GE(ops.size(), 40u) << "the op list was not parsed";
  const std::string where = "the op index at the end of include/remat/backend_ops.def (\"Where each op lives\")";
  std::vector<std::string> listed;
  for (const IndexLine& l : index) listed.push_back(l.op);
  for (const std::string& op : ops)
    EXPECT_TRUE(contains(listed, op))
        << where << " has no line for " << op << ": add `//   Backend::" << op
        << "  validate/<family>.cpp cpu/<family>.cpp cuda/<family>.cpp`, in the op list's order";
  for (const std::string& op : listed)
    EXPECT_TRUE(contains(ops, op)) << where << " names " << op
                                   << ", which is not in include/remat/backend_ops.def: remove its line";
  std::vector<std::string> in_list_order;  // the index's ops, in the op list's order
  for (const std::string& op : ops)
    if (contains(listed, op)) in_list_order.push_back(op);
  std::vector<std::string> known;
  for (const std::string& op : listed)
    if (contains(ops, op)) known.push_back(op);
  EXPECT_EQ(known, in_list_order) << where << " lists its ops in another order than include/remat/backend_ops.def";

  const fs::path backends = kRoot / "src/backends";
  for (const IndexLine& l : index) {
    SCOPED_TRACE("Backend::" + l.op);
    struct Defines {
      std::string file, dir, what;
    };
    for (const Defines& d :
         {Defines{l.validator, "validate/", "check_" + l.op}, Defines{l.cpu, "cpu/", "CpuBackend::" + l.op + "_impl"},
          Defines{l.cuda, "cuda/", "CudaBackend::" + l.op + "_impl"}}) {
      if (!starts_with(d.file, d.dir) || !ends_with(d.file, ".cpp") || !fs::exists(backends / d.file)) {
        ADD_FAILURE() << where << ": the line of " << l.op << " names \"" << d.file
                      << "\" where it needs a file src/backends/" << d.dir << "<name>.cpp";
        continue;
      }
      EXPECT_TRUE(calls(read(backends / d.file), d.what))
          << "src/backends/" << d.file << " does not define " << d.what << " (named by " << where
          << "): define it there, or name the file that does";
    }
  }
}

// ---- Every touch of an op, named by its family --------------------------------------------------
// An op's family is the name of its validator's file (src/backends/validate/<family>.cpp, as
// the index at the end of include/remat/backend_ops.def says). Its tests live in the family's files:
// tests/ops/test_<family>.cpp (the cpu backend: fp32 and bf16 goldens, finite differences,
// bad arguments) and tests/backend_ops/cases_<family>.cpp (the devices against the cpu, the
// `bf16*` cases and the `grad*` cases). docs/adding-an-op.md walks through them.

// One top-level definition of a C++ file: a TEST, a REMAT_OP_CASE, a helper function. The
// files are clang-formatted, so a definition starts at column 0 and ends at the next line
// that is "}" or "};".
struct Definition {
  std::string name;  // the test's or case's name (TEST(Suite, name)), or the function's
  bool is_test = false;
  std::string text;
};

std::vector<Definition> definitions(const std::string& file) {
  std::vector<Definition> out;
  std::istringstream in(file);
  Definition cur;
  enum { outside, head, body } state = outside;  // head: a signature before its '{'
  for (std::string line; std::getline(in, line);) {
    if (state == outside) {
      if (line.empty() || !(std::isalpha(static_cast<unsigned char>(line[0])) || line[0] == '_')) continue;
      if (starts_with(line, "namespace") || starts_with(line, "using ") || starts_with(line, "template")) continue;
      const size_t paren = line.find('(');
      if (paren == std::string::npos) continue;
      cur = Definition{};
      cur.is_test = starts_with(line, "TEST(") || starts_with(line, "TEST_F(") || starts_with(line, "REMAT_OP_CASE(");
      if (cur.is_test) {  // the second macro argument
        const size_t comma = line.find(',', paren), close = line.find(')', paren);
        if (comma == std::string::npos || close == std::string::npos) continue;
        cur.name = line.substr(comma + 1, close - comma - 1);
        cur.name.erase(0, cur.name.find_first_not_of(' '));
      } else {  // the identifier before the parameter list
        size_t b = paren;
        while (b > 0 && ident_char(line[b - 1])) --b;
        cur.name = line.substr(b, paren - b);
      }
      state = head;
    }
    cur.text += line + "\n";
    if (state == head) {
      if (line.find('{') == std::string::npos) {
        if (ends_with(line, ";")) state = outside;  // a declaration
        continue;
      }
      state = body;
      if (ends_with(line, "}")) {  // TEST(a, b) { f(); }
        out.push_back(cur);
        state = outside;
      }
      continue;
    }
    if (line == "}" || line == "};") {
      out.push_back(cur);
      state = outside;
    }
  }
  return out;
}

// The text of the tests of `file` that `pick` accepts, and of the helpers they call
// (and the helpers those call).
std::string tests_where(const std::string& file, const std::function<bool(const Definition&)>& pick) {
  const std::vector<Definition> defs = definitions(file);
  std::string text;
  std::vector<bool> taken(defs.size(), false);
  for (size_t i = 0; i < defs.size(); ++i)
    if (defs[i].is_test && pick(defs[i])) text += defs[i].text, taken[i] = true;
  for (bool grew = true; grew;) {
    grew = false;
    for (size_t i = 0; i < defs.size(); ++i)
      if (!taken[i] && !defs[i].is_test && !defs[i].name.empty() && calls(text, defs[i].name))
        text += defs[i].text, taken[i] = grew = true;
  }
  return text;
}

// The op is called in text, directly or through its allocating wrapper (ops::layernorm for
// layernorm_forward).
bool exercises(const std::string& text, const std::string& op) {
  std::string w = op;
  if (const size_t f = w.find("_forward"); f != std::string::npos) w.erase(f, 8);
  return calls(text, op) || calls(text, "ops::" + w);
}

struct Family {
  std::string name;
  std::vector<std::string> ops;
};

// The families of the op index, each with its ops (workspace queries left out: their op
// exercises them, ops.h allocating through them).
std::vector<Family> op_families() {
  std::vector<Family> out;
  for (const IndexLine& l : op_index()) {
    if (ends_with(l.op, "_workspace") || !starts_with(l.validator, "validate/")) continue;
    const std::string family = l.validator.substr(9, l.validator.size() - 9 - 4);
    auto it = std::find_if(out.begin(), out.end(), [&](const Family& f) { return f.name == family; });
    if (it == out.end()) it = out.insert(out.end(), Family{family, {}});
    it->ops.push_back(l.op);
  }
  return out;
}

std::string read_if_exists(const fs::path& p) { return fs::exists(p) ? read(p) : std::string(); }

bool starts_with_ci(const std::string& s, const std::string& prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  return true;
}

// Ops that have no bf16 form, and why: they run on the fp32 master weights and gradients
// whatever training.precision says (docs/memory.md, "Mixed precision").
const std::set<std::string> kNoBf16 = {
    "sgd_step",   "sgd_step_multi",  // the optimizers update the fp32 masters from fp32 gradients
    "adamw_step", "adamw_step_multi", "global_norm", "clip_grad_norm",  // over the fp32 gradients
};

// Ops whose fp32 tests are their bf16 ones, and why.
const std::set<std::string> kBf16Only = {
    "cast_multi",  // converts f32 to bf16 (the working-copy refresh): every test of it is a bf16 one
};

// Ops without a PyTorch golden, and why.
const std::set<std::string> kNoGolden = {
    "accumulate",        // dst += src: an fp32 add; checked against the elementwise sum in the test itself
    "scale",             // y = alpha * x: one product; checked against it in the test itself
    "cast_multi",        // conversions: bitwise scale(src, 1, dst) (Elementwise.Bf16CastMultiIsScaleByOnePerTensor)
    "dropout_forward",   // PyTorch cannot draw remat's Philox mask: an element-keyed reference instead
    "dropout_backward",  // (Elementwise.DropoutMatchesElementKeyedReference, DropoutBackwardUsesTheForwardMask)
    "accuracy",          // an argmax count: hand-computed rows (SoftmaxLoss.CrossEntropyGradientAndEdgeCases)
};

TEST(Coverage, EveryBackendOpIsTestedOnTheCpuAndOnTheDevices) {
  const std::vector<Family> families = op_families();
  ASSERT_GE(families.size(), 10u) << "the op index was not parsed";
  for (const Family& f : families) {
    const std::string cpu_file = "tests/ops/test_" + f.name + ".cpp";
    const std::string case_file = "tests/backend_ops/cases_" + f.name + ".cpp";
    // In fp32: the bf16 tests and the gradient cases (each device against itself) are checked
    // apart, below.
    const std::string cpu_tests = tests_where(read_if_exists(kRoot / cpu_file),
                                              [](const Definition& d) { return !starts_with_ci(d.name, "bf16"); });
    const std::string device_cases = tests_where(read_if_exists(kRoot / case_file), [](const Definition& d) {
      return !starts_with(d.name, "grad") && !starts_with(d.name, "bf16");
    });
    for (const std::string& op : f.ops) {
      if (kBf16Only.count(op)) continue;  // EveryBackendOpHasBf16Tests checks it
      EXPECT_TRUE(exercises(cpu_tests, op))
          << op << " is not called by any fp32 CPU test of its family: add one to " << cpu_file
          << " (the cpu backend against a golden, finite differences, bad arguments)";
      EXPECT_TRUE(exercises(device_cases, op))
          << op << " is not called by any fp32 device case of its family: add a REMAT_OP_CASE(" << f.name
          << ", ...) to " << case_file << " (the device against the cpu)";
    }
  }
}

// Every op has bf16 tests on the cpu (a TEST named Bf16...) and on the devices (a case named
// bf16...), or is listed in kNoBf16 with the reason.
TEST(Coverage, EveryBackendOpHasBf16Tests) {
  for (const Family& f : op_families()) {
    const std::string cpu_file = "tests/ops/test_" + f.name + ".cpp";
    const std::string case_file = "tests/backend_ops/cases_" + f.name + ".cpp";
    const std::string cpu_bf16 = tests_where(read_if_exists(kRoot / cpu_file),
                                             [](const Definition& d) { return starts_with_ci(d.name, "bf16"); });
    const std::string device_bf16 =
        tests_where(read_if_exists(kRoot / case_file), [](const Definition& d) { return starts_with(d.name, "bf16"); });
    for (const std::string& op : f.ops) {
      if (kNoBf16.count(op)) {
        EXPECT_FALSE(exercises(cpu_bf16, op) && exercises(device_bf16, op))
            << op << " has bf16 tests: remove it from kNoBf16 in tests/test_coverage.cpp";
        continue;
      }
      EXPECT_TRUE(exercises(cpu_bf16, op))
          << op << " has no bf16 test on the cpu: add a TEST(..., Bf16...) to " << cpu_file
          << " (against tests/golden/bf16_ops or the rounded fp32 op), or list the op in kNoBf16 of "
             "tests/test_coverage.cpp with the reason";
      EXPECT_TRUE(exercises(device_bf16, op))
          << op << " has no bf16 case on the devices: add a REMAT_OP_CASE(" << f.name << ", bf16...) to " << case_file
          << ", or list the op in kNoBf16 of tests/test_coverage.cpp with the reason";
    }
  }
}

// Every backward op has a gradient case: the device's backward against central differences of
// its own forward (a case named grad... in cases_<family>.cpp), and a CPU test that checks it
// by finite differences (check_gradient) in test_<family>.cpp.
TEST(Coverage, EveryBackwardOpHasGradientChecks) {
  int backward = 0;
  for (const Family& f : op_families()) {
    const std::string cpu_file = "tests/ops/test_" + f.name + ".cpp";
    const std::string case_file = "tests/backend_ops/cases_" + f.name + ".cpp";
    const std::string grad_cases =
        tests_where(read_if_exists(kRoot / case_file), [](const Definition& d) { return starts_with(d.name, "grad"); });
    const std::string cpu_fd = tests_where(read_if_exists(kRoot / cpu_file),
                                           [](const Definition& d) { return calls(d.text, "check_gradient"); });
    for (const std::string& op : f.ops) {
      if (!ends_with(op, "_backward")) continue;
      ++backward;
      EXPECT_TRUE(exercises(grad_cases, op))
          << op << " has no gradient case: add a REMAT_OP_CASE(" << f.name << ", grad...) to " << case_file
          << " (OpCheck::expect_gradient against its own forward on the device)";
      EXPECT_TRUE(exercises(cpu_fd, op)) << op << " is checked by finite differences in no CPU test: add one to "
                                         << cpu_file << " (test::check_gradient)";
    }
  }
  EXPECT_GE(backward, 14) << "the backward ops were not found";
}

// Every op is compared with PyTorch in fp32 (a CPU test, not a Bf16 one, that loads a golden:
// tests/golden/**, written by tools/reference/gen_golden.py), or is listed in kNoGolden with the reason.
TEST(Coverage, EveryBackendOpIsComparedWithAPyTorchGolden) {
  for (const Family& f : op_families()) {
    const std::string cpu_file = "tests/ops/test_" + f.name + ".cpp";
    const std::string golden_tests = tests_where(read_if_exists(kRoot / cpu_file), [](const Definition& d) {
      return !starts_with_ci(d.name, "bf16") &&
             (calls(d.text, "load_golden") || calls(d.text, "transformer_cases") || calls(d.text, "cnn_cases"));
    });
    for (const std::string& op : f.ops) {
      if (kNoGolden.count(op)) {
        EXPECT_FALSE(exercises(golden_tests, op))
            << op << " is compared with a golden: remove it from kNoGolden in tests/test_coverage.cpp";
        continue;
      }
      EXPECT_TRUE(exercises(golden_tests, op))
          << op << " is compared with no PyTorch golden: add its reference to tools/reference/golden/<family>.py, run "
          << "/usr/bin/python3 tools/reference/gen_golden.py <family>, commit tests/golden/<family>/*.safetensors and "
             "load them "
             "in "
          << cpu_file << " (or list the op in kNoGolden of tests/test_coverage.cpp with the reason)";
    }
  }
}

// Every aliasing rule of the op list ("dx may alias dy" in the comment above an op's entry; a
// workspace query's comment speaks for the op it sizes) is tested on every backend in
// tests/test_aliasing.cpp.
TEST(Coverage, EveryAliasingRuleIsTested) {
  const std::string aliasing = read(kRoot / "tests/test_aliasing.cpp");
  std::istringstream def(read(kRoot / "include/remat/backend_ops.def"));
  std::string comment;  // the comment lines since the last entry or blank line
  int rules = 0;
  for (std::string line; std::getline(def, line);) {
    if (starts_with(line, "//")) {
      comment += line + "\n";
      continue;
    }
    if (!starts_with(line, "REMAT_OP(")) {
      comment.clear();
      continue;
    }
    const size_t second = line.find(", ", line.find(',') + 1);
    std::string op = line.substr(second + 2, line.find(',', second + 2) - second - 2);
    if (ends_with(op, "_workspace")) op.erase(op.size() - 10);
    if (comment.find("may alias") != std::string::npos) {
      ++rules;
      EXPECT_TRUE(calls(aliasing, op)) << op << " has an aliasing rule in include/remat/backend_ops.def that "
                                       << "tests/test_aliasing.cpp does not test: add a TEST_P(Aliasing, ...) there";
    }
    comment.clear();
  }
  EXPECT_GE(rules, 7) << "the aliasing rules were not found";
}

TEST(Coverage, EveryLayerTypeIsDocumentedAndInAShippedModel) {
  const std::vector<std::string> types = remat::layer_types();
  ASSERT_GE(types.size(), 14u);
  // docs/config.md: the layer table's rows are "| `type` | ...", after "### Layer types".
  const std::string doc = read(kRoot / "docs/config.md");
  const size_t table = doc.find("### Layer types");
  ASSERT_NE(table, std::string::npos) << "docs/config.md has no layer types section";
  const std::string section = doc.substr(table, doc.find("\n## ", table) - table);
  std::set<std::string> rows;
  std::istringstream lines(section);
  for (std::string line; std::getline(lines, line);) {
    if (!starts_with(line, "| `")) continue;
    const size_t end = line.find("` |", 3);
    if (end == std::string::npos) continue;
    const std::string name = line.substr(3, end - 3);
    if (std::all_of(name.begin(), name.end(), ident_char)) rows.insert(name);
  }
  std::string models;  // every config the executor tests run under every policy
  for (const char* dir : {"models", "tests/configs"})
    for (const auto& e : fs::directory_iterator(kRoot / dir))
      if (e.path().extension() == ".json") models += read(e.path());
  // The configs the device executor tests run (tests/test_device_exec.cpp, test_models()):
  // every shipped model, and the tests/configs files it names.
  std::string device_models;
  for (const auto& e : fs::directory_iterator(kRoot / "models"))
    if (e.path().extension() == ".json") device_models += read(e.path());
  const std::string device_exec = read(kRoot / "tests/test_device_exec.cpp");
  for (const auto& e : fs::directory_iterator(kRoot / "tests/configs"))
    if (e.path().extension() == ".json" &&
        device_exec.find("\"" + e.path().filename().string() + "\"") != std::string::npos)
      device_models += read(e.path());
  for (const std::string& t : types) {
    const std::string key = "\"type\": \"" + t + "\"";
    EXPECT_TRUE(rows.count(t)) << "layer type " << t << " has no row in docs/config.md";
    EXPECT_NE(models.find(key), std::string::npos)
        << "layer type " << t << " is in no model config (models/, tests/configs/), so no executor test runs it";
    EXPECT_NE(device_models.find(key), std::string::npos)
        << "layer type " << t << " is in no config the device executor tests run: name its tests/configs file in "
        << "test_models() of tests/test_device_exec.cpp (or use the layer in a models/*.json)";
  }
  for (const std::string& r : rows)
    EXPECT_NE(std::find(types.begin(), types.end(), r), types.end())
        << "docs/config.md documents a layer type " << r << " that is not registered";
}

TEST(Coverage, EveryKernelFileIsDescribed) {
  const std::string doc = read(kRoot / "docs/kernels.md");
  int files = 0;
  for (const auto& e : fs::directory_iterator(kRoot / "kernels")) {
    if (e.path().extension() != ".cu") continue;
    ++files;
    EXPECT_NE(doc.find("`" + e.path().filename().string() + "`"), std::string::npos)
        << "kernels/" << e.path().filename().string() << " is not described in docs/kernels.md";
  }
  EXPECT_GE(files, 10);
}

// Every repository path a doc names in backticks (`src/...`, `tools/...`) exists, so a
// moved or deleted file cannot leave a stale pointer in the docs.
TEST(Coverage, EveryPathTheDocsNameExists) {
  std::vector<fs::path> docs = {kRoot / "README.md"};
  for (const auto& e : fs::directory_iterator(kRoot / "docs"))
    if (e.path().extension() == ".md") docs.push_back(e.path());
  int paths = 0;
  for (const fs::path& doc : docs) {
    const std::string text = read(doc);
    for (size_t open = text.find('`'); open != std::string::npos; open = text.find('`', open + 1)) {
      const size_t close = text.find('`', open + 1);
      if (close == std::string::npos) break;
      std::string p = text.substr(open + 1, close - open - 1);
      open = close;
      bool known = false;
      for (const char* top : {"src/", "include/", "kernels/", "tests/", "tools/", "models/", "docs/", ".ci/"})
        known = known || starts_with(p, top);
      if (!known || p.find_first_of(" *<>{}$") != std::string::npos) continue;           // commands, patterns
      if (const size_t colon = p.find(':'); colon != std::string::npos) p.erase(colon);  // file:line
      ++paths;
      EXPECT_TRUE(fs::exists(kRoot / p)) << doc.filename().string() << " names " << p << ", which does not exist";
    }
  }
  EXPECT_GT(paths, 50) << "the docs' paths were not read";
}

// docs/walk.md follows one training step with the file and line of every hop: each table
// row "| n | `file:line` | `Name` | ..." must point at a line that defines or names Name
// (its last component after ::, followed by "("; a macro by its name), so the page cannot
// drift from the code it walks.
TEST(Coverage, TheWalkPagePointsAtItsFunctions) {
  std::istringstream rows(read(kRoot / "docs/walk.md"));
  int hops = 0;
  for (std::string line; std::getline(rows, line);) {
    if (!starts_with(line, "| ")) continue;
    const size_t a = line.find("| `"), b = line.find("` | `", a == std::string::npos ? 0 : a);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string where = line.substr(a + 3, b - a - 3);
    const size_t e = line.find('`', b + 5);
    const std::string name = line.substr(b + 5, e - b - 5);
    const size_t colon = where.rfind(':');
    ASSERT_NE(colon, std::string::npos) << "docs/walk.md: " << where << " has no line number";
    const std::string file = where.substr(0, colon);
    const int number = std::stoi(where.substr(colon + 1));
    std::istringstream src(read(kRoot / file));
    std::string text;
    for (int k = 0; k < number && std::getline(src, text);) ++k;
    const std::string last = name.substr(name.rfind(':') == std::string::npos ? 0 : name.rfind(':') + 1);
    const bool macro = std::all_of(last.begin(), last.end(), [](char c) { return std::isupper(c) || c == '_'; });
    EXPECT_NE(text.find(macro ? last : last + "("), std::string::npos)
        << "docs/walk.md: " << where << " should hold " << name << ", but reads: " << text
        << " (tools/docs/walk_lines.py re-points the hops)";
    ++hops;
  }
  EXPECT_GE(hops, 25) << "the walk's table rows were not read";
}

}  // namespace
