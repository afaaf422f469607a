// Rotary position embeddings' frequencies, written once for the cpu backend and the CUDA
// kernels (host and device): channel pair i of a head of d channels turns by t * f_i at
// position t, f_i = theta^(-2i/d), then scaled as a long-context model was trained:
//   linear (Chen et al. 2023, position interpolation; Hugging Face's rope_type "linear"):
//     f_i / factor;
//   llama3 (Meta's Llama 3.1 and later; rope_type "llama3"): with wavelength w = 2π / f_i,
//     w < original / high_freq_factor: f_i unchanged; w > original / low_freq_factor:
//     f_i / factor; between: (1 - s) f_i / factor + s f_i, s = (original / w - low) / (high - low).
// In double, as every angle of the rope op is.
#pragma once

#include <math.h>

#include <cstdint>

#include "remat/hd.h"

namespace remat {

enum class RopeScalingType : int { none = 0, linear = 1, llama3 = 2 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::none;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3 only
  double original_max_position = 8192.0;                 // llama3 only: the context it was trained at first
};

REMAT_HD REMAT_INLINE double rope_inv_freq(double theta, int64_t i, int64_t d, const RopeScaling& s) {
  const double f = pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
  if (s.type == RopeScalingType::linear) return f / s.factor;
  if (s.type != RopeScalingType::llama3) return f;
  const double pi = 3.14159265358979323846;
  const double wavelength = 2.0 * pi / f;
  if (wavelength < s.original_max_position / s.high_freq_factor) return f;
  if (wavelength > s.original_max_position / s.low_freq_factor) return f / s.factor;
  const double smooth =
      (s.original_max_position / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - smooth) * f / s.factor + smooth * f;
}

}  // namespace remat
