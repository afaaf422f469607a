// What benchmarks and tests turn and read on a backend besides its ops: the device's clock
// and caches (time_ms, flush_caches, properties), knobs that change how ops compute (TF32,
// attention's scratch groups) and the CUDA emulator's global-memory traffic counters.
// None of it is an op and a training step uses none of it, so it sits apart from Backend's
// op interface (remat/backend.h): a backend hands out its own through Backend::tuning().
// Where a backend has none of its own, HostTuning stands in: host clocks around
// Backend::synchronize(), the device's name, no knobs, no counters.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace remat {

class Backend;

class BackendTuning {
 public:
  virtual ~BackendTuning() = default;

  // ---- Timers and benchmarks ------------------------------------------------------------
  // Milliseconds one run of `body` (ops on the backend) takes by the device's clock: CUDA
  // events on a GPU; the host clock between two Backend::synchronize() calls elsewhere.
  virtual double time_ms(const std::function<void()>& body) = 0;
  // Evicts what earlier runs left in the device's caches (a GPU's L2); a no-op elsewhere.
  virtual void flush_caches() {}
  struct Properties {
    std::string name;           // e.g. "NVIDIA H200"; the device string where unknown
    double memory_gbps = 0;     // peak memory bandwidth, GB/s; 0: unknown
    std::string gbps_source;    // how memory_gbps was found (or why it is unknown)
    int64_t cache_bytes = 0;    // what flush_caches() evicts (a GPU's L2); 0: nothing
    bool device_clock = false;  // time_ms reads the device's own clock
  };
  virtual Properties properties() const = 0;

  // ---- Knobs ------------------------------------------------------------------------------
  // TF32 tensor-core math for fp32 GEMMs (and convolutions) on backends that have it;
  // returns false, changing nothing, on those that do not.
  virtual bool set_tf32(bool on) {
    (void)on;
    return false;
  }
  virtual bool tf32() const { return false; }
  // The most bytes one group of attention's [T, T] scratch matrices takes (the backend's
  // default where 0; a group holds one batch element or head at least). Tests shrink it
  // to run the multi-group path at small shapes. Returns the previous setting; backends
  // without grouped scratch keep 0 and change nothing.
  virtual int64_t set_attention_group_bytes(int64_t bytes) {
    (void)bytes;
    return 0;
  }

  // ---- Global-memory traffic per kernel (the CUDA emulator) -----------------------------
  // A warp access is one instruction executed by the lanes of a warp; its requested bytes
  // are the distinct bytes its lanes asked for, its sectors the distinct 32-byte sectors
  // those bytes lie in (what a GPU's memory system moves). Coalescing efficiency =
  // requested bytes / (32 x sectors). Only cuda-emu counts, for kernels compiled with the
  // emulator's instrumentation (docs/kernels.md, "Coalescing").
  struct KernelTraffic {
    std::string kernel;  // as written at its launch
    int64_t launches = 0;
    int64_t warp_accesses = 0;
    int64_t requested_bytes = 0;
    int64_t sectors = 0;
    // The instruction that wasted the most sector bytes ("<module>+0x<offset>") and its
    // own efficiency; empty when none wasted any.
    std::string worst_site;
    double worst_site_efficiency = 1.0;
    double efficiency() const {
      return sectors > 0 ? static_cast<double>(requested_bytes) / (32.0 * static_cast<double>(sectors)) : 0.0;
    }
  };
  // Starts (true) or stops counting; returns false, changing nothing, where the backend
  // cannot count (every backend but cuda-emu over instrumented kernels).
  virtual bool count_traffic(bool on) {
    (void)on;
    return false;
  }
  // The kernels counted since the last call, in name order; clears the counts.
  virtual std::vector<KernelTraffic> take_traffic() { return {}; }
};

// The tuning of a backend without its own (cpu, meta; the emulated CUDA backend's timer):
// host clocks around the backend's synchronize(), its device string as its name, no peak,
// no cache to flush, no knobs, no counters.
class HostTuning final : public BackendTuning {
 public:
  explicit HostTuning(Backend& backend) : backend_(backend) {}
  double time_ms(const std::function<void()>& body) override;
  Properties properties() const override { return properties_of(backend_); }
  // What a device tells nothing about reports: its device string as its name, unknown peak.
  static Properties properties_of(const Backend& backend);

 private:
  Backend& backend_;
};

}  // namespace remat
