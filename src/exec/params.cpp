// Parameter storage and initialisation. Values are drawn on the host from Philox with a
// seed derived from the run's seed, so every device starts from the same weights.
#include <cmath>

#include "remat/error.h"
#include "remat/params.h"
#include "remat/philox.h"

namespace remat {

namespace {

constexpr uint64_t kInitStream = 0x1a2b3c4d5e6f7788ull;  // separates init draws from dropout draws

void init_values(const ParamSpec& spec, uint64_t seed, uint64_t& offset, std::vector<float>& v) {
  const size_t n = static_cast<size_t>(spec.shape.numel());
  v.assign(n, 0.0f);
  const uint64_t s = seed ^ kInitStream;
  switch (spec.init) {
    case Init::zeros: break;
    case Init::ones: std::fill(v.begin(), v.end(), 1.0f); break;
    case Init::uniform:
      for (size_t i = 0; i < n; ++i) {
        const float u = philox::uniform(philox::word(s, offset + i));  // (0, 1]
        v[i] = (2.0f * u - 1.0f) * spec.scale;
      }
      offset += (n + 3) / 4 * 4;
      break;
    case Init::normal:
      // Box-Muller on pairs of uniforms.
      for (size_t i = 0; i < n; ++i) {
        const double u1 = philox::uniform(philox::word(s, offset + 2 * i));
        const double u2 = philox::uniform(philox::word(s, offset + 2 * i + 1));
        v[i] = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2) * spec.scale);
      }
      offset += (2 * n + 3) / 4 * 4;
      break;
  }
}

// Philox words each initialisation draws: uniform one per value, normal two (Box-Muller),
// rounded up to whole Philox blocks of four.
uint64_t init_words(const ParamSpec& spec) {
  const auto n = static_cast<uint64_t>(spec.shape.numel());
  if (spec.init == Init::uniform) return (n + 3) / 4 * 4;
  if (spec.init == Init::normal) return (2 * n + 3) / 4 * 4;
  return 0;
}

}  // namespace

ParamStore::ParamStore(const Graph& g, Device device, uint64_t seed, bool initialise_values)
    : graph_(&g), device_(device), precision_(activation_dtype()), seed_(seed) {
  values.resize(g.params.size());
  grads.resize(g.params.size());
  state.resize(g.params.size());
  offsets_.resize(g.params.size());
  if (precision_ == DType::bf16) working.resize(g.params.size());
  uint64_t offset = 0;
  for (size_t p = 0; p < g.params.size(); ++p) {
    const GraphParam& gp = g.params[p];
    offsets_[p] = offset;  // a parameter's draws start where the previous one's end
    offset += init_words(gp.spec);
    {
      TagScope scope(MemoryCategory::parameter, gp.name, Phase::setup);
      values[p] = Tensor::empty(gp.spec.shape, device);
    }
    if (initialise_values) initialise(p);
    if (precision_ == DType::bf16 && gp.spec.trainable) {
      TagScope scope(MemoryCategory::parameter, gp.name, Phase::setup);
      working[p] = Tensor::empty(gp.spec.shape, device, DType::bf16);
    }
    if (gp.spec.trainable) {
      TagScope scope(MemoryCategory::gradient, gp.name, Phase::setup);
      grads[p] = Tensor::zeros(gp.spec.shape, device);
    }
  }
}

void ParamStore::initialise(size_t p) {
  REMAT_CHECK(p < values.size(), "ParamStore::initialise: parameter ", p, " of ", values.size());
  if (device_.is_meta()) return;  // no data
  const GraphParam& gp = graph_->params[p];
  uint64_t offset = offsets_[p];
  std::vector<float> host;
  init_values(gp.spec, seed_, offset, host);
  if (device_.is_cpu())
    std::copy(host.begin(), host.end(), values[p].f32());
  else
    values[p].copy_from(Tensor::from_vector(host, gp.spec.shape));
}

void ParamStore::refresh_working(Backend& be) {
  std::vector<Tensor> src, dst;
  for (size_t p = 0; p < working.size(); ++p)
    if (working[p].defined()) {
      src.push_back(values[p]);
      dst.push_back(working[p]);
    }
  if (!src.empty()) be.cast_multi(src, dst);  // each master rounded once to bf16, many per launch
}

void ParamStore::zero_grads(Backend& be) {
  (void)be;
  for (Tensor& g : grads)
    if (g.defined()) g.zero_();
}

std::vector<std::pair<std::string, Tensor>> ParamStore::named_values() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t p = 0; p < values.size(); ++p) out.emplace_back(graph_->params[p].name, values[p]);
  return out;
}

}  // namespace remat
