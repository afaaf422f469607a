// Backend::tuning() and the stand-in of backends without tuning of their own (HostTuning).
#include "remat/backend_tuning.h"

#include <chrono>

#include "remat/backend.h"

namespace remat {

// Every backend can be timed, so tuning() always has an answer: the host-clock one unless
// the backend overrides it (the CUDA backend: CUDA events, TF32, traffic counters).
Backend::Backend() : host_tuning_(std::make_unique<HostTuning>(*this)) {}
Backend::~Backend() = default;

BackendTuning& Backend::tuning() { return *host_tuning_; }

double HostTuning::time_ms(const std::function<void()>& body) {
  backend_.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  body();
  backend_.synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

BackendTuning::Properties HostTuning::properties_of(const Backend& backend) {
  Properties p;
  p.name = backend.device().str();
  p.gbps_source = "unknown on " + backend.device().str();
  return p;
}

}  // namespace remat
