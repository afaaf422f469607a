// The learning-rate schedules of the optimizer section (remat/optim.h): linear warm-up,
// then constant, cosine decay to a floor, or steps.
#include <algorithm>
#include <cmath>

#include "remat/optim.h"

namespace remat {

double scheduled_lr(const OptimizerConfig& o, const ScheduleConfig& s, int64_t step, int64_t total) {
  if (s.warmup_steps > 0 && step <= s.warmup_steps) return o.lr * static_cast<double>(step) / s.warmup_steps;
  if (s.type == "cosine") {
    const double span = std::max<int64_t>(1, total - s.warmup_steps);
    const double t = std::min(1.0, static_cast<double>(step - s.warmup_steps) / span);
    const double floor = o.lr * s.min_lr_ratio;
    return floor + (o.lr - floor) * 0.5 * (1.0 + std::cos(M_PI * t));
  }
  if (s.type == "step") return o.lr * std::pow(s.gamma, static_cast<double>((step - 1) / s.step_size));
  return o.lr;
}

}  // namespace remat
