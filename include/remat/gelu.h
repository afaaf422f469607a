// GELU's constants, written once for the cpu backend and the CUDA kernels (constexpr
// floats: nvcc takes them in device code as it does in host code).
//   erf form:  y = x Φ(x),  Φ(x) = (1 + erf(x / √2)) / 2,  Φ'(x) = exp(-x² / 2) / √(2π)
//   tanh form: y = x (1 + tanh(√(2/π) (x + κ x³))) / 2,  κ = 0.044715 (PyTorch's
//              approximate="tanh")
#pragma once

namespace remat::gelu {

constexpr float kSqrt1_2 = 0.70710678118654752440f;      // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;   // 1 / sqrt(2 pi)
constexpr float kSqrt2OverPi = 0.79788456080286535588f;  // sqrt(2 / pi)
constexpr float kKappa = 0.044715f;

}  // namespace remat::gelu
