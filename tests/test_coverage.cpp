// The project's lists agree with each other, so that adding an op or a layer cannot
// silently skip a step (docs/adding-an-op.md):
// - every op of include/remat/backend_ops.def is called by a CPU op test (tests/ops) and
//   by a backend op case (tests/backend_ops, cuda-emu and cuda against the cpu);
// - every registered layer type has a row in docs/config.md's table (and every row is a
//   type), and appears in a model config (models/*.json, tests/configs/*.json), which the
//   executor tests run under every checkpoint policy on cpu and cuda-emu;
// - the op index at the end of include/remat/backend.h names every op and the files of its
//   validator, cpu and cuda implementations;
// - every CUDA kernel file (kernels/*.cu) is described in docs/kernels.md;
// - every repository path the docs name exists.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
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

// The concatenated text of the .cpp files in `dir` whose name starts with `prefix`,
// skipping those that start with `except` (when given).
std::string read_all(const fs::path& dir, const std::string& prefix, const std::string& except = "") {
  std::string all;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (!starts_with(name, prefix) || !ends_with(name, ".cpp")) continue;
    if (!except.empty() && starts_with(name, except)) continue;
    all += read(e.path());
  }
  return all;
}

// The names of include/remat/backend_ops.def: "REMAT_OP(kind, result type, name, ...".
std::set<std::string> backend_ops() {
  std::set<std::string> ops;
  std::istringstream def(read(kRoot / "include/remat/backend_ops.def"));
  for (std::string line; std::getline(def, line);) {
    if (!starts_with(line, "REMAT_OP(")) continue;
    const std::string kind = line.substr(9, line.find(',') - 9);
    if (kind != "op" && kind != "result" && kind != "workspace") continue;
    const size_t second = line.find(", ", line.find(',') + 1);  // after the result type
    if (second == std::string::npos) continue;
    const size_t begin = second + 2, end = line.find(',', begin);
    ops.insert(line.substr(begin, end - begin));
  }
  return ops;
}

TEST(Coverage, EveryBackendOpIsTestedOnTheCpuAndOnTheDevices) {
  const std::set<std::string> ops = backend_ops();
  ASSERT_GE(ops.size(), 40u) << "the op list was not parsed";
  const std::string cpu_tests = read_all(kRoot / "tests/ops", "");
  // A case against the cpu (the gradient cases check each device against itself only).
  const std::string device_cases = read_all(kRoot / "tests/backend_ops", "cases_", "cases_grad");
  for (const std::string& op : ops) {
    // A workspace query is exercised by the op it sizes (ops.h allocates through it).
    if (ends_with(op, "_workspace")) continue;
    // ...or through its allocating wrapper (ops::layernorm for layernorm_forward).
    std::string w = op;
    if (const size_t f = w.find("_forward"); f != std::string::npos) w.erase(f, 8);
    const std::string wrapper = "ops::" + w;
    EXPECT_TRUE(calls(cpu_tests, op) || calls(cpu_tests, wrapper))
        << op << " is not called by any CPU op test in tests/ops";
    EXPECT_TRUE(calls(device_cases, op) || calls(device_cases, wrapper))
        << op << " is not called by any case in tests/backend_ops";
  }
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

// One line of the op index at the end of include/remat/backend.h:
//   "//   Backend::<op>   validate/<family>.cpp cpu/<file>.cpp cuda/<file>.cpp"
struct IndexLine {
  std::string op, validator, cpu, cuda;  // the files relative to src/backends/
};

std::vector<IndexLine> op_index() {
  std::vector<IndexLine> index;
  std::istringstream header(read(kRoot / "include/remat/backend.h"));
  for (std::string line; std::getline(header, line);) {
    if (!starts_with(line, "//   Backend::")) continue;
    std::istringstream words(line.substr(14));
    IndexLine l;
    words >> l.op >> l.validator >> l.cpu >> l.cuda;
    index.push_back(l);
  }
  return index;
}

// The generated entry points cannot be found by grep, so backend.h keeps an index of them:
// every op once, in the op list's order, each naming the files that define its validator
// and its cpu and cuda implementations.
TEST(Coverage, TheOpIndexNamesEveryOpAndItsFiles) {
  const std::vector<std::string> ops = backend_ops_in_order();
  const std::vector<IndexLine> index = op_index();
  ASSERT_GE(ops.size(), 40u) << "the op list was not parsed";
  const std::string where = "include/remat/backend.h's op index (\"Where each op lives\")";
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
  for (const std::string& t : types) {
    EXPECT_TRUE(rows.count(t)) << "layer type " << t << " has no row in docs/config.md";
    EXPECT_NE(models.find("\"type\": \"" + t + "\""), std::string::npos)
        << "layer type " << t << " is in no model config (models/, tests/configs/), so no executor test runs it";
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

}  // namespace
