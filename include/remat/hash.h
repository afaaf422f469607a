// 64-bit FNV-1a, the one byte hash remat uses where a stable, platform-independent hash is
// needed: --verify-recompute's tensor hashes, a config's hash in a checkpoint, the corpus's
// split of sources and its catalogs' fingerprints.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace remat {

inline uint64_t fnv1a64(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t x = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) {
    x ^= p[i];
    x *= 0x100000001b3ull;
  }
  return x;
}
inline uint64_t fnv1a64(const std::string& s) { return fnv1a64(s.data(), s.size()); }

}  // namespace remat
