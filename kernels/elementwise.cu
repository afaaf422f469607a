#include "kernels/elementwise.cuh"
#include "kernels/launch.cuh"
#include "kernels/vec4.cuh"

namespace remat::kernels {

namespace {

constexpr int kBlock = 256;

constexpr float kSqrt1_2 = 0.70710678118654752440f;      // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;   // 1 / sqrt(2 pi)
constexpr float kSqrt2OverPi = 0.79788456080286535588f;  // sqrt(2 / pi)
constexpr float kKappa = 0.044715f;

// ---- The per-element functions --------------------------------------------------------

struct Add {
  __device__ float operator()(float u, float v) const { return u + v; }
};

struct Scale {
  float alpha;
  __device__ float operator()(float v) const { return alpha * v; }
};

struct Identity {
  __device__ float operator()(float v) const { return v; }
};

struct Relu {
  __device__ float operator()(float v) const { return v > 0.0f ? v : 0.0f; }
};

struct ReluBackward {
  __device__ float operator()(float g, float v) const { return v > 0.0f ? g : 0.0f; }
};

struct GeluErf {
  __device__ float operator()(float v) const { return 0.5f * v * (1.0f + erff(v * kSqrt1_2)); }
};

struct GeluTanh {
  __device__ float operator()(float v) const {
    return 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + kKappa * v * v * v)));
  }
};

struct GeluErfBackward {
  __device__ float operator()(float g, float v) const {
    const float cdf = 0.5f * (1.0f + erff(v * kSqrt1_2));
    const float pdf = kInvSqrt2Pi * expf(-0.5f * v * v);
    return g * (cdf + v * pdf);
  }
};

struct GeluTanhBackward {
  __device__ float operator()(float g, float v) const {
    const float t = tanhf(kSqrt2OverPi * (v + kKappa * v * v * v));
    const float dinner = kSqrt2OverPi * (1.0f + 3.0f * kKappa * v * v);
    return g * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dinner);
  }
};

// ---- Kernels: y[i] = op(a[i]) and y[i] = op(a[i], b[i]) ---------------------------------
// Grid-stride loops. With vec (every pointer 16-byte aligned) the first n / 4 * 4 elements
// go as float4, and the last n % 4 (fewer than the threads of one block) one by one.
// No __restrict__: y may be a or b.

template <typename Op>
__global__ void map1_kernel(const float* a, float* y, int64_t n, bool vec, Op op) {
  const int64_t start = grid_start(), stride = grid_stride();
  int64_t done = 0;
  if (vec) {
    const int64_t n4 = n / 4;
    for (int64_t q = start; q < n4; q += stride) {
      const float4 u = load4(a, q);
      store4(y, q, make_float4(op(u.x), op(u.y), op(u.z), op(u.w)));
    }
    done = n4 * 4;
  }
  for (int64_t i = done + start; i < n; i += stride) y[i] = op(a[i]);
}

template <typename Op>
__global__ void map2_kernel(const float* a, const float* b, float* y, int64_t n, bool vec, Op op) {
  const int64_t start = grid_start(), stride = grid_stride();
  int64_t done = 0;
  if (vec) {
    const int64_t n4 = n / 4;
    for (int64_t q = start; q < n4; q += stride) {
      const float4 u = load4(a, q), v = load4(b, q);
      store4(y, q, make_float4(op(u.x, v.x), op(u.y, v.y), op(u.z, v.z), op(u.w, v.w)));
    }
    done = n4 * 4;
  }
  for (int64_t i = done + start; i < n; i += stride) y[i] = op(a[i], b[i]);
}

// One thread per float4 (per element without vec), at most kMaxGridStrideBlocks blocks.
unsigned blocks_for(int64_t n, bool vec) { return grid_stride_blocks(vec ? ceil_div<int64_t>(n, 4) : n, kBlock); }

template <typename Op>
void map1(const float* a, float* y, int64_t n, Op op, cudaStream_t stream) {
  const bool vec = aligned16(a) && aligned16(y);
  REMAT_LAUNCH(map1_kernel<Op>, dim3(blocks_for(n, vec)), dim3(kBlock), 0, stream, a, y, n, vec, op);
}

template <typename Op>
void map2(const float* a, const float* b, float* y, int64_t n, Op op, cudaStream_t stream) {
  const bool vec = aligned16(a) && aligned16(b) && aligned16(y);
  REMAT_LAUNCH(map2_kernel<Op>, dim3(blocks_for(n, vec)), dim3(kBlock), 0, stream, a, b, y, n, vec, op);
}

}  // namespace

void add_f32(const float* a, const float* b, float* y, int64_t n, cudaStream_t stream) {
  map2(a, b, y, n, Add{}, stream);
}

void scale_f32(const float* x, float alpha, float* y, int64_t n, cudaStream_t stream) {
  map1(x, y, n, Scale{alpha}, stream);
}

void copy_f32(const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (x != y) map1(x, y, n, Identity{}, stream);
}

void relu_forward(const float* x, float* y, int64_t n, cudaStream_t stream) { map1(x, y, n, Relu{}, stream); }

void relu_backward(const float* dy, const float* x, float* dx, int64_t n, cudaStream_t stream) {
  map2(dy, x, dx, n, ReluBackward{}, stream);
}

void gelu_forward(const float* x, Gelu form, float* y, int64_t n, cudaStream_t stream) {
  if (form == Gelu::erf)
    map1(x, y, n, GeluErf{}, stream);
  else
    map1(x, y, n, GeluTanh{}, stream);
}

void gelu_backward(const float* dy, const float* x, Gelu form, float* dx, int64_t n, cudaStream_t stream) {
  if (form == Gelu::erf)
    map2(dy, x, dx, n, GeluErfBackward{}, stream);
  else
    map2(dy, x, dx, n, GeluTanhBackward{}, stream);
}

}  // namespace remat::kernels
