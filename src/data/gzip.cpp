#include "data/gzip.h"

#include <zlib.h>

#include <algorithm>

#include "remat/error.h"

namespace remat::detail {

namespace {

// zlib counts in uInt; feed it at most this much at a time.
constexpr size_t kZChunk = size_t{1} << 30;

class Inflater {
 public:
  explicit Inflater(const std::string& name) : name_(name) {
    // 16 + MAX_WBITS: expect a gzip wrapper (and check its CRC-32 and length).
    if (inflateInit2(&zs_, 16 + MAX_WBITS) != Z_OK) REMAT_THROW(name_, ": cannot initialise zlib");
  }
  ~Inflater() { inflateEnd(&zs_); }
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;
  z_stream& stream() { return zs_; }

 private:
  z_stream zs_{};
  const std::string& name_;
};

}  // namespace

bool is_gzip(const std::string& bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
         static_cast<unsigned char>(bytes[1]) == 0x8b;
}

std::string describe_bytes(size_t n) {
  if (n >= (size_t{1} << 30) && n % (size_t{1} << 30) == 0) return std::to_string(n >> 30) + " GiB";
  if (n >= (size_t{1} << 20) && n % (size_t{1} << 20) == 0) return std::to_string(n >> 20) + " MiB";
  return std::to_string(n) + " bytes";
}

std::string gunzip(const std::string& in, size_t limit, const std::string& name, bool stop_at_limit) {
  Inflater inflater(name);
  z_stream& zs = inflater.stream();
  // Without stop_at_limit, room for one byte more than the limit tells "too long" apart.
  const size_t cap = stop_at_limit ? limit : (limit == SIZE_MAX ? limit : limit + 1);
  std::string out;
  size_t produced = 0;
  size_t in_pos = 0;
  int members = 0;
  for (;;) {
    if (zs.avail_in == 0 && in_pos < in.size()) {
      const size_t n = std::min(in.size() - in_pos, kZChunk);
      zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data() + in_pos));
      zs.avail_in = static_cast<uInt>(n);
      in_pos += n;
    }
    if (produced == out.size()) {
      if (produced == cap) {
        if (stop_at_limit) return out;
        REMAT_THROW(name, ": gzip stream inflates to more than ", describe_bytes(limit),
                    limit == SIZE_MAX ? "" : " (the most this file may hold)");
      }
      out.resize(std::min(cap, std::max<size_t>(size_t{64} << 10, out.size() * 2)));
    }
    const size_t room = std::min(out.size() - produced, kZChunk);
    zs.next_out = reinterpret_cast<Bytef*>(&out[produced]);
    zs.avail_out = static_cast<uInt>(room);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    produced += room - zs.avail_out;
    if (rc == Z_STREAM_END) {
      ++members;
      if (zs.avail_in == 0 && in_pos == in.size()) break;
      // More input: another gzip member follows (as `cat a.gz b.gz` makes).
      if (inflateReset(&zs) != Z_OK) REMAT_THROW(name, ": cannot reset zlib");
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && zs.avail_out > 0) {
      REMAT_THROW(name, ": gzip stream is truncated (", in.size(), " compressed bytes end inside member ", members + 1,
                  " after ", produced, " inflated bytes)");
    }
    if (rc == Z_BUF_ERROR) continue;  // output full: grow at the top of the loop
    REMAT_THROW(name, ": gzip stream is corrupt in member ", members + 1, " after ", produced,
                " inflated bytes: ", zs.msg ? zs.msg : "zlib error " + std::to_string(rc));
  }
  out.resize(produced);
  return out;
}

}  // namespace remat::detail
