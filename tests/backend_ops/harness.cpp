#include "backend_ops/harness.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

#include "remat/bf16.h"
#include "remat/device.h"
#include "remat/error.h"

namespace remat::test {

namespace {

constexpr int64_t kGuard = 67;                // elements each side; odd, so vector-width overruns land in it
constexpr uint32_t kGuardBits = 0x7fa5a5a5u;  // a NaN payload no kernel produces
constexpr uint32_t kPoisonI32 = 0x7f7f7f7fu;

constexpr uint16_t kGuardBitsBf16 = 0x7fa5u;  // the same for bf16 outputs
constexpr uint16_t kPoisonBf16 = 0x7fc0u;     // a quiet NaN

constexpr uint8_t kGuardBitsU8 = 0xa5u;  // the same for u8 outputs (no window has 166 positions)
constexpr uint8_t kPoisonU8 = 0xffu;

uint32_t guard_bits(DType d) { return d == DType::bf16 ? kGuardBitsBf16 : d == DType::u8 ? kGuardBitsU8 : kGuardBits; }

// The raw bits of every element (bf16: 16 bits each; u8: 8).
std::vector<uint32_t> host_bits(const Tensor& t) {
  std::vector<uint32_t> out(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::bf16) {
    const Tensor h = t.to(Device::cpu());
    std::copy(h.bf16(), h.bf16() + h.numel(), out.begin());
  } else if (t.dtype() == DType::f32) {
    auto v = t.to_vector();
    std::memcpy(out.data(), v.data(), out.size() * 4);
  } else {
    auto v = t.to_ints();
    std::memcpy(out.data(), v.data(), out.size() * 4);
  }
  return out;
}

Tensor from_bits(const std::vector<uint32_t>& bits, const Shape& s, DType dtype, Device d) {
  if (dtype == DType::bf16) {
    Tensor h = Tensor::empty(s, Device::cpu(), DType::bf16);
    for (size_t i = 0; i < bits.size(); ++i) h.bf16()[i] = static_cast<uint16_t>(bits[i]);
    return d.is_cpu() ? h : h.to(d);
  }
  if (dtype == DType::f32) {
    std::vector<float> f(bits.size());
    std::memcpy(f.data(), bits.data(), bits.size() * 4);
    return Tensor::from_vector(f, s, d);
  }
  if (dtype == DType::u8) return Tensor::from_u8(std::vector<uint8_t>(bits.begin(), bits.end()), s, d);
  std::vector<int32_t> i(bits.size());
  std::memcpy(i.data(), bits.data(), bits.size() * 4);
  return Tensor::from_ints(i, s, d);
}

// The values of a float tensor (f32 or bf16, widened exactly).
std::vector<float> host_floats(const Tensor& t) {
  if (t.dtype() == DType::f32) return t.to_vector();
  const auto bits = host_bits(t);
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_to_float(static_cast<uint16_t>(bits[i]));
  return out;
}

}  // namespace

OpCheck::OpCheck(Backend& ref, Backend& dut, uint64_t seed) : ref_(ref), dut_(dut), rng_(seed) {}

OpCheck::~OpCheck() = default;

Pair OpCheck::uniform(const Shape& s, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (auto& x : v) x = dist(rng_);
  return values(v, s);
}

Pair OpCheck::values(const std::vector<float>& v, const Shape& s) {
  return {Tensor::from_vector(v, s, ref_.device()), Tensor::from_vector(v, s, dut_.device())};
}

Pair OpCheck::uniform_bf16(const Shape& s, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (auto& x : v) x = dist(rng_);
  return values_bf16(v, s);
}

Pair OpCheck::values_bf16(const std::vector<float>& v, const Shape& s) {
  std::vector<uint32_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = bf16_from_float(v[i]);
  return {from_bits(bits, s, DType::bf16, ref_.device()), from_bits(bits, s, DType::bf16, dut_.device())};
}

Pair OpCheck::as_f32(const Pair& p) {
  return {Tensor::from_vector(host_floats(p.ref), p.ref.shape(), ref_.device()),
          Tensor::from_vector(host_floats(p.dut), p.dut.shape(), dut_.device())};
}

Pair OpCheck::ints(const Shape& s, int lo, int hi) {
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<int32_t> v(static_cast<size_t>(s.numel()));
  for (auto& x : v) x = dist(rng_);
  return int_values(v, s);
}

Pair OpCheck::int_values(const std::vector<int32_t>& v, const Shape& s) {
  return {Tensor::from_ints(v, s, ref_.device()), Tensor::from_ints(v, s, dut_.device())};
}

Pair OpCheck::byte_values(const std::vector<uint8_t>& v, const Shape& s) {
  return {Tensor::from_u8(v, s, ref_.device()), Tensor::from_u8(v, s, dut_.device())};
}

Pair OpCheck::guarded(const Shape& s, DType dtype) {
  const int64_t n = s.numel();
  std::vector<uint32_t> bits(static_cast<size_t>(n + 2 * kGuard), guard_bits(dtype));
  const uint32_t poison = dtype == DType::bf16  ? kPoisonBf16
                          : dtype == DType::f32 ? 0x7fc00000u
                          : dtype == DType::u8  ? kPoisonU8
                                                : kPoisonI32;
  std::fill(bits.begin() + kGuard, bits.begin() + kGuard + n, poison);
  const Shape whole({n + 2 * kGuard});
  Guarded g;
  g.ref_storage = from_bits(bits, whole, dtype, ref_.device());
  g.dut_storage = from_bits(bits, whole, dtype, dut_.device());
  g.numel = n;
  g.dtype = dtype;
  guarded_.push_back(g);
  return {g.ref_storage.view_at(kGuard, s), g.dut_storage.view_at(kGuard, s)};
}

Pair OpCheck::output(const Shape& s, DType dtype) { return guarded(s, dtype); }

Pair OpCheck::output_like(const Pair& init) {
  Pair p = guarded(init.ref.shape(), init.ref.dtype());
  p.ref.copy_from(init.ref);
  p.dut.copy_from(init.ref);  // the reference's values, so both start bitwise equal
  return p;
}

int perf_iterations() {
  static const int n = [] {
    const char* v = std::getenv("REMAT_OP_PERF");
    return v && *v ? std::max(1, std::atoi(v)) : 0;
  }();
  return n;
}

void OpCheck::run(const std::function<void(Backend&, Side)>& f) {
  if (const int iters = perf_iterations()) {
    // The reference runs once, so that what a case reads back on the host (a count, a
    // norm) is still defined; only the device under test is timed.
    f(ref_, Side{true});
    std::vector<const Tensor*> touched;
    f(dut_, Side{false, &touched});  // warm-up; and which tensors a run reads and writes
    std::set<const void*> seen;
    for (const Tensor* t : touched)
      if (t->defined() && seen.insert(t->raw_data()).second) perf_.bytes += static_cast<double>(t->nbytes());
    double ms = 0.0;
    for (int i = 0; i < iters; ++i) ms += dut_.tuning().time_ms([&] { f(dut_, Side{false}); });
    perf_.ms += ms / iters;
    perf_.runs++;
    return;
  }
  f(ref_, Side{true});
  f(dut_, Side{false});
}

void OpCheck::check_guards() {
  for (const auto& g : guarded_) {
    for (const Tensor* t : {&g.ref_storage, &g.dut_storage}) {
      const auto bits = host_bits(*t);
      const uint32_t guard = guard_bits(g.dtype);
      for (int64_t i = 0; i < kGuard; ++i) {
        const int64_t lo = i, hi = kGuard + g.numel + i;
        ASSERT_EQ(bits[static_cast<size_t>(lo)], guard)
            << "write before an output (" << (kGuard - i) << " elements before it) on " << t->device().str();
        ASSERT_EQ(bits[static_cast<size_t>(hi)], guard)
            << "write after an output (element " << (g.numel + i) << " of " << g.numel << ") on " << t->device().str();
      }
    }
  }
}

void OpCheck::expect_close(const Pair& p, double atol, double rtol, const std::string& what) {
  if (perf_iterations()) return;  // perf mode compares nothing (accumulating ops ran many times)
  check_guards();
  ASSERT_EQ(p.ref.numel(), p.dut.numel()) << what;
  ASSERT_EQ(p.ref.dtype(), p.dut.dtype()) << what;
  const int64_t n = p.ref.numel();
  int64_t bad = 0, first = -1;
  double worst = 0.0;
  std::ostringstream first_msg;
  if (p.ref.dtype() == DType::i32 || p.ref.dtype() == DType::u8) {
    const auto r = p.ref.to_ints(), d = p.dut.to_ints();
    for (int64_t i = 0; i < n; ++i) {
      if (r[static_cast<size_t>(i)] != d[static_cast<size_t>(i)]) {
        if (bad++ == 0) {
          first = i;
          first_msg << "ref " << r[static_cast<size_t>(i)] << ", " << p.dut.device().str() << " "
                    << d[static_cast<size_t>(i)];
        }
      }
    }
  } else {
    // bf16 elements are widened exactly: atol = rtol = 0 is still bitwise (NaN by class).
    const auto r = host_floats(p.ref), d = host_floats(p.dut);
    for (int64_t i = 0; i < n; ++i) {
      const double a = r[static_cast<size_t>(i)], b = d[static_cast<size_t>(i)];
      bool ok;
      if (std::isnan(a) || std::isnan(b))
        ok = std::isnan(a) && std::isnan(b);
      else if (std::isinf(a) || std::isinf(b))
        ok = a == b;
      else {
        const double err = std::fabs(a - b);
        worst = std::max(worst, err);
        ok = err <= atol + rtol * std::fabs(a);
      }
      if (!ok && bad++ == 0) {
        first = i;
        first_msg.precision(9);
        first_msg << "ref " << a << ", " << p.dut.device().str() << " " << b;
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << " " << p.ref.shape().str() << ": " << bad << " of " << n
                    << " elements differ beyond atol " << atol << " + rtol " << rtol << "; first at flat index "
                    << first << " (" << first_msg.str() << "); max abs error " << worst;
}

void OpCheck::expect_gradient(const std::string& what, const Pair& x, const Pair& dx,
                              const std::function<double(Backend&)>& loss, const GradOptions& opt) {
  if (perf_iterations()) return;
  ASSERT_EQ(x.dut.shape(), dx.dut.shape()) << what;
  Tensor target = x.dut;  // a handle on the same storage, to write the perturbed values into
  const int64_t n = x.dut.numel();
  std::vector<float> host = x.dut.to_vector();
  const std::vector<float> grad = dx.dut.to_vector();
  const int64_t count = std::min<int64_t>(n, 48);
  int bad = 0;
  std::ostringstream first;
  for (int64_t j = 0; j < count; ++j) {
    const int64_t i = count == 1 ? 0 : j * (n - 1) / (count - 1);
    const float saved = host[static_cast<size_t>(i)];
    const float up = static_cast<float>(saved + opt.eps), down = static_cast<float>(saved - opt.eps);
    host[static_cast<size_t>(i)] = up;
    target.copy_from(Tensor::from_vector(host, x.dut.shape()));
    const double lp = loss(dut_);
    host[static_cast<size_t>(i)] = down;
    target.copy_from(Tensor::from_vector(host, x.dut.shape()));
    const double lm = loss(dut_);
    host[static_cast<size_t>(i)] = saved;
    const double numeric = (lp - lm) / (static_cast<double>(up) - static_cast<double>(down));
    const double a = grad[static_cast<size_t>(i)];
    if (!(std::fabs(numeric - a) <= opt.atol + opt.rtol * std::fabs(numeric)) && bad++ == 0)
      first << "element " << i << ": " << dut_.device().str() << " " << a << " vs numeric " << numeric;
  }
  target.copy_from(Tensor::from_vector(host, x.dut.shape()));
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << count << " checked elements differ from central differences"
                    << " (eps " << opt.eps << ", atol " << opt.atol << ", rtol " << opt.rtol
                    << "); first: " << first.str();
}

double dot(const Tensor& a, const Tensor& b) {
  const auto va = a.to_vector(), vb = b.to_vector();
  double s = 0.0;
  for (size_t i = 0; i < va.size(); ++i) s += static_cast<double>(va[i]) * vb[i];
  return s;
}

std::vector<const OpCase*>& op_cases() {
  static std::vector<const OpCase*> cases;
  return cases;
}

void register_op_case(const std::string& family, const std::string& name, std::function<void(OpCheck&)> fn) {
  static std::deque<OpCase> storage;  // stable addresses, destroyed at exit (no leak report)
  storage.push_back(OpCase{family, name, std::move(fn)});
  op_cases().push_back(&storage.back());
}

OpCaseRegistrar::OpCaseRegistrar(const char* family, const char* name, void (*fn)(OpCheck&)) {
  register_op_case(family, name, fn);
}

Pair aligned_bf16_output(OpCheck& t, const Shape& s) {
  return t.values_bf16(std::vector<float>(static_cast<size_t>(s.numel()), std::numeric_limits<float>::quiet_NaN()), s);
}

std::vector<uint16_t> dut_bits(const Tensor& t) {
  const Tensor h = t.to(Device::cpu());
  std::vector<uint16_t> out(static_cast<size_t>(h.numel()));
  if (h.dtype() == DType::bf16) {
    for (int64_t i = 0; i < h.numel(); ++i) out[static_cast<size_t>(i)] = h.bf16()[i];
  } else {
    for (int64_t i = 0; i < h.numel(); ++i) out[static_cast<size_t>(i)] = bf16_from_float(h.f32()[i]);
  }
  return out;
}

void expect_rounded_dut(const Pair& h, const Pair& f, const std::string& what) {
  if (perf_iterations()) return;
  const auto a = dut_bits(h.dut), b = dut_bits(f.dut);
  ASSERT_EQ(a.size(), b.size()) << what;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool nan_a = (a[i] & 0x7fffu) > 0x7f80u, nan_b = (b[i] & 0x7fffu) > 0x7f80u;
    if (nan_a && nan_b) continue;
    if (a[i] != b[i] && bad++ == 0) first = static_cast<int64_t>(i);
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << a.size()
                    << " elements differ from the device's fp32 result rounded to bf16; first at " << first;
}

void expect_same_dut_f32(const Pair& a, const Pair& b, const std::string& what) {
  if (perf_iterations()) return;
  const auto x = a.dut.to_vector(), y = b.dut.to_vector();
  ASSERT_EQ(x.size(), y.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i)
    bad += !(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i]))) || std::signbit(x[i]) != std::signbit(y[i]);
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << x.size() << " f32 elements differ between bf16 and fp32 runs";
}

}  // namespace remat::test
