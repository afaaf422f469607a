// The HTML memory page (src/profile/html.cpp) and the timeline it draws
// (src/profile/timeline.cpp): the data embedded in the page is the --json report; the peak
// and its live set agree with an independent replay of the allocator's events; names with
// <, " and & cannot break out of the page; bad output paths are clear errors; `remat train`
// writes memory.html. The browser half is tests/browser/test_memory_page.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "remat/io.h"
#include "remat/profile.h"
#include "remat/train.h"
#include "support/expect_error.h"

namespace fs = std::filesystem;

namespace {

const std::string kNames = std::string(REMAT_SOURCE_DIR) + "/tests/configs/html_names.json";

std::vector<remat::StepProfile> profiles(const remat::Config& cfg, const remat::Graph& g,
                                         const std::vector<std::string>& policies) {
  std::vector<remat::StepProfile> ps;
  for (const auto& pol : policies)
    ps.push_back(remat::profile_step(cfg, g, remat::resolve_policy(cfg, g, pol), remat::Device::meta()));
  return ps;
}

// The text of the <script type="application/json"> element.
std::string embedded_json(const std::string& html) {
  const std::string open = "<script type=\"application/json\" id=\"remat-data\">";
  const size_t b = html.find(open);
  EXPECT_NE(b, std::string::npos);
  const size_t e = html.find("</script>", b);
  EXPECT_NE(e, std::string::npos);
  return html.substr(b + open.size(), e - b - open.size());
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t k = s.find(what); k != std::string::npos; k = s.find(what, k + 1)) ++n;
  return n;
}

std::string run(const std::string& args) {
  // ctest runs the cases of this file in parallel processes: one output file each.
  const std::string out =
      (fs::temp_directory_path() / ("remat_memhtml_cli_" + std::to_string(::getpid()) + ".txt")).string();
  const int rc = std::system((std::string(REMAT_CLI) + " " + args + " > " + out + " 2>&1").c_str());
  std::ifstream in(out);
  std::stringstream ss;
  ss << in.rdbuf();
  fs::remove(out);
  return std::to_string(rc) + ":" + ss.str();
}

}  // namespace

TEST(MemoryHtml, TimelinePeakAndLiveSetMatchAReplayOfTheEvents) {
  remat::Config cfg = remat::load_config(kNames);
  remat::Graph g = remat::build_config_graph(cfg, 16, 0);
  for (const auto& p : profiles(cfg, g, {"none", "all", "sqrt"})) {
    SCOPED_TRACE(p.policy);
    const nlohmann::json t = remat::step_timeline_json(p, 20, 3);  // few points: merging is exercised
    EXPECT_LE(t["event"].size(), 21u);
    // Replay: allocated bytes after each alloc/free from the allocator's own running total;
    // the first event reaching the peak and the allocations live there.
    std::map<uint64_t, int64_t> live;
    std::map<uint64_t, int64_t> at_peak;
    int64_t peak = -1, index = 0, peak_index = -1;
    for (const auto& e : p.events) {
      if (e.kind == remat::MemoryEvent::Kind::alloc) live[e.alloc_id] = e.bytes;
      if (e.kind == remat::MemoryEvent::Kind::free) live.erase(e.alloc_id);
      if (e.kind != remat::MemoryEvent::Kind::alloc && e.kind != remat::MemoryEvent::Kind::free) continue;
      if (e.allocated_after - p.base_bytes > peak) {
        peak = e.allocated_after - p.base_bytes;
        at_peak = live;
        peak_index = index;
      }
      ++index;
    }
    EXPECT_EQ(peak, p.peak_bytes);
    EXPECT_EQ(t["peak_bytes"].get<int64_t>(), p.peak_bytes);
    EXPECT_EQ(t["peak_event"].get<int64_t>(), peak_index);
    EXPECT_EQ(t["events"].get<int64_t>(), index);
    // The peak is one of the drawn points, and there the series add up to it exactly.
    size_t k = 0;
    while (k < t["event"].size() && t["event"][k] != peak_index) ++k;
    ASSERT_LT(k, t["event"].size());
    int64_t sum = 0;
    for (const auto& s : t["series"]) sum += t["values"][s.get<std::string>()][k].get<int64_t>();
    EXPECT_EQ(sum, p.peak_bytes);
    EXPECT_EQ(t["live_count"][k].get<size_t>(), at_peak.size());
    // live_at_peak: exactly the replayed set, largest first.
    std::map<uint64_t, int64_t> listed;
    int64_t prev = INT64_MAX;
    ASSERT_EQ(t["tensor_fields"], nlohmann::json({"id", "begin", "end", "bytes", "series", "phase", "layer", "shape"}));
    for (const auto& r : t["live_at_peak"]) {
      listed[r[0].get<uint64_t>()] = r[3].get<int64_t>();
      EXPECT_LE(r[3].get<int64_t>(), prev);
      prev = r[3].get<int64_t>();
      EXPECT_LE(r[1].get<int64_t>(), peak_index);  // allocated at or before the peak
      EXPECT_TRUE(r[2].get<int64_t>() == -1 || r[2].get<int64_t>() > peak_index) << r.dump();
      // every tensor (not workspace bytes) has its shape
      const std::string series = t["series"][r[4].get<size_t>()].get<std::string>();
      if (series != "workspace") {
        EXPECT_FALSE(t["shapes"][r[7].get<size_t>()].get<std::string>().empty()) << r.dump();
      }
    }
    EXPECT_EQ(listed, at_peak);
    // Everywhere, the merged curve never exceeds the peak and the drawn totals are real
    // totals (each the running total at its event).
    for (size_t i = 0; i < t["event"].size(); ++i) {
      int64_t tot = 0;
      for (const auto& s : t["series"]) tot += t["values"][s.get<std::string>()][i].get<int64_t>();
      EXPECT_LE(tot, p.peak_bytes);
      EXPECT_GE(tot, 0);
    }
  }
}

// Offload's host tier on the timeline: present exactly for offloading plans; its peak is
// the pool's (host_peak_bytes) and is drawn; at every drawn point it equals a replay of the
// host pool's events up to that device event; each row is a product of a layer the plan
// offloads, every such layer has one, and each leaves the host after its layer's forward
// began and before backward's first reader of it ends.
TEST(MemoryHtml, OffloadHostTierFollowsThePlan) {
  const std::string path = std::string(REMAT_SOURCE_DIR) + "/tests/configs/gpt_char_tiny.json";
  remat::Config cfg = remat::load_config(path);
  const remat::Graph g = remat::build_graph(cfg.model, 3, path, {{"vocab", 24}});
  for (const char* policy : {"none", "none+offload", "selective+offload:1", "revolve:1+offload"}) {
    SCOPED_TRACE(policy);
    const remat::CheckpointPlan plan = remat::make_plan(g, policy);
    const remat::StepProfile p = remat::profile_step(cfg, g, plan, remat::Device::meta());
    const nlohmann::json t = remat::step_timeline_json(p, 40, 3);
    ASSERT_EQ(t.contains("host"), plan.offloads());
    if (!plan.offloads()) continue;
    const nlohmann::json& h = t["host"];
    EXPECT_GT(p.host_peak_bytes, 0);
    EXPECT_EQ(h["peak_bytes"].get<int64_t>(), p.host_peak_bytes);
    ASSERT_EQ(h["values"].size(), t["event"].size());
    // Device event index -> seq, for the replay and the spans.
    std::vector<uint64_t> seq_of;
    for (const auto& e : p.events)
      if (e.kind == remat::MemoryEvent::Kind::alloc || e.kind == remat::MemoryEvent::Kind::free)
        seq_of.push_back(e.seq);
    auto index_of = [&](uint64_t seq) {
      return static_cast<int64_t>(std::lower_bound(seq_of.begin(), seq_of.end(), seq) - seq_of.begin());
    };
    int64_t drawn_max = 0;
    for (size_t k = 0; k < t["event"].size(); ++k) {
      const auto at = t["event"][k].get<uint64_t>();
      int64_t held = 0;
      for (const auto& e : p.host_events) {
        if (e.seq > seq_of[at]) break;
        if (e.kind == remat::MemoryEvent::Kind::alloc) held += e.bytes;
        if (e.kind == remat::MemoryEvent::Kind::free) held -= e.bytes;
      }
      EXPECT_EQ(h["values"][k].get<int64_t>(), held) << "point " << k << " (event " << at << ")";
      drawn_max = std::max(drawn_max, held);
    }
    EXPECT_EQ(drawn_max, p.host_peak_bytes) << "the host peak is one of the drawn points";
    // Rows against the plan and the layers' spans.
    std::set<std::string> offloaded, listed;
    std::map<std::string, int> id_of;
    for (int j = 0; j < g.size(); ++j) {
      id_of[g.layer(j).name] = j;
      if (plan.offload[static_cast<size_t>(j)]) offloaded.insert(g.layer(j).name);
    }
    auto span = [&](int layer, remat::Phase ph) {
      for (const auto& s : p.spans)
        if (s.layer == layer && s.phase == ph) return std::pair<int64_t, int64_t>{index_of(s.begin), index_of(s.end)};
      ADD_FAILURE() << "no span of layer " << layer;
      return std::pair<int64_t, int64_t>{0, 0};
    };
    ASSERT_EQ(h["tensor_fields"], nlohmann::json({"begin", "end", "bytes", "layer"}));
    for (const auto& r : h["tensors"]) {
      const std::string layer = r[3].get<std::string>();
      listed.insert(layer);
      ASSERT_TRUE(offloaded.count(layer)) << r.dump();
      const int j = id_of.at(layer);
      EXPECT_GE(r[0].get<int64_t>(), span(j, remat::Phase::forward).first) << r.dump();
      EXPECT_GE(r[1].get<int64_t>(), r[0].get<int64_t>()) << r.dump() << ": back before it went out";
      const int reader = plan.need_at[static_cast<size_t>(j)];
      EXPECT_LE(r[1].get<int64_t>(), span(reader, remat::Phase::backward).second) << r.dump();
    }
    EXPECT_EQ(listed, offloaded);
  }
  // A budget plan with offload: its budget is read back from "budget:SIZE+offload -> ...".
  const remat::CheckpointPlan b = remat::resolve_policy(cfg, g, "budget:1GiB+offload");
  const nlohmann::json report = remat::profile_json({remat::profile_step(cfg, g, b, remat::Device::meta())}, nullptr);
  EXPECT_EQ(report["policies"][0]["budget_bytes"].get<int64_t>(), int64_t{1} << 30);
}

TEST(MemoryHtml, EmbeddedDataRoundTripsToTheJsonReport) {
  if (!remat::memory_html_available()) GTEST_SKIP() << "built without Chart.js (libjs-chart.js)";
  remat::Config cfg = remat::load_config(kNames);
  remat::Graph g = remat::build_config_graph(cfg, 16, 0);
  const auto ps = profiles(cfg, g, {"none", "all", "sqrt", "budget:2MiB"});
  const auto all = remat::plan_candidates(cfg, g);
  const auto front = remat::pareto_front(all);
  remat::ProfileJsonExtras ex;
  ex.title = "html_names <&\">";
  ex.candidates = &all;
  ex.front = &front;
  const nlohmann::json report = remat::profile_json(ps, nullptr, ex);
  const std::string html = remat::memory_html(report);
  const nlohmann::json back = nlohmann::json::parse(embedded_json(html));
  EXPECT_EQ(back, report);
  // Same numbers as the profiles themselves.
  ASSERT_EQ(back["policies"].size(), ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(back["policies"][i]["peak_bytes"].get<int64_t>(), ps[i].peak_bytes);
    EXPECT_EQ(back["policies"][i]["timeline"]["peak_bytes"].get<int64_t>(), ps[i].peak_bytes);
    EXPECT_EQ(back["policies"][i]["recompute_flops"].get<double>(), ps[i].recompute_flops);
  }
  EXPECT_EQ(back["policies"][3]["budget_bytes"].get<int64_t>(), 2 << 20);
  EXPECT_EQ(back["pareto"]["front"].size(), front.size());
  // The file --json writes is the same report.
  const fs::path dir = fs::temp_directory_path() / ("remat_memhtml_rt_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string out = run("memprof " + kNames + " --policy none,sqrt --json " + (dir / "r.json").string() +
                              " --html " + (dir / "r.html").string());
  ASSERT_EQ(out.substr(0, 2), "0:") << out;
  const nlohmann::json j = nlohmann::json::parse(remat::read_file((dir / "r.json").string()));
  EXPECT_EQ(nlohmann::json::parse(embedded_json(remat::read_file((dir / "r.html").string()))), j);
  EXPECT_EQ(j["policies"][1]["peak_bytes"].get<int64_t>(), ps[2].peak_bytes);  // sqrt, same config and batch
  fs::remove_all(dir);
}

TEST(MemoryHtml, NamesCannotBreakOutOfThePage) {
  if (!remat::memory_html_available()) GTEST_SKIP() << "built without Chart.js (libjs-chart.js)";
  remat::Config cfg = remat::load_config(kNames);
  remat::Graph g = remat::build_config_graph(cfg, 16, 0);
  const auto ps = profiles(cfg, g, {"sqrt"});
  const nlohmann::json report = remat::profile_json(ps, nullptr, {"t</script><b>&\"", nullptr, nullptr});
  const std::string dumped = report.dump();
  ASSERT_NE(dumped.find("blk</script><script>window.pwned=1</script>"), std::string::npos);  // the names are in
  ASSERT_NE(dumped.find("proj<b>&amp;\\\"x\\\""), std::string::npos);
  const std::string html = remat::memory_html(report);
  // Only the page's own three script elements end; no name appears raw.
  EXPECT_EQ(count(html, "</script"), 3u);
  EXPECT_EQ(count(html, "<script"), 3u);
  EXPECT_EQ(html.find("pwned=1</"), std::string::npos);
  EXPECT_EQ(html.find("proj<b>"), std::string::npos);
  EXPECT_EQ(html.find("fc1 <i>"), std::string::npos);
  const std::string data = embedded_json(html);
  EXPECT_EQ(data.find('<'), std::string::npos);
  EXPECT_EQ(data.find('&'), std::string::npos);
  EXPECT_NE(data.find("proj\\u003cb\\u003e\\u0026amp;\\\"x\\\""), std::string::npos);
  // ... and they come back intact.
  const nlohmann::json back = nlohmann::json::parse(data);
  std::set<std::string> names;
  for (const auto& l : back["policies"][0]["layers"]) names.insert(l["name"].get<std::string>());
  EXPECT_TRUE(names.count("proj<b>&amp;\"x\"")) << back["policies"][0]["layers"].dump();
  EXPECT_TRUE(names.count("blk</script><script>window.pwned=1</script>0.fc1 <i>&"))
      << back["policies"][0]["layers"].dump();
  // The page builds no element from data with innerHTML.
  EXPECT_EQ(html.find("innerHTML", html.find("id=\"remat-data\"")), std::string::npos);
}

TEST(MemoryHtml, ChartJsIsInlinedWithItsLicence) {
  if (!remat::memory_html_available()) GTEST_SKIP() << "built without Chart.js (libjs-chart.js)";
  remat::Config cfg = remat::load_config(kNames);
  remat::Graph g = remat::build_config_graph(cfg, 16, 0);
  const std::string html = remat::memory_html(remat::profile_json(profiles(cfg, g, {"none"}), nullptr));
  EXPECT_NE(html.find("Chart.js v3"), std::string::npos);
  EXPECT_NE(html.find("Permission is hereby granted"), std::string::npos);  // the Expat licence
  EXPECT_NE(html.find("default-src 'none'"), std::string::npos);            // nothing may be fetched
  const std::string js = REMAT_CHARTJS_FILE;
  if (!js.empty() && fs::exists(js)) {
    EXPECT_NE(html.find(remat::read_file(js)), std::string::npos);
  }
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);
  EXPECT_EQ(html.find("href=\"http"), std::string::npos);
}

TEST(MemoryHtml, BadOutputPathsAreClearErrors) {
  const std::string missing = run("memprof " + kNames + " --html /nonexistent-remat-dir/m.html");
  EXPECT_NE(missing.substr(0, 2), "0:") << missing;
  EXPECT_NE(missing.find("--html /nonexistent-remat-dir/m.html: the folder /nonexistent-remat-dir does not exist"),
            std::string::npos)
      << missing;
  const std::string folder = run("memprof " + kNames + " --html " + fs::temp_directory_path().string());
  EXPECT_NE(folder.substr(0, 2), "0:") << folder;
  EXPECT_NE(folder.find("is a folder, expected a file name"), std::string::npos) << folder;
  if (remat::memory_html_available()) {
    EXPECT_REMAT_ERROR(remat::memory_html(nlohmann::json::object()), "the report has no policies");
  } else {  // a build without Chart.js names the package
    EXPECT_REMAT_ERROR(remat::memory_html(nlohmann::json::object()), "libjs-chart.js");
    const std::string no_lib = run("memprof " + kNames + " --html " + (fs::temp_directory_path() / "m.html").string());
    EXPECT_NE(no_lib.find("install the Debian package libjs-chart.js"), std::string::npos) << no_lib;
  }
}

TEST(MemoryHtml, TrainWritesMemoryHtmlIntoItsRunFolder) {
  if (!remat::memory_html_available()) GTEST_SKIP() << "built without Chart.js (libjs-chart.js)";
  const fs::path dir = fs::temp_directory_path() / ("remat_memhtml_train_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  remat::TrainOptions o;
  o.config = kNames;
  o.device = "cpu";
  o.steps = 1;
  o.out = dir.string();
  o.quiet = true;
  remat::train(o);
  ASSERT_TRUE(fs::exists(dir / "memory.html"));
  const nlohmann::json j = nlohmann::json::parse(embedded_json(remat::read_file((dir / "memory.html").string())));
  ASSERT_EQ(j["policies"].size(), 1u);
  EXPECT_EQ(j["policies"][0]["policy"], "sqrt");  // the config's
  remat::Config cfg = remat::load_config(kNames);
  remat::Graph g = remat::build_config_graph(cfg, 16, 0);
  EXPECT_EQ(j["policies"][0]["peak_bytes"].get<int64_t>(), profiles(cfg, g, {"sqrt"})[0].peak_bytes);
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();  // written atomically
  fs::remove_all(dir);
}

// remat memprof --precision fp32,bf16: the policies once per precision, each JSON row naming
// its precision and marked predicted only; its figures those of profile_step; bf16 on a
// device that cannot compute it and fp16 are clear errors.
TEST(MemoryHtml, MemprofPrecisionsSideBySide) {
  remat::Config cfg = remat::load_config(kNames);
  remat::Graph g = remat::build_config_graph(cfg, cfg.training.batch, 0);
  const auto fp32 = profiles(cfg, g, {"none"});
  cfg.training.precision = "bf16";
  const auto bf16 = profiles(cfg, g, {"none"});
  const fs::path dir = fs::temp_directory_path() / ("remat_memhtml_prec_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string out =
      run("memprof " + kNames + " --policy none --precision fp32,bf16 --json " + (dir / "r.json").string());
  ASSERT_EQ(out.substr(0, 2), "0:") << out;
  EXPECT_NE(out.find("none bf16"), std::string::npos) << out;
  EXPECT_NE(out.find("bf16 columns: bf16 activations and working weights"), std::string::npos) << out;
  const nlohmann::json j = nlohmann::json::parse(remat::read_file((dir / "r.json").string()));
  ASSERT_EQ(j["policies"].size(), 2u);
  EXPECT_EQ(j["policies"][0]["precision"], "fp32");
  EXPECT_EQ(j["policies"][1]["precision"], "bf16");
  EXPECT_EQ(j["policies"][1]["policy"], "none");
  EXPECT_EQ(j["policies"][1]["predicted_only"], true);
  EXPECT_EQ(j["policies"][0]["peak_bytes"].get<int64_t>(), fp32[0].peak_bytes);
  EXPECT_EQ(j["policies"][1]["peak_bytes"].get<int64_t>(), bf16[0].peak_bytes);
  EXPECT_NE(bf16[0].peak_bytes, fp32[0].peak_bytes);  // (bigger here: a tiny model, its working copies)
  // Measured on the cpu, which computes in bf16: the same peak as predicted.
  const std::string cpu =
      run("memprof " + kNames + " --policy none --precision bf16 --device cpu --json " + (dir / "cpu.json").string());
  ASSERT_EQ(cpu.substr(0, 2), "0:") << cpu;
  const nlohmann::json jc = nlohmann::json::parse(remat::read_file((dir / "cpu.json").string()));
  ASSERT_EQ(jc["policies"].size(), 1u);
  EXPECT_EQ(jc["policies"][0]["precision"], "bf16");
  EXPECT_EQ(jc["policies"][0]["predicted_only"], false);
  EXPECT_EQ(jc["policies"][0]["measured_peak_bytes"].get<int64_t>(), bf16[0].peak_bytes);
  const std::string fp16 = run("memprof " + kNames + " --precision fp16");
  EXPECT_NE(fp16.find("--precision: fp16 is not supported"), std::string::npos) << fp16;
  fs::remove_all(dir);
}
