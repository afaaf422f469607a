// The CUDA emulator: CUDA's execution semantics, fault detection, and remat's own kernels
// run through REMAT_LAUNCH. Kernels are in tests/emu/*.cu; every expectation here is
// computed independently of the emulator (by hand or by a CPU loop).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "kernels/fill.cuh"
#include "kernels/optim.cuh"
#include "support/expect_error.h"
#include "tests/emu/test_kernels.h"

namespace {

// A device buffer through the emulated runtime.
template <typename T>
class Dev {
 public:
  explicit Dev(size_t n, T init = T{}) : n_(n) {
    EXPECT_EQ(cudaMalloc(&p_, n * sizeof(T)), cudaSuccess);
    set(std::vector<T>(n, init));
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { set(h); }
  ~Dev() { EXPECT_EQ(cudaFree(p_), cudaSuccess); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() const { return p_; }
  void set(const std::vector<T>& h) {
    ASSERT_EQ(h.size(), n_);
    ASSERT_EQ(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    EXPECT_EQ(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

// Lines of a source file that carry a marker comment, as "path:line".
std::string marked_line(const std::string& rel, const std::string& marker) {
  std::ifstream f(std::string(REMAT_SOURCE_DIR) + "/" + rel);
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    if (line.find("// " + marker) != std::string::npos) return rel + ":" + std::to_string(n);
  }
  ADD_FAILURE() << "marker " << marker << " not found in " << rel;
  return "?";
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const remat::Error& e) {
    return e.what();
  }
  return "";
}

std::vector<float> random_floats(size_t n, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------
// Warp shuffles
// ---------------------------------------------------------------------------

// The expected source lane, written from CUDA's documentation rather than from PTX:
// lanes form segments of `width`; up/down outside the segment keep their own value; idx
// wraps within the segment; xor may read earlier segments but not later ones.
int expected_shuffle(int op, int lane, int arg, int width) {
  const int seg = lane / width * width, in_seg = lane % width;
  switch (op) {
    case emu_test::kIdx: return 100 + seg + (arg % width + width) % width;
    case emu_test::kUp: return 100 + (in_seg - arg >= 0 ? lane - arg : lane);
    case emu_test::kDown: return 100 + (in_seg + arg < width ? lane + arg : lane);
    default: {
      const int j = lane ^ arg;
      return 100 + (j < seg + width ? j : lane);
    }
  }
}

TEST(EmuShuffle, WidthsAndOutOfRangeLanesMatchCuda) {
  std::vector<int> cases;
  for (int width : {32, 16, 8}) {
    for (int arg : {0, 1, 3, 5, 7, 8, 13, 16, 31}) {
      for (int op : {emu_test::kIdx, emu_test::kUp, emu_test::kDown, emu_test::kXor}) {
        cases.insert(cases.end(), {op, arg, width});
      }
    }
  }
  const int ncases = static_cast<int>(cases.size() / 3);
  Dev<int> dcases(cases), out(static_cast<size_t>(ncases) * 32);
  emu_test::shuffles(dcases.get(), ncases, 32, out.get());
  const auto got = out.host();
  for (int c = 0; c < ncases; ++c) {
    for (int lane = 0; lane < 32; ++lane) {
      ASSERT_EQ(got[c * 32 + lane], expected_shuffle(cases[3 * c], lane, cases[3 * c + 1], cases[3 * c + 2]))
          << "op " << cases[3 * c] << " arg " << cases[3 * c + 1] << " width " << cases[3 * c + 2] << " lane " << lane;
    }
  }
}

TEST(EmuShuffle, HandWrittenCases) {
  // (op, arg, width) and the values lanes 0..15 must see (value = 100 + source lane).
  const std::vector<int> cases = {emu_test::kDown, 3, 8, emu_test::kUp,  2,  16,
                                  emu_test::kXor,  8, 8, emu_test::kIdx, 35, 8};
  Dev<int> dcases(cases), out(4 * 32);
  emu_test::shuffles(dcases.get(), 4, 32, out.get());
  const auto got = out.host();
  const std::vector<std::vector<int>> want = {
      {103, 104, 105, 106, 107, 105, 106, 107, 111, 112, 113, 114, 115, 113, 114, 115},  // down 3, width 8
      {100, 101, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113},  // up 2, width 16
      {100, 101, 102, 103, 104, 105, 106, 107, 100, 101, 102, 103, 104, 105, 106, 107},  // xor 8, width 8
      {103, 103, 103, 103, 103, 103, 103, 103, 111, 111, 111, 111, 111, 111, 111, 111},  // idx 35 = 3, width 8
  };
  for (int c = 0; c < 4; ++c) {
    for (int lane = 0; lane < 16; ++lane)
      EXPECT_EQ(got[c * 32 + lane], want[c][lane]) << "case " << c << " lane " << lane;
  }
}

TEST(EmuShuffle, AbsentLanesGivePoison) {
  // A block of 40 threads: warp 1 has lanes 0..7 only. Reading lane 8..11 (absent) is
  // undefined on a GPU; the emulator returns all bits set.
  const std::vector<int> cases = {emu_test::kDown, 4, 32};
  Dev<int> dcases(cases), out(40);
  emu_test::shuffles(dcases.get(), 1, 40, out.get());
  const auto got = out.host();
  for (int lane = 0; lane < 4; ++lane) EXPECT_EQ(got[32 + lane], 100 + 32 + lane + 4);
  for (int lane = 4; lane < 8; ++lane) EXPECT_EQ(got[32 + lane], -1) << "lane " << lane;
  EXPECT_EQ(got[0], 104);  // warp 0 is complete
}

TEST(EmuShuffle, DoublesMoveWhole) {
  Dev<double> out(32);
  emu_test::shuffle_doubles(out.get());
  const auto got = out.host();
  for (int lane = 0; lane < 32; ++lane) {
    EXPECT_EQ(got[lane], 1.0e300 + static_cast<double>(lane ^ 5) * 1.0e290) << lane;
  }
}

TEST(EmuWarp, BallotAnyAllPerHalfWarpMask) {
  Dev<unsigned> out(96);
  emu_test::votes(out.get());
  const auto got = out.host();
  // Lanes divisible by 3: 0,3,6,9,12,15 | 18,21,24,27,30.
  const unsigned low = 0x9249u, high = 0x49240000u;
  for (unsigned lane = 0; lane < 32; ++lane) {
    EXPECT_EQ(got[lane], lane < 16 ? low : high) << lane;
    EXPECT_EQ(got[32 + lane], lane < 16 ? 0u : 1u) << lane;  // lane 20 is in the upper half
    EXPECT_EQ(got[64 + lane], lane < 16 ? 0u : 1u) << lane;  // lane 3 is in the lower half
  }
}

TEST(EmuWarp, Reductions) {
  Dev<int> out(96);
  emu_test::warp_reductions(out.get());
  const auto got = out.host();
  int sum = 0;
  for (int l = 0; l < 32; ++l) sum += l * 3 - 40;
  for (int l = 0; l < 32; ++l) {
    EXPECT_EQ(got[l], sum);
    EXPECT_EQ(got[32 + l], -40);
    EXPECT_EQ(got[64 + l], 31 * 3 - 40);
  }
}

TEST(EmuWarp, MismatchedCollectivesAndForeignMasksAreErrors) {
  Dev<int> out(32);
  const std::string a = error_of([&] { emu_test::mismatched_collectives(out.get()); });
  EXPECT_NE(a.find("different warp collectives"), std::string::npos) << a;
  EXPECT_NE(a.find("__shfl_sync"), std::string::npos) << a;
  EXPECT_NE(a.find("__ballot_sync"), std::string::npos) << a;
  const std::string b = error_of([&] { emu_test::mask_without_own_lane(out.get()); });
  EXPECT_NE(b.find("does not name its own lane 1"), std::string::npos) << b;
}

// ---------------------------------------------------------------------------
// Barriers
// ---------------------------------------------------------------------------

TEST(EmuBarrier, ReleasesWhenAllNonExitedThreadsArrive) {
  for (int active : {1, 31, 100, 255}) {
    Dev<int> out(257, -7);
    emu_test::early_exit(256, active, out.get());
    const auto got = out.host();
    for (int t = 0; t < active; ++t) ASSERT_EQ(got[t], 2 * ((t + 1) % active)) << "active " << active << " t " << t;
    EXPECT_EQ(got[active], (active + 1) / 2) << "__syncthreads_count, active " << active;
    for (int t = active + 1; t < 257; ++t) ASSERT_EQ(got[t], -7);
  }
}

TEST(EmuDeadlock, ThreadsAtDifferentBarriersNameBothLines) {
  Dev<int> out(32);
  const std::string msg = error_of([&] { emu_test::divergent_barriers(out.get()); });
  ASSERT_FALSE(msg.empty()) << "no error";
  EXPECT_NE(msg.find("divergent_barrier_kernel"), std::string::npos) << msg;
  EXPECT_NE(msg.find("block (0,0,0)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("different barriers"), std::string::npos) << msg;
  EXPECT_NE(msg.find(marked_line("tests/emu/kernels_deadlock.cu", "DEADLOCK_A")), std::string::npos) << msg;
  EXPECT_NE(msg.find(marked_line("tests/emu/kernels_deadlock.cu", "DEADLOCK_B")), std::string::npos) << msg;
}

TEST(EmuDeadlock, ShuffleSplitAcrossABarrierNamesBothLines) {
  Dev<int> out(32);
  const std::string msg = error_of([&] { emu_test::shuffle_split_by_barrier(out.get()); });
  ASSERT_FALSE(msg.empty()) << "no error";
  EXPECT_NE(msg.find("deadlock"), std::string::npos) << msg;
  EXPECT_NE(msg.find("split_shuffle_kernel"), std::string::npos) << msg;
  EXPECT_NE(msg.find("16 threads at __shfl_xor_sync (" + marked_line("tests/emu/kernels_deadlock.cu", "DEADLOCK_C")),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("16 threads at __syncthreads (" + marked_line("tests/emu/kernels_deadlock.cu", "DEADLOCK_D")),
            std::string::npos)
      << msg;
  // The emulator is usable after a failed launch.
  Dev<int> again(257);
  emu_test::early_exit(64, 64, again.get());
  EXPECT_EQ(again.host()[64], 32);
}

// ---------------------------------------------------------------------------
// Atomics and shared memory
// ---------------------------------------------------------------------------

TEST(EmuAtomics, SumsAcrossBlocks) {
  const int blocks = 64, threads = 128, n = blocks * threads;
  Dev<int> isum(1, 0), imax(1, -1), exch_last(1, -5);
  Dev<float> fsum(1, 0.0f);
  Dev<unsigned> inc(1, 0u), cas(1, 0u);
  Dev<long long> exch_sum(1, 0);
  emu_test::atomics(blocks, threads, isum.get(), fsum.get(), imax.get(), inc.get(), cas.get(), exch_last.get(),
                    exch_sum.get());
  long long want_sum = 0;
  int want_max = -1;
  for (int i = 0; i < n; ++i) {
    want_sum += i;
    want_max = std::max(want_max, (i * 7919) % 10007);
  }
  EXPECT_EQ(isum.host()[0], want_sum);
  EXPECT_EQ(fsum.host()[0], static_cast<float>(n / 4) * 1.5f);  // exact: quarters
  EXPECT_EQ(imax.host()[0], want_max);
  EXPECT_EQ(inc.host()[0], static_cast<unsigned>(n % 100));  // atomicInc wraps at 99
  EXPECT_EQ(cas.host()[0], static_cast<unsigned>(n));
  // Every value stored by atomicExch is returned exactly once, except the last one.
  EXPECT_EQ(exch_sum.host()[0] + exch_last.host()[0], -5 + want_sum);
}

TEST(EmuShared, TemplateInstantiationsHaveTheirOwnStaticShared) {
  const int blocks = 5;
  for (int n : {64, 128}) {
    std::vector<float> in(static_cast<size_t>(blocks) * n);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 17);
    Dev<float> din(in), out(blocks);
    Dev<unsigned long long> addr(1);
    emu_test::tile_sums(n, blocks, din.get(), out.get(), addr.get());
    const auto got = out.host();
    for (int b = 0; b < blocks; ++b) {
      float s = 0;
      for (int k = 0; k < n; ++k) s += in[static_cast<size_t>(b) * n + k];
      EXPECT_EQ(got[b], s) << "N " << n << " block " << b;
    }
  }
  Dev<float> din(std::vector<float>(128, 1.0f)), out(1);
  Dev<unsigned long long> a64(1), a128(1);
  emu_test::tile_sums(64, 1, din.get(), out.get(), a64.get());
  emu_test::tile_sums(128, 1, din.get(), out.get(), a128.get());
  EXPECT_NE(a64.host()[0], a128.host()[0]) << "tile_sum_kernel<64> and <128> share their __shared__ tile";
  EXPECT_EQ(a64.host()[0] % 16, 0u);
}

TEST(EmuShared, DynamicSharedIsPoisonedBeforeEveryBlock) {
  const int blocks = 3, threads = 64;
  Dev<unsigned> out(static_cast<size_t>(blocks) * 3 * threads);
  emu_test::read_uninitialised_shared(blocks, threads, out.get());
  const auto got = out.host();
  for (int b = 0; b < blocks; ++b) {
    const unsigned* o = got.data() + b * 3 * threads;
    for (int t = 0; t < threads; ++t) {
      ASSERT_EQ(o[t], 0xffffffffu) << "dynamic shared, block " << b << " thread " << t;
      ASSERT_TRUE(std::isnan(__uint_as_float(o[t])));
      // Static __shared__ is not poisoned (docs/kernels.md); the kernel only checks it works.
      const unsigned r = static_cast<unsigned>(threads - 1 - t);
      ASSERT_EQ(o[2 * threads + t], r + 1000u * static_cast<unsigned>(b) + r) << "block " << b << " thread " << t;
    }
  }
}

#if defined(__SANITIZE_ADDRESS__)
// Dynamic shared memory is an exact-size heap block, so AddressSanitizer sees overflows.
TEST(EmuSharedDeathTest, DynamicSharedOverflowIsCaughtByAsan) {
  Dev<int> out(32);
  EXPECT_DEATH(emu_test::overflow_dynamic_shared(out.get()), "heap-buffer-overflow");
}
#endif

// Device memory is a mapping of its own, inaccessible to host code outside emulated calls:
// a host dereference of a device pointer crashes, naming the allocation, as on a GPU.
TEST(EmuDeviceMemoryDeathTest, HostCodeCannotTouchItOutsideEmulatedCalls) {
  if (!remat::emu::device_memory_protected()) GTEST_SKIP() << "REMAT_EMU_PROTECT_DEVICE_MEMORY=0";
  Dev<int> d(1000, 5);
  int host_value = 0;
  EXPECT_TRUE(remat::emu::is_device_pointer(d.get()));
  EXPECT_TRUE(remat::emu::is_device_pointer(d.get() + 999));
  EXPECT_FALSE(remat::emu::is_device_pointer(&host_value));
  int* p = d.get();
  EXPECT_DEATH({ p[3] = 1; },
               "host code touched device memory at 0x[0-9a-f]+, inside the cudaMalloc allocation of 4000 bytes");
  EXPECT_DEATH({ host_value = *static_cast<volatile int*>(p + 999); },
               "inside the cudaMalloc allocation of 4000 bytes");
  // Kernels, memsets and copies still reach it.
  emu_test::write_one(d.get(), 3);
  ASSERT_EQ(cudaMemset(d.get() + 10, 0, sizeof(int)), cudaSuccess);
  const std::vector<int> h = d.host();
  EXPECT_EQ(h[3], 7);
  EXPECT_EQ(h[10], 0);
  EXPECT_EQ(h[999], 5);
  (void)host_value;
}

// An allocation ends just before a page no one may touch: a kernel that runs past it faults.
TEST(EmuDeviceMemoryDeathTest, AKernelPastTheLastPageFaults) {
  Dev<int> d(1000);
  // 4000 bytes end 96 bytes before a page boundary (256-byte rounding: 4096): 1024 is the
  // first int of the guard page.
  EXPECT_DEATH(emu_test::write_one(d.get(), 1024), "past the cudaMalloc allocation of 4000 bytes");
}

#if defined(__SANITIZE_ADDRESS__)
// Under AddressSanitizer the bytes between an allocation's end and its page's are poisoned.
TEST(EmuDeviceMemoryDeathTest, AKernelJustPastTheEndIsCaughtByAsan) {
  Dev<int> d(1000);
  EXPECT_DEATH(emu_test::write_one(d.get(), 1000), "use-after-poison");
}
#endif

// ---------------------------------------------------------------------------
// Whole kernels against CPU loops
// ---------------------------------------------------------------------------

// REMAT_EMU_SHUFFLE_LANES / set_shuffle_lanes: warp-synchronous code (a shared-memory read
// of another lane's write without __syncwarp) is right in thread order and wrong shuffled;
// with __syncwarp it is right in every order, and one seed gives one order.
TEST(EmuShuffleLanes, WarpSynchronousCodeIsCaught) {
  constexpr int kBlocks = 4, kThreads = 64, n = kBlocks * kThreads;
  std::vector<int> want(n);
  for (int i = 0; i < n; ++i) {
    const int t = i % kThreads;
    want[i] = (t + 1) + (t % 32 > 0 ? t : 0);
  }
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, n * sizeof(int)), cudaSuccess);
  auto run = [&](bool syncwarp, uint64_t seed) {
    const uint64_t old = remat::emu::shuffle_lanes_seed();
    remat::emu::set_shuffle_lanes(seed);
    emu_test::neighbour_sums(syncwarp, kBlocks, kThreads, d);
    remat::emu::set_shuffle_lanes(old);
    std::vector<int> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  };
  EXPECT_EQ(run(false, 0), want) << "in thread order the missing __syncwarp goes unnoticed";
  for (uint64_t seed : {1u, 2u, 12345u}) {
    const std::vector<int> got = run(false, seed);
    int wrong = 0;
    for (int i = 0; i < n; ++i) wrong += got[i] != want[i];
    EXPECT_GT(wrong, n / 8) << "seed " << seed << ": shuffled lanes should read unwritten (poisoned) values";
    EXPECT_EQ(run(false, seed), got) << "seed " << seed << ": one seed, one order";
    EXPECT_EQ(run(true, seed), want) << "seed " << seed << ": with __syncwarp every order is right";
  }
  cudaFree(d);
}

TEST(EmuKernels, BlockReductionMatchesCpu) {
  const int n = 100000, blocks = 7, threads = 256;
  const auto in = random_floats(n, 1);
  Dev<float> din(in), out(blocks);
  emu_test::block_sums(din.get(), n, blocks, threads, out.get());
  const auto got = out.host();
  double total = 0, want_total = 0;
  for (int b = 0; b < blocks; ++b) {
    double want = 0;
    for (int i = b * threads; i < n; i += blocks * threads) {
      for (int k = i; k < std::min(n, i + threads); ++k) want += in[k];
    }
    EXPECT_NEAR(got[b], want, 1e-3) << "block " << b;
    total += got[b];
  }
  for (float x : in) want_total += x;
  EXPECT_NEAR(total, want_total, 1e-2);
}

TEST(EmuKernels, WarpSoftmaxMatchesCpu) {
  const int rows = 37, cols = 200;  // rows do not fill the last block; cols not a multiple of 32
  const auto x = random_floats(static_cast<size_t>(rows) * cols, 2, -8.0f, 8.0f);
  Dev<float> dx(x), dy(x.size(), -1.0f);
  emu_test::softmax_rows(dx.get(), dy.get(), rows, cols, 128);
  const auto y = dy.host();
  for (int r = 0; r < rows; ++r) {
    double m = -INFINITY, s = 0;
    for (int c = 0; c < cols; ++c) m = std::max(m, static_cast<double>(x[r * cols + c]));
    for (int c = 0; c < cols; ++c) s += std::exp(x[r * cols + c] - m);
    for (int c = 0; c < cols; ++c) {
      const double want = std::exp(x[r * cols + c] - m) / s;
      ASSERT_NEAR(y[r * cols + c], want, 1e-6 + 1e-5 * want) << "row " << r << " col " << c;
    }
  }
}

TEST(EmuKernels, RematFillThroughRematLaunch) {
  const int64_t n = 1000003;  // not a multiple of the block size
  Dev<float> buf(static_cast<size_t>(n) + 8, -2.0f);
  remat::kernels::fill_f32(buf.get(), n, 3.5f, nullptr);
  const auto got = buf.host();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], 3.5f) << i;
  for (int64_t i = n; i < n + 8; ++i) ASSERT_EQ(got[i], -2.0f) << "canary " << i;
  remat::kernels::fill_f32(buf.get(), 0, 9.0f, nullptr);  // empty: no launch
  EXPECT_EQ(buf.host()[0], 3.5f);
}

// The multi-tensor sum of squares (clip_grad_norm, global_norm) gives the bits of one
// sum_squares per tensor in order, also across two batches (the second accumulating);
// the multi-tensor clip scale the bits of scale_by_clip per tensor. 70 tensors in one
// buffer: empty ones, sizes not multiples of 4, offsets that break 16-byte alignment, and
// one above kSumSquaresMaxBlocks x 256 x 4 elements (its grid capped, so threads stride).
TEST(EmuKernels, MultiTensorNormAndScaleAreThePerTensorBits) {
  namespace k = remat::kernels;
  std::vector<int64_t> sizes, offsets;
  int64_t at = 0, blocks = 0;
  for (int i = 0; i < 70; ++i) {
    const int64_t n = i == 17 ? 1100003 : i % 9 == 4 ? 0 : (i * 7919 + 5) % 30000 + i % 4;
    at += i % 3 == 1 ? 1 : (4 - at % 4) % 4;  // every third tensor misaligned
    offsets.push_back(at);
    sizes.push_back(n);
    at += n;
    blocks += k::sum_squares_blocks(n);
  }
  ASSERT_EQ(k::sum_squares_blocks(sizes[17]), k::kSumSquaresMaxBlocks);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> h(static_cast<size_t>(at));
  for (float& v : h) v = u(rng);
  Dev<float> x(h), y(h);
  Dev<double> one(static_cast<size_t>(k::kSumSquaresMaxBlocks) + 1), many(static_cast<size_t>(blocks) + 1);
  for (size_t i = 0; i < sizes.size(); ++i)
    k::sum_squares(x.get() + offsets[i], sizes[i], one.get() + 1, one.get(), i > 0, nullptr);
  std::vector<k::NormMultiEntry> e;
  for (size_t i = 0; i < sizes.size(); ++i) e.push_back({x.get() + offsets[i], sizes[i]});
  k::sum_squares_multi(e.data(), k::kNormMultiMax, many.get() + 1, many.get(), false, nullptr);
  k::sum_squares_multi(e.data() + k::kNormMultiMax, static_cast<int>(e.size()) - k::kNormMultiMax, many.get() + 1,
                       many.get(), true, nullptr);
  const double want = one.host()[0], got = many.host()[0];
  double ref = 0.0;  // the tensors only, not the gaps between them
  for (size_t i = 0; i < sizes.size(); ++i)
    for (int64_t j = 0; j < sizes[i]; ++j) ref += static_cast<double>(h[offsets[i] + j]) * h[offsets[i] + j];
  EXPECT_NEAR(want, ref, 1e-9 * ref);
  EXPECT_EQ(std::memcmp(&want, &got, sizeof want), 0) << "multi " << got << " vs per tensor " << want;

  Dev<k::ClipScale> scale(1, k::ClipScale{0.37f, 1});
  std::vector<float*> xs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    k::scale_by_clip(x.get() + offsets[i], sizes[i], scale.get(), nullptr);
    xs.push_back(y.get() + offsets[i]);
  }
  k::scale_by_clip_multi(xs.data(), sizes.data(), k::kNormMultiMax, scale.get(), nullptr);
  k::scale_by_clip_multi(xs.data() + k::kNormMultiMax, sizes.data() + k::kNormMultiMax,
                         static_cast<int>(xs.size()) - k::kNormMultiMax, scale.get(), nullptr);
  const std::vector<float> a = x.host(), b = y.host();
  ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "scale_by_clip_multi";
  EXPECT_EQ(a[static_cast<size_t>(offsets[1])], 0.37f * h[static_cast<size_t>(offsets[1])]);
  // No clipping (apply = 0): nothing changes.
  scale.set({k::ClipScale{0.5f, 0}});
  k::scale_by_clip_multi(xs.data(), sizes.data(), k::kNormMultiMax, scale.get(), nullptr);
  EXPECT_EQ(y.host(), b);
}

// ---------------------------------------------------------------------------
// Launch configuration errors, reported like CUDA through cudaGetLastError
// ---------------------------------------------------------------------------

TEST(EmuLaunch, ConfigurationErrorsAreReportedByCheckLaunch) {
  Dev<int> out(1, 0);
  EXPECT_REMAT_ERROR(emu_test::configured_launch(dim3(1), dim3(1025), 0, out.get()), "cudaErrorInvalidConfiguration");
  EXPECT_REMAT_ERROR(emu_test::configured_launch(dim3(1), dim3(1, 1, 65), 0, out.get()),
                     "cudaErrorInvalidConfiguration");
  EXPECT_REMAT_ERROR(emu_test::configured_launch(dim3(1, 65536), dim3(32), 0, out.get()),
                     "cudaErrorInvalidConfiguration");
  EXPECT_REMAT_ERROR(emu_test::configured_launch(dim3(1), dim3(32), 48 * 1024 + 1, out.get()), "cudaErrorInvalidValue");
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "check_launch clears the error";
  EXPECT_EQ(out.host()[0], 0) << "a failed launch ran";
  // The message names the kernel and the launch shape.
  const std::string msg = error_of([&] { emu_test::configured_launch(dim3(2), dim3(1025), 0, out.get()); });
  EXPECT_NE(msg.find("configured_kernel <<<(2,1,1), (1025,1,1), 0>>>"), std::string::npos) << msg;

  // 1024 threads in any shape, and more shared memory after opting in, are fine.
  emu_test::configured_launch(dim3(2, 1, 1), dim3(8, 8, 16), 0, out.get());
  EXPECT_EQ(out.host()[0], 2);
  ASSERT_EQ(emu_test::allow_dynamic_shared(100 * 1024), cudaSuccess);
  emu_test::configured_launch(dim3(1), dim3(32), 100 * 1024, out.get());
  EXPECT_EQ(out.host()[0], 3);
  EXPECT_NE(emu_test::allow_dynamic_shared(228 * 1024), cudaSuccess);
}

TEST(EmuRuntime, MemoryStreamsEventsAndErrors) {
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 64 * sizeof(float)), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e0, s), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d, 0, 64 * sizeof(float), s), cudaSuccess);
  remat::kernels::fill_f32(d, 10, 1.5f, s);
  ASSERT_EQ(cudaEventRecord(e1, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  float ms = -1;
  ASSERT_EQ(cudaEventElapsedTime(&ms, e0, e1), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  std::vector<float> h(64);
  ASSERT_EQ(cudaMemcpyAsync(h.data(), d, 64 * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
  // A copy on a non-blocking stream runs when something waits for it (stricter than a GPU,
  // where it may or may not have run by now): not yet, then after the synchronisation.
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  EXPECT_EQ(h[9], 0.0f);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
  EXPECT_EQ(h[9], 1.5f);
  EXPECT_EQ(h[10], 0.0f);
  EXPECT_EQ(cudaEventDestroy(e0), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(e1), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  int not_allocated = 0;
  EXPECT_EQ(cudaFree(&not_allocated), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_STREQ(cudaGetErrorName(cudaErrorInvalidConfiguration), "cudaErrorInvalidConfiguration");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorInvalidConfiguration), "invalid configuration argument");
  int count = 0;
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, 1);
}

// The pointer-array GEMMs (cublasSgemmBatched, cublasGemmBatchedEx) are bitwise a loop of
// the single calls over the arrays' matrices (placed at unrelated offsets, every
// transpose pair, beta reading C), one call counted per batch; their argument checks are
// the single calls' plus the arrays': device memory, a batch count >= 0.
TEST(EmuCublas, PointerArrayBatchedCallsAreALoopOfSingleCalls) {
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  const int m = 5, n = 7, k = 6, batch = 4;
  const size_t kSpan = 96;                       // elements between matrices, at least lda * cols + the offsets
  const size_t offsets[batch] = {3, 40, 0, 17};  // where matrix i starts inside its span
  const float alpha = 0.75f, beta = 0.5f;
  for (cublasOperation_t ta : {CUBLAS_OP_N, CUBLAS_OP_T}) {
    for (cublasOperation_t tb : {CUBLAS_OP_N, CUBLAS_OP_T}) {
      SCOPED_TRACE(std::to_string(ta) + std::to_string(tb));
      const int lda = (ta == CUBLAS_OP_N ? m : k) + 2, ldb = (tb == CUBLAS_OP_N ? k : n) + 1, ldc = m + 3;
      const size_t total = kSpan * batch;
      const std::vector<float> ha = random_floats(total, 1), hb = random_floats(total, 2), hc = random_floats(total, 3);
      // Matrix i of A, B, C at span batch - 1 - i (the arrays need not follow memory order).
      auto at = [&](auto* base, int i) { return base + kSpan * static_cast<size_t>(batch - 1 - i) + offsets[i]; };

      // fp32: cublasSgemmBatched against cublasSgemm per matrix.
      Dev<float> a(ha), b(hb), c(hc), c_ref(hc);
      std::vector<const float*> pa, pb;
      std::vector<float*> pc;
      for (int i = 0; i < batch; ++i) {
        pa.push_back(at(a.get(), i));
        pb.push_back(at(b.get(), i));
        pc.push_back(at(c.get(), i));
        ASSERT_EQ(cublasSgemm(h, ta, tb, m, n, k, &alpha, at(a.get(), i), lda, at(b.get(), i), ldb, &beta,
                              at(c_ref.get(), i), ldc),
                  CUBLAS_STATUS_SUCCESS);
      }
      Dev<const float*> da(pa), db(pb);
      Dev<float*> dc(pc);
      const uint64_t calls = remat::emu::cublas_gemm_calls();
      ASSERT_EQ(
          cublasSgemmBatched(h, ta, tb, m, n, k, &alpha, da.get(), lda, db.get(), ldb, &beta, dc.get(), ldc, batch),
          CUBLAS_STATUS_SUCCESS);
      EXPECT_EQ(remat::emu::cublas_gemm_calls(), calls + 1);
      const std::vector<float> got = c.host(), want = c_ref.host();
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "cublasSgemmBatched";
      EXPECT_NE(want, hc) << "the reference wrote nothing";

      // bf16 factors into a bf16 and an fp32 C: cublasGemmBatchedEx against cublasGemmEx.
      auto to_bf16 = [](const std::vector<float>& v) {
        std::vector<__nv_bfloat16> r(v.size());
        for (size_t i = 0; i < v.size(); ++i) r[i] = __float2bfloat16_rn(v[i]);
        return r;
      };
      Dev<__nv_bfloat16> a16(to_bf16(ha)), b16(to_bf16(hb));
      std::vector<const void*> qa, qb;
      for (int i = 0; i < batch; ++i) {
        qa.push_back(at(a16.get(), i));
        qb.push_back(at(b16.get(), i));
      }
      Dev<const void*> ea(qa), eb(qb);
      for (const cudaDataType ct : {CUDA_R_16BF, CUDA_R_32F}) {
        SCOPED_TRACE(ct == CUDA_R_16BF ? "bf16 C" : "fp32 C");
        Dev<__nv_bfloat16> c16(to_bf16(hc)), c16_ref(to_bf16(hc));
        Dev<float> c32(hc), c32_ref(hc);
        auto c_at = [&](bool ref, int i) -> void* {
          if (ct == CUDA_R_16BF) return at((ref ? c16_ref : c16).get(), i);
          return at((ref ? c32_ref : c32).get(), i);
        };
        std::vector<void*> qc;
        for (int i = 0; i < batch; ++i) {
          qc.push_back(c_at(false, i));
          ASSERT_EQ(
              cublasGemmEx(h, ta, tb, m, n, k, &alpha, at(a16.get(), i), CUDA_R_16BF, lda, at(b16.get(), i),
                           CUDA_R_16BF, ldb, &beta, c_at(true, i), ct, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
        }
        Dev<void*> ec(qc);
        const uint64_t before = remat::emu::cublas_gemm_calls();
        ASSERT_EQ(cublasGemmBatchedEx(h, ta, tb, m, n, k, &alpha, ea.get(), CUDA_R_16BF, lda, eb.get(), CUDA_R_16BF,
                                      ldb, &beta, ec.get(), ct, ldc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  CUBLAS_STATUS_SUCCESS);
        EXPECT_EQ(remat::emu::cublas_gemm_calls(), before + 1);
        if (ct == CUDA_R_16BF) {
          const std::vector<__nv_bfloat16> g = c16.host(), w = c16_ref.host();
          EXPECT_EQ(std::memcmp(g.data(), w.data(), g.size() * sizeof(__nv_bfloat16)), 0) << "cublasGemmBatchedEx";
        } else {
          const std::vector<float> g = c32.host(), w = c32_ref.host();
          EXPECT_EQ(std::memcmp(g.data(), w.data(), g.size() * sizeof(float)), 0) << "cublasGemmBatchedEx";
          EXPECT_NE(w, hc);
        }
      }
    }
  }

  // Argument checks.
  Dev<float> x(64, 1.0f);
  Dev<const float*> arr(std::vector<const float*>(2, x.get()));
  Dev<float*> out(std::vector<float*>(2, x.get()));
  Dev<const void*> varr(std::vector<const void*>(2, x.get()));
  Dev<void*> vout(std::vector<void*>(2, x.get()));
  const float one = 1.0f, zero = 0.0f;
  const std::vector<const float*> host_arr(2, x.get());
  const uint64_t calls = remat::emu::cublas_gemm_calls();
  EXPECT_EQ(cublasSgemmBatched(nullptr, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, arr.get(), 2, arr.get(), 2, &zero,
                               out.get(), 2, 2),
            CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasSgemmBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, arr.get(), 1, arr.get(), 2, &zero, out.get(),
                               2, 2),
            CUBLAS_STATUS_INVALID_VALUE);  // lda < m
  EXPECT_EQ(cublasSgemmBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, arr.get(), 2, arr.get(), 2, &zero, out.get(),
                               2, -1),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasSgemmBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, nullptr, arr.get(), 2, arr.get(), 2, &zero,
                               out.get(), 2, 2),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasSgemmBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, host_arr.data(), 2, arr.get(), 2, &zero,
                               out.get(), 2, 2),
            CUBLAS_STATUS_INVALID_VALUE);  // a host array
  EXPECT_EQ(
      cublasSgemmBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, nullptr, 2, nullptr, 2, &zero, nullptr, 2, 0),
      CUBLAS_STATUS_SUCCESS);  // nothing to do
  EXPECT_EQ(
      cublasGemmBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, varr.get(), CUDA_R_32F, 2, varr.get(),
                          CUDA_R_16BF, 2, &zero, vout.get(), CUDA_R_32F, 2, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      CUBLAS_STATUS_NOT_SUPPORTED);  // mixed factor types
  EXPECT_EQ(
      cublasGemmBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, varr.get(), CUDA_R_32F, 2, varr.get(), CUDA_R_32F,
                          2, &zero, vout.get(), CUDA_R_32F, 2, 2, CUBLAS_COMPUTE_32F, static_cast<cublasGemmAlgo_t>(5)),
      CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(
      cublasGemmBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 3, &one, varr.get(), CUDA_R_32F, 2, varr.get(), CUDA_R_32F,
                          3, &zero, vout.get(), CUDA_R_32F, 2, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      CUBLAS_STATUS_INVALID_VALUE);  // lda < k under op T
  EXPECT_EQ(remat::emu::cublas_gemm_calls(), calls + 1) << "only the empty batch counts";
  EXPECT_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
}
