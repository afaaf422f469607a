// The project's lists agree with each other, so that adding an op or a layer cannot
// silently skip a step (docs/adding-an-op.md):
// - every op of include/remat/backend_ops.def is called by a CPU op test (tests/ops) and
//   by a backend op case (tests/backend_ops, cuda-emu and cuda against the cpu);
// - every registered layer type has a row in docs/config.md's table (and every row is a
//   type), and appears in a model config (models/*.json, tests/configs/*.json), which the
//   executor tests run under every checkpoint policy on cpu and cuda-emu;
// - every CUDA kernel file (kernels/*.cu) is described in docs/kernels.md.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

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

// The concatenated text of the files in `dir` whose name matches `pattern`.
std::string read_all(const fs::path& dir, const std::regex& pattern) {
  std::string all;
  for (const auto& e : fs::directory_iterator(dir))
    if (std::regex_match(e.path().filename().string(), pattern)) all += read(e.path());
  return all;
}

std::set<std::string> backend_ops() {
  std::set<std::string> ops;
  std::istringstream def(read(kRoot / "include/remat/backend_ops.def"));
  const std::regex entry(R"(REMAT_OP\((op|result|workspace), [^,]+, (\w+),.*)");
  std::smatch m;
  for (std::string line; std::getline(def, line);)
    if (std::regex_match(line, m, entry)) ops.insert(m[2]);
  return ops;
}

TEST(Coverage, EveryBackendOpIsTestedOnTheCpuAndOnTheDevices) {
  const std::set<std::string> ops = backend_ops();
  ASSERT_GE(ops.size(), 40u) << "the op list was not parsed";
  const std::string cpu_tests = read_all(kRoot / "tests/ops", std::regex(R"(.*\.cpp)"));
  // A case against the cpu (the gradient cases check each device against itself only).
  const std::string device_cases = read_all(kRoot / "tests/backend_ops", std::regex(R"(cases_(?!grad).*\.cpp)"));
  for (const std::string& op : ops) {
    // A workspace query is exercised by the op it sizes (ops.h allocates through it).
    if (op.size() > 10 && op.compare(op.size() - 10, 10, "_workspace") == 0) continue;
    const std::regex call("\\b" + op + "\\(");
    // ...or through its allocating wrapper (ops::layernorm for layernorm_forward).
    std::string w = op;
    if (const size_t f = w.find("_forward"); f != std::string::npos) w.erase(f, 8);
    const std::regex wrapper("\\bops::" + w + "\\(");
    EXPECT_TRUE(std::regex_search(cpu_tests, call) || std::regex_search(cpu_tests, wrapper))
        << op << " is not called by any CPU op test in tests/ops";
    EXPECT_TRUE(std::regex_search(device_cases, call) || std::regex_search(device_cases, wrapper))
        << op << " is not called by any case in tests/backend_ops";
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
  const std::regex row(R"(\n\| `(\w+)` \|)");
  for (std::sregex_iterator it(section.begin(), section.end(), row), end; it != end; ++it) rows.insert((*it)[1]);
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

}  // namespace
