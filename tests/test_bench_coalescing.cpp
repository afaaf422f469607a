// `remat bench kernels --device cuda-emu` counts every kernel's global-memory traffic on the
// emulator (the command's cuda-emu kernels carry the instrumentation): every memory-bound
// kernel of the bench shows at least 90% coalescing efficiency, or appears in the list of
// docs/kernels.md ("Coalescing") with its measured efficiency and the reason. The list
// stays current: an entry whose kernel is no longer below 90%, or whose figure moved, fails.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>

namespace fs = std::filesystem;

namespace {

constexpr double kThreshold = 0.90;
// The size the list's figures are measured at (docs/kernels.md says so too).
constexpr const char* kElements = "262144";

// A kernel's name without its template arguments: "(logsumexp_kernel<L::kThreads, ...>)"
// is logsumexp_kernel (the launch site's text changes with the template parameters).
std::string base_name(const std::string& kernel) {
  std::string s = kernel;
  if (!s.empty() && s.front() == '(') s.erase(0, 1);
  return s.substr(0, s.find_first_of("<)"));
}

struct Exception {
  std::string kernel, bench_case, reason;
  double percent = 0;
};

// The rows of the table that follows the marker line in docs/kernels.md:
// | `kernel` | case | 83.3% | reason |  (the kernel's name without template arguments)
std::vector<Exception> documented_exceptions() {
  std::ifstream f(std::string(REMAT_SOURCE_DIR) + "/docs/kernels.md");
  EXPECT_TRUE(f.good()) << "docs/kernels.md not found";
  const std::string marker = "<!-- coalescing exceptions";
  const std::regex row(R"(^\| `([^`]+)` \| ([a-z0-9_.]+) \| ([0-9.]+)% \| (.+) \|\s*$)");
  std::vector<Exception> out;
  std::string line;
  bool in_table = false;
  while (std::getline(f, line)) {
    if (line.rfind(marker, 0) == 0) {
      in_table = true;
      continue;
    }
    if (!in_table) continue;
    if (line.empty()) {
      if (!out.empty()) break;
      continue;
    }
    if (line.rfind("| kernel", 0) == 0 || line.rfind("|---", 0) == 0) continue;
    std::smatch m;
    if (!std::regex_match(line, m, row)) {
      ADD_FAILURE() << "docs/kernels.md: a row of the coalescing exceptions that does not read "
                       "| `kernel` | case | NN.N% | reason |: "
                    << line;
      continue;
    }
    out.push_back({m[1], m[2], m[4], std::stod(m[3])});
  }
  EXPECT_TRUE(in_table) << "docs/kernels.md has no line starting with " << marker;
  return out;
}

// The bench's memory-bound kernels only: no GEMMs and no fused attention (compute-bound,
// its coalescing not analysed yet; its kernels are checked in tests/test_flash_kernels.cpp).
nlohmann::json run_bench() {
  const fs::path json = fs::temp_directory_path() / ("remat_bench_coalescing_" + std::to_string(::getpid()) + ".json");
  const std::string cmd = std::string(REMAT_CLI) + " bench kernels --device cuda-emu --elements " + kElements +
                          " --gemm-size 0 --attention-tokens 0 --iters 1 --warmup 0 --json " + json.string() + " > " +
                          json.string() + ".txt 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream out(json.string() + ".txt");
  std::stringstream text;
  text << out.rdbuf();
  EXPECT_EQ(rc, 0) << cmd << "\n" << text.str();
  std::ifstream in(json);
  nlohmann::json j = in.good() ? nlohmann::json::parse(in) : nlohmann::json::object();
  fs::remove(json);
  fs::remove(json.string() + ".txt");
  return j;
}

}  // namespace

TEST(BenchCoalescing, EveryMemoryBoundKernelIsCoalescedOrHasAStatedReason) {
  const std::vector<Exception> listed = documented_exceptions();
  std::map<std::pair<std::string, std::string>, const Exception*> by_key;
  for (const Exception& e : listed) {
    EXPECT_FALSE(e.reason.empty()) << e.kernel;
    EXPECT_TRUE(by_key.emplace(std::make_pair(e.bench_case, e.kernel), &e).second)
        << "listed twice: " << e.kernel << " in " << e.bench_case;
  }

  const nlohmann::json j = run_bench();
  ASSERT_TRUE(j.value("traffic_counted", false)) << "the remat command's cuda-emu kernels are not instrumented";
  ASSERT_TRUE(j.contains("kernels") && !j["kernels"].empty());
  std::set<std::pair<std::string, std::string>> seen_below;
  for (const auto& c : j["kernels"]) {
    const std::string name = c.value("name", "");
    ASSERT_EQ(c.value("status", ""), "ok") << name << ": " << c.value("reason", "");
    ASSERT_TRUE(c.contains("traffic") && !c["traffic"].empty()) << name << ": no traffic counted";
    for (const auto& k : c["traffic"]) {
      const std::string kernel = base_name(k["kernel"]);
      const double eff = k["efficiency"];
      EXPECT_GT(k["warp_accesses"].get<int64_t>(), 0) << name << " / " << kernel;
      EXPECT_GT(k["sector_bytes"].get<int64_t>(), 0) << name << " / " << kernel;
      EXPECT_LE(eff, 1.0) << name << " / " << kernel;
      const auto key = std::make_pair(name, kernel);
      if (eff >= kThreshold) {
        EXPECT_EQ(by_key.count(key), 0u) << "docs/kernels.md lists " << kernel << " (" << name << ") below 90%, but it "
                                         << "measures " << 100.0 * eff << "%: remove it from the list";
        continue;
      }
      seen_below.insert(key);
      auto it = by_key.find(key);
      if (it == by_key.end()) {
        ADD_FAILURE() << kernel << " in bench case " << name << " is " << 100.0 * eff
                      << "% coalesced (worst instruction " << k.value("worst_site", "") << " at "
                      << 100.0 * k.value("worst_site_efficiency", 0.0)
                      << "%): fix it, or list it with its reason in docs/kernels.md (Coalescing)";
      } else {
        EXPECT_NEAR(it->second->percent, 100.0 * eff, 0.051)
            << "docs/kernels.md gives " << kernel << " (" << name << ") " << it->second->percent << "%; it measures "
            << 100.0 * eff << "%";
      }
    }
  }
  for (const Exception& e : listed)
    EXPECT_EQ(seen_below.count({e.bench_case, e.kernel}), 1u)
        << "docs/kernels.md lists " << e.kernel << " in bench case " << e.bench_case
        << ", which the bench does not run (or runs at >= 90%)";
}
