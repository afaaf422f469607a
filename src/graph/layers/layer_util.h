// What the built-in layers (one file per family in this folder) share: input checks,
// config helpers, and REMAT_REGISTER_LAYER, which registers a layer type before main()
// (the library is linked whole, so every layer file is part of every program).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "remat/config.h"
#include "remat/error.h"
#include "remat/graph.h"
#include "remat/ops.h"

namespace remat::layers {

inline double numel_of(const Shape& s) { return static_cast<double>(s.numel()); }

inline void expect_inputs(const std::vector<Shape>& in, size_t n) {
  REMAT_CHECK(in.size() == n, "expected ", n, " input(s), got ", in.size());
}

// A config key that is one integer or a list of two ([h, w]); `def` when absent.
std::pair<int, int> int_or_pair(ConfigReader& r, const std::string& key, int def, int min);

// Registers a built-in type (a duplicate name is a programming error: it throws).
bool register_builtin(const char* type, LayerFactory factory);

}  // namespace remat::layers

// REMAT_REGISTER_LAYER("linear", Linear): layer type "linear" is built by Linear(ConfigReader&).
#define REMAT_REGISTER_LAYER(type, L)                                                                \
  [[maybe_unused]] static const bool remat_layer_registered_##L = ::remat::layers::register_builtin( \
      type, [](::remat::ConfigReader& r) -> std::unique_ptr<::remat::Layer> { return std::make_unique<L>(r); })
