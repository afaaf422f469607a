// Global-memory traffic per kernel: warp accesses, requested bytes and 32-byte sectors
// (see traffic.h). This file must not itself be compiled with -fsanitize=thread.
#include "kernels/emu/traffic.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/emu/emu.h"

namespace remat::emu {
namespace {

constexpr uint64_t kSector = 32;

// One warp access being gathered: the instruction `pc` executed for the k-th time since
// synchronisation point `syncs` by the lanes of warp `warp`.
struct Key {
  uintptr_t pc;
  uint64_t syncs;
  uint32_t warp;
  uint32_t k;
  bool operator==(const Key& o) const { return pc == o.pc && syncs == o.syncs && warp == o.warp && k == o.k; }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = k.pc * 0x9e3779b97f4a7c15ull;
    h ^= (k.syncs + 0x632be59bd9b4e019ull + (h << 6) + (h >> 2));
    h ^= ((uint64_t{k.warp} << 32 | k.k) + 0x85ebca6b + (h << 6) + (h >> 2));
    return static_cast<size_t>(h);
  }
};
struct LaneAccess {
  uintptr_t addr;
  uint32_t size;
};
struct Pending {
  bool write = false;
  std::vector<LaneAccess> lanes;
};

struct Totals {
  uint64_t requested = 0, sectors = 0;
  void add(uint64_t r, uint64_t s) {
    requested += r;
    sectors += s;
  }
};
struct Stats {
  uint64_t launches = 0, accesses = 0;
  Totals all, loads, stores;
  std::map<uintptr_t, Totals> sites;  // by instruction
};

std::mutex g_mutex;  // guards g_kernels (take_traffic may run on another thread)
std::map<std::string, Stats> g_kernels;
std::atomic<bool> g_on{false};
std::atomic<int> g_instrumented{0};

// The launch being counted (launches are serialised by the emulator): g_traffic_counting.
const char* g_kernel = nullptr;
Stats g_launch;                // this launch's counts, added to g_kernels at its end
uintptr_t g_lo = 0, g_hi = 0;  // the device memory arena
std::unordered_map<Key, Pending, KeyHash> g_pending;
// The lane running now, and how often it executed each instruction since its last
// synchronisation point.
unsigned g_lane = ~0u;
uint64_t g_lane_syncs = ~uint64_t{0};
std::vector<std::pair<uintptr_t, uint32_t>> g_pc_counts;

bool env_on() {
  const char* v = std::getenv("REMAT_EMU_TRAFFIC");
  return v && *v && std::strcmp(v, "0") != 0;
}

std::string site_name(uintptr_t pc) {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(pc), &info) || !info.dli_fname) return "?";
  const char* base = std::strrchr(info.dli_fname, '/');
  char buf[64];
  std::snprintf(buf, sizeof buf, "+0x%llx",
                static_cast<unsigned long long>(pc - reinterpret_cast<uintptr_t>(info.dli_fbase)));
  return std::string(base ? base + 1 : info.dli_fname) + buf;
}

std::vector<KernelTraffic> collect_locked() {
  std::vector<KernelTraffic> out;
  for (const auto& [name, st] : g_kernels) {
    KernelTraffic t;
    t.kernel = name;
    t.launches = st.launches;
    t.warp_accesses = st.accesses;
    t.requested_bytes = st.all.requested;
    t.sectors = st.all.sectors;
    t.load_requested_bytes = st.loads.requested;
    t.load_sectors = st.loads.sectors;
    t.store_requested_bytes = st.stores.requested;
    t.store_sectors = st.stores.sectors;
    uint64_t worst_waste = 0;
    for (const auto& [pc, s] : st.sites) {
      const uint64_t waste = s.sectors * kSector - s.requested;
      if (waste > worst_waste) {
        worst_waste = waste;
        t.worst_site = site_name(pc);
        t.worst_site_efficiency = static_cast<double>(s.requested) / static_cast<double>(s.sectors * kSector);
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

// REMAT_EMU_TRAFFIC=1: the table of every kernel at exit.
void print_at_exit() {
  std::vector<KernelTraffic> ts;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    ts = collect_locked();
  }
  std::fprintf(stderr, "\ncuda-emu global-memory traffic (REMAT_EMU_TRAFFIC): %zu kernels\n", ts.size());
  std::fprintf(stderr, "%-48s %8s %12s %14s %12s %8s %8s %8s  %s\n", "kernel", "launches", "warp acc.", "requested B",
               "sector B", "coal.", "loads", "stores", "worst instruction");
  for (const KernelTraffic& t : ts) {
    auto pct = [](uint64_t r, uint64_t s) { return s ? 100.0 * static_cast<double>(r) / (32.0 * s) : 100.0; };
    std::fprintf(stderr, "%-48s %8llu %12llu %14llu %12llu %7.1f%% %7.1f%% %7.1f%%  %s", t.kernel.c_str(),
                 static_cast<unsigned long long>(t.launches), static_cast<unsigned long long>(t.warp_accesses),
                 static_cast<unsigned long long>(t.requested_bytes),
                 static_cast<unsigned long long>(t.sectors * kSector), pct(t.requested_bytes, t.sectors),
                 pct(t.load_requested_bytes, t.load_sectors), pct(t.store_requested_bytes, t.store_sectors),
                 t.worst_site.c_str());
    if (!t.worst_site.empty()) std::fprintf(stderr, " (%.1f%%)", 100.0 * t.worst_site_efficiency);
    std::fprintf(stderr, "\n");
  }
}

const bool kEnvOn = [] {
  if (env_on()) {
    g_on = true;
    std::atexit(print_at_exit);
  }
  return true;
}();

// Adds the gathered warp accesses to the launch's counts.
void flush_pending() {
  for (auto& [key, p] : g_pending) {
    std::vector<LaneAccess>& v = p.lanes;
    std::sort(v.begin(), v.end(), [](const LaneAccess& a, const LaneAccess& b) { return a.addr < b.addr; });
    uint64_t requested = 0, sectors = 0;
    uintptr_t covered = 0;                // bytes below this address are counted
    uint64_t last_sector = ~uint64_t{0};  // the highest sector counted
    for (const LaneAccess& a : v) {
      const uintptr_t begin = std::max(a.addr, covered), end = a.addr + a.size;
      if (end <= begin) continue;
      requested += end - begin;
      covered = end;
      const uint64_t first = begin / kSector, last = (end - 1) / kSector;
      sectors += last - (first == last_sector ? first : first - 1);
      last_sector = last;
    }
    ++g_launch.accesses;
    g_launch.all.add(requested, sectors);
    (p.write ? g_launch.stores : g_launch.loads).add(requested, sectors);
    g_launch.sites[key.pc].add(requested, sectors);
  }
  g_pending.clear();
}

}  // namespace

bool g_traffic_counting = false;

void traffic_begin_launch(const char* kernel) {
  g_traffic_counting = g_on.load(std::memory_order_relaxed);
  if (!g_traffic_counting) return;
  const void* base = nullptr;
  size_t bytes = 0;
  device_arena(&base, &bytes);
  g_lo = reinterpret_cast<uintptr_t>(base);
  g_hi = g_lo + bytes;
  g_kernel = kernel;
  g_launch = Stats{};
  g_launch.launches = 1;
  g_pending.clear();
  g_lane = ~0u;
  g_lane_syncs = ~uint64_t{0};
  g_pc_counts.clear();
}

void traffic_flush() {
  if (g_traffic_counting) flush_pending();
}

void traffic_end_launch() {
  if (!g_traffic_counting) return;
  flush_pending();
  g_traffic_counting = false;
  std::lock_guard<std::mutex> lock(g_mutex);
  Stats& st = g_kernels[g_kernel];
  st.launches += g_launch.launches;
  st.accesses += g_launch.accesses;
  st.all.add(g_launch.all.requested, g_launch.all.sectors);
  st.loads.add(g_launch.loads.requested, g_launch.loads.sectors);
  st.stores.add(g_launch.stores.requested, g_launch.stores.sectors);
  for (const auto& [pc, s] : g_launch.sites) st.sites[pc].add(s.requested, s.sectors);
  g_launch = Stats{};
}

void traffic_access(const void* addr, size_t size, bool is_write, const void* pc) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  if (a < g_lo || a >= g_hi || size == 0) return;  // not device memory
  unsigned lane = 0;
  uint64_t syncs = 0;
  if (!traffic_lane(&lane, &syncs)) return;
  if (lane != g_lane || syncs != g_lane_syncs) {
    g_lane = lane;
    g_lane_syncs = syncs;
    g_pc_counts.clear();
  }
  const auto ip = reinterpret_cast<uintptr_t>(pc);
  uint32_t k = 0;
  auto it = std::find_if(g_pc_counts.begin(), g_pc_counts.end(), [ip](const auto& e) { return e.first == ip; });
  if (it == g_pc_counts.end()) {
    g_pc_counts.emplace_back(ip, 1);
  } else {
    k = it->second++;
  }
  Pending& p = g_pending[Key{ip, syncs, lane / 32, k}];
  p.write = is_write;
  p.lanes.push_back(LaneAccess{a, static_cast<uint32_t>(size)});
}

void traffic_note_instrumented_module() { g_instrumented.fetch_add(1, std::memory_order_relaxed); }

void set_traffic_count(bool on) { g_on = on; }
bool traffic_count_enabled() { return g_on; }
bool traffic_instrumented() { return g_instrumented.load(std::memory_order_relaxed) > 0; }

std::vector<KernelTraffic> take_traffic() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<KernelTraffic> out = collect_locked();
  g_kernels.clear();
  return out;
}

}  // namespace remat::emu
