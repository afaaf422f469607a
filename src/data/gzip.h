// Bounded gzip decompression for the data readers (private to src/data).
#pragma once

#include <cstddef>
#include <string>

namespace remat::detail {

// True when `bytes` starts with the gzip magic 1f 8b.
bool is_gzip(const std::string& bytes);

// Inflates a gzip stream (one or more members, CRC and length checked by zlib). The output
// buffer grows with what has actually been inflated, so a small stream never causes a large
// allocation. With stop_at_limit the first `limit` bytes are returned (or all, if fewer);
// without it a stream that inflates to more than `limit` bytes is an error. Errors name
// `name`.
std::string gunzip(const std::string& in, size_t limit, const std::string& name, bool stop_at_limit = false);

// "1 GiB", "12 MiB", "300 bytes": sizes in messages.
std::string describe_bytes(size_t n);

}  // namespace remat::detail
