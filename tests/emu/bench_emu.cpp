// Throughput of the CUDA emulator on this machine (figures quoted in docs/kernels.md).
// Not a test: run build/<preset>/tests/emu/emu_bench.
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "kernels/fill.cuh"
#include "tests/emu/test_kernels.h"

namespace {

double best_ms(int reps, const std::function<void()>& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return best;
}

template <typename T>
T* device(size_t n, T value) {
  T* p = nullptr;
  cudaMalloc(&p, n * sizeof(T));
  std::vector<T> h(n, value);
  cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  return p;
}

}  // namespace

int main() {
  int* out = device<int>(1024, 0);
  {
    const int threads = 1024, iterations = 200;
    const uint64_t s0 = remat::emu::switch_count();
    const double ms = best_ms(1, [&] { emu_test::barrier_loop(1, threads, iterations, out); });
    const double switches = static_cast<double>(remat::emu::switch_count() - s0);
    std::printf("barriers: %d threads x %d __syncthreads: %.1f ms, %.0f switches, %.1f ns per switch\n", threads,
                iterations, ms, switches, ms * 1e6 / switches);
  }
  const int64_t n = int64_t{1} << 22;  // 4 M
  float* x = device<float>(static_cast<size_t>(n), 1.0f);
  float* y = device<float>(static_cast<size_t>(n), 2.0f);
  {
    const double ms = best_ms(3, [&] { remat::kernels::fill_f32(y, n, 2.0f, nullptr); });
    std::printf("fill_f32 (kernels/fill.cu), 4 M elements: %.1f ms (%.0f M threads/s)\n", ms, n / ms / 1e3);
  }
  {
    const double ms = best_ms(3, [&] { emu_test::axpy(0.5f, x, y, n); });
    std::printf("axpy, 4 M elements, 1 thread each: %.1f ms (%.0f M threads/s)\n", ms, n / ms / 1e3);
  }
  {
    float* sums = device<float>(1024, 0.0f);
    const double ms = best_ms(3, [&] { emu_test::block_sums(x, static_cast<int>(n), 1024, 256, sums); });
    std::printf("block reduction, 4 M elements, 1024 x 256 threads: %.1f ms\n", ms);
    cudaFree(sums);
  }
  {
    const int rows = 1024, cols = 1024;
    const double ms = best_ms(3, [&] { emu_test::softmax_rows(x, y, rows, cols, 128); });
    std::printf("softmax 1024 x 1024, one warp per row: %.1f ms\n", ms);
  }
  {
    const int blocks = 4096;  // 128 threads each: 512 K elements
    float* sums = device<float>(blocks, 0.0f);
    for (bool check : {false, true}) {
      remat::emu::set_racecheck(check);
      const double ms =
          best_ms(3, [&] { emu_test::race_reduction(emu_test::RaceCase::kStaticFixed, x, sums, blocks); });
      std::printf("instrumented shared-memory reduction, %d x 128 threads, race check %s: %.1f ms\n", blocks,
                  check ? "on " : "off", ms);
    }
    remat::emu::set_racecheck(false);
    cudaFree(sums);
  }
  cudaFree(x);
  cudaFree(y);
  cudaFree(out);
  return 0;
}
