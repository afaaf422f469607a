// The layering of docs/architecture.md, checked against the code: every #include that
// crosses from one layer to another follows an arrow of the table below, the table has
// no cycle (no arrow runs back up), and every public header belongs to a layer. Adding a
// header or an include that breaks the picture fails here, naming the file and the line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
const fs::path kRoot = REMAT_SOURCE_DIR;

// The layers and what each may include (besides itself). Keep in step with the graph of
// docs/architecture.md.
const std::map<std::string, std::set<std::string>> kArrows = {
    {"base", {}},                            // error.h, log.h, cuda_check.h
    {"core", {"base"}},                      // shape, dtype, device, device registry, philox, rng
    {"memory", {"base", "core"}},            // the caching allocator
    {"tensor", {"base", "core", "memory"}},  // Tensor and Storage
    {"io", {"base", "core", "tensor"}},      // atomic files, mapped files, safetensors
    {"emu", {"base"}},                       // the CUDA emulator's runtime
    {"dist", {"base"}},                      // ranks and collectives (MPI)
    {"kernels", {"base", "core", "emu"}},    // CUDA kernels (emu: built for the emulator)
    {"backends", {"base", "core", "memory", "tensor", "kernels"}},  // the op list and the backends
    {"data", {"base", "core", "memory", "tensor", "io"}},
    {"graph", {"base", "core", "memory", "tensor", "io", "backends"}},
    {"exec", {"base", "core", "memory", "tensor", "io", "backends", "data", "graph"}},
    {"optim", {"base", "core", "memory", "tensor", "backends", "graph", "exec"}},
    {"interop", {"base", "core", "memory", "tensor", "io", "backends", "data", "graph", "exec"}},
    {"profile", {"base", "core", "memory", "tensor", "io", "backends", "data", "graph", "exec", "optim"}},
    // BLEU and decoding (translate.h), which load a run's weights through interop
    {"eval", {"base", "core", "memory", "tensor", "io", "backends", "data", "graph", "exec", "interop"}},
    {"train",
     {"base", "core", "memory", "tensor", "io", "backends", "data", "graph", "exec", "optim", "interop", "profile",
      "eval", "dist"}},
    {"cli",
     {"base", "core", "memory", "tensor", "io", "backends", "data", "graph", "exec", "optim", "interop", "profile",
      "eval", "train", "dist"}},
};

// The public headers' layers.
const std::map<std::string, std::string> kHeaders = {
    {"error.h", "base"},
    {"log.h", "base"},
    {"cuda_check.h", "base"},
    {"shape.h", "core"},
    {"dtype.h", "core"},
    {"device.h", "core"},
    {"device_registry.h", "core"},
    {"rng.h", "core"},
    {"hash.h", "core"},
    {"philox.h", "core"},
    {"hd.h", "core"},
    {"bf16.h", "core"},
    {"gelu.h", "core"},
    {"rope.h", "core"},
    {"memory.h", "memory"},
    {"tensor.h", "tensor"},
    {"io.h", "io"},
    {"backend.h", "backends"},
    {"backend_tuning.h", "backends"},
    {"bench_cases.h", "backends"},
    {"backend_ops.def", "backends"},
    {"ops.h", "backends"},
    {"data.h", "data"},
    {"token_shards.h", "data"},
    {"translation.h", "data"},
    {"config.h", "graph"},
    {"graph.h", "graph"},
    {"exec.h", "exec"},
    {"plan.h", "exec"},
    {"schedule.h", "exec"},
    {"params.h", "exec"},
    {"executor.h", "exec"},
    {"optim.h", "optim"},
    {"interop.h", "interop"},
    {"profile.h", "profile"},
    {"chain_planner.h", "profile"},
    {"train.h", "train"},
    {"evaluate.h", "train"},
    {"bleu.h", "eval"},
    {"translate.h", "eval"},
    {"incremental.h", "eval"},
    {"dist.h", "dist"},
};

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// The layer of a source file, from its folder.
std::string layer_of(const fs::path& rel) {
  const std::string s = rel.generic_string();
  const std::string name = rel.filename().string();
  if (starts_with(s, "include/remat/")) {
    const auto it = kHeaders.find(name);
    return it == kHeaders.end() ? "" : it->second;
  }
  if (starts_with(s, "src/")) {  // src/<layer>/...: a folder that is no layer is in none
    const std::string area = (*std::next(rel.begin())).string();
    return kArrows.count(area) ? area : "";
  }
  if (starts_with(s, "kernels/emu/")) return "emu";
  if (starts_with(s, "kernels/")) return "kernels";
  if (starts_with(s, "tools/remat/")) return "cli";
  return "";
}

struct Include {
  fs::path file;
  int line;
  std::string target;
};

std::vector<Include> quoted_includes(const fs::path& dir) {
  std::vector<Include> out;
  for (const auto& e : fs::recursive_directory_iterator(kRoot / dir)) {
    const std::string ext = e.path().extension().string();
    if (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh" && ext != ".def") continue;
    std::ifstream in(e.path());
    int n = 0;
    for (std::string line; std::getline(in, line);) {
      ++n;
      size_t p = line.find_first_not_of(" \t");
      if (p == std::string::npos || line[p] != '#') continue;
      p = line.find_first_not_of(" \t", p + 1);
      if (p == std::string::npos || line.compare(p, 7, "include") != 0) continue;
      const size_t open = line.find('"', p), close = open == std::string::npos ? open : line.find('"', open + 1);
      if (close == std::string::npos) continue;  // <system> headers
      out.push_back({fs::relative(e.path(), kRoot), n, line.substr(open + 1, close - open - 1)});
    }
  }
  return out;
}

// The layer an include names, or "" when it is private to the including folder.
std::string layer_of_include(const std::string& target) {
  if (starts_with(target, "remat/")) {
    const auto it = kHeaders.find(target.substr(6));
    return it == kHeaders.end() ? "?" : it->second;
  }
  if (starts_with(target, "kernels/emu/")) return "emu";
  if (starts_with(target, "kernels/")) return "kernels";
  // A private header named from src/ ("backends/cpu/vmath.h", "train/run_data.h"): its area.
  const size_t slash = target.find('/');
  if (slash != std::string::npos && kArrows.count(target.substr(0, slash))) return target.substr(0, slash);
  return "";
}

TEST(Layering, TheArrowsHaveNoCycle) {
  std::map<std::string, int> state;  // 1: on the path, 2: done
  std::function<void(const std::string&, std::string)> visit = [&](const std::string& n, std::string path) {
    ASSERT_TRUE(kArrows.count(n)) << "arrow to an unknown layer " << n;
    path += " -> " + n;
    ASSERT_NE(state[n], 1) << "cycle:" << path;
    if (state[n] == 2) return;
    state[n] = 1;
    for (const std::string& m : kArrows.at(n)) visit(m, path);
    state[n] = 2;
  };
  for (const auto& [n, deps] : kArrows) visit(n, "");
}

TEST(Layering, EveryPublicHeaderHasALayer) {
  for (const auto& e : fs::directory_iterator(kRoot / "include/remat"))
    EXPECT_TRUE(kHeaders.count(e.path().filename().string()))
        << "include/remat/" << e.path().filename().string()
        << " belongs to no layer: add it to kHeaders here and to docs/architecture.md";
}

TEST(Layering, EveryIncludeFollowsAnArrow) {
  size_t crossing = 0;
  for (const char* dir : {"include", "src", "kernels", "tools/remat"}) {
    for (const Include& inc : quoted_includes(dir)) {
      const std::string from = layer_of(inc.file);
      ASSERT_FALSE(from.empty()) << inc.file << " is in no layer";
      const std::string to = layer_of_include(inc.target);
      ASSERT_NE(to, "?") << inc.file << ":" << inc.line << " includes an unknown public header " << inc.target;
      if (to.empty() || to == from) continue;
      ++crossing;
      EXPECT_TRUE(kArrows.at(from).count(to)) << inc.file << ":" << inc.line << " (" << from << ") includes "
                                              << inc.target << " (" << to << "): no arrow " << from << " -> " << to;
      // Only include/ is public: the command sees no backend's or kernel's own headers.
      if (from == "cli") {
        EXPECT_TRUE(starts_with(inc.target, "remat/"))
            << inc.file << ":" << inc.line << " includes the private header " << inc.target;
      }
    }
  }
  EXPECT_GT(crossing, 100u) << "the includes were not read";
}

}  // namespace
