// llm.c token shards: header validation, memory-mapped sets of shards, windows and the
// split by file name.
#include "remat/token_shards.h"

#include <glob.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstring>
#include <filesystem>

#include "data/token_batch.h"
#include "remat/error.h"
#include "remat/memory.h"

namespace remat {

namespace fs = std::filesystem;

namespace {

int32_t le_i32(const unsigned char* p) {
  const uint32_t u = uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
  int32_t v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

inline int32_t le_u16(const unsigned char* p) { return static_cast<int32_t>(p[0] | (p[1] << 8)); }

}  // namespace

using data_detail::to_device;

int64_t check_token_shard(const unsigned char* bytes, size_t size, const std::string& name) {
  auto bad = [&](const std::string& msg) -> void { REMAT_THROW(name, ": not a token shard: ", msg); };
  if (size < kShardHeaderBytes)
    bad("the file is " + std::to_string(size) + " bytes, shorter than the header of " +
        std::to_string(kShardHeaderInts) + " int32 (" + std::to_string(kShardHeaderBytes) + " bytes); truncated?");
  const int32_t magic = le_i32(bytes), version = le_i32(bytes + 4), count = le_i32(bytes + 8);
  if (magic == kShardMagicLlama3)
    bad("header field 0 (magic) is " + std::to_string(magic) + ", llm.c's shards of uint32 tokens (LLaMA 3); only " +
        std::to_string(kShardMagic) + " (GPT-2, uint16 tokens) is supported");
  if (magic != kShardMagic)
    bad("header field 0 (magic) is " + std::to_string(magic) + ", expected " + std::to_string(kShardMagic) +
        " (llm.c's GPT-2 token shards)");
  if (version != kShardVersion)
    bad("header field 1 (version) is " + std::to_string(version) + ", expected " + std::to_string(kShardVersion));
  if (count <= 0) bad("header field 2 (token count) is " + std::to_string(count) + ", expected a positive count");
  for (int i = 3; i < kShardHeaderInts; ++i) {
    const int32_t v = le_i32(bytes + 4 * i);
    if (v != 0) bad("header field " + std::to_string(i) + " (reserved) is " + std::to_string(v) + ", expected 0");
  }
  const uint64_t expect = kShardHeaderBytes + 2 * static_cast<uint64_t>(count);
  if (size < expect)
    bad("the header says " + std::to_string(count) + " tokens (" + std::to_string(expect) + " bytes with the header) " +
        "but the file is " + std::to_string(size) + " bytes; truncated?");
  if (size > expect)
    bad("the header says " + std::to_string(count) + " tokens (" + std::to_string(expect) + " bytes with the header) " +
        "but the file is " + std::to_string(size) + " bytes; " + std::to_string(size - expect) +
        " bytes follow the tokens");
  return count;
}

TokenShards TokenShards::open(const std::vector<std::string>& files) {
  TokenShards s;
  for (const std::string& path : files) {
    auto map = std::make_shared<const MappedFile>(path);
    Part p;
    p.count = check_token_shard(map->data(), map->size(), path);
    p.name = path;
    p.tokens = map->data() + kShardHeaderBytes;
    p.holder = std::move(map);
    s.parts_.push_back(std::move(p));
  }
  return s;
}

TokenShards TokenShards::from_bytes(std::string bytes, const std::string& name) {
  auto owned = std::make_shared<const std::string>(std::move(bytes));
  const auto* data = reinterpret_cast<const unsigned char*>(owned->data());
  Part p;
  p.count = check_token_shard(data, owned->size(), name);
  p.name = name;
  p.tokens = data + kShardHeaderBytes;
  p.holder = std::move(owned);
  TokenShards s;
  s.parts_.push_back(std::move(p));
  return s;
}

TokenShards TokenShards::slice(int64_t begin, int64_t end) const {
  REMAT_CHECK(begin >= 0 && begin <= end && end <= tokens(), "TokenShards::slice: [", begin, ", ", end,
              ") is outside the ", tokens(), " tokens");
  TokenShards s;
  int64_t at = 0;  // index of the part's first token in the whole set
  for (const Part& p : parts_) {
    const int64_t b = std::max(begin, at), e = std::min(end, at + p.count);
    if (b < e) {
      Part q = p;
      q.tokens = p.tokens + 2 * (b - at);
      q.first = p.first + (b - at);
      q.count = e - b;
      s.parts_.push_back(std::move(q));
    }
    at += p.count;
  }
  return s;
}

int64_t TokenShards::tokens() const {
  int64_t n = 0;
  for (const Part& p : parts_) n += p.count;
  return n;
}

int64_t TokenShards::windows(int64_t seq_len) const {
  REMAT_CHECK(seq_len > 0, "TokenShards::windows: seq_len ", seq_len, " must be positive");
  int64_t n = 0;
  for (const Part& p : parts_) n += (p.count - 1) / seq_len;
  return n;
}

std::vector<std::string> TokenShards::files() const {
  std::vector<std::string> out;
  for (const Part& p : parts_)
    if (out.empty() || out.back() != p.name) out.push_back(p.name);
  return out;
}

Batch TokenShards::batch(const std::vector<int64_t>& indices, int64_t seq_len, int64_t vocab, Device device) const {
  REMAT_CHECK(seq_len > 0 && seq_len < INT32_MAX, "TokenShards::batch: seq_len ", seq_len, " is out of range");
  REMAT_CHECK(!indices.empty(), "TokenShards::batch: no windows");
  const int64_t total = windows(seq_len);
  const auto b = static_cast<int64_t>(indices.size());
  REMAT_CHECK(b <= INT64_MAX / (seq_len + 1), "TokenShards::batch: ", b, " windows of ", seq_len, " tokens overflow");
  // Window counts per part, for the lookup of each index.
  std::vector<int64_t> ends;
  int64_t acc = 0;
  for (const Part& p : parts_) ends.push_back(acc += (p.count - 1) / seq_len);

  TagScope scope(MemoryCategory::input, "data", Phase::setup);
  if (device.is_meta()) return data_detail::empty_token_batch(b, seq_len, device);
  const Batch host = data_detail::empty_token_batch(b, seq_len, Device::cpu());
  Tensor input = host.input(), targets = host.targets();
  int32_t* in = input.i32();
  int32_t* tg = targets.i32();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t w = indices[static_cast<size_t>(i)];
    REMAT_CHECK(w >= 0 && w < total, "TokenShards::batch: window ", w, " at position ", i, " is outside [0, ", total,
                ") windows of ", seq_len, " tokens");
    const size_t k = static_cast<size_t>(std::upper_bound(ends.begin(), ends.end(), w) - ends.begin());
    const Part& p = parts_[k];
    const int64_t start = (w - (k ? ends[k - 1] : 0)) * seq_len;  // in the part
    const unsigned char* src = p.tokens + 2 * start;
    for (int64_t t = 0; t <= seq_len; ++t) {
      const int32_t tok = le_u16(src + 2 * t);
      if (tok >= vocab)
        REMAT_THROW(p.name, ": token ", p.first + start + t, " is ", tok, ", outside the model's vocabulary of ",
                    vocab);
      if (t < seq_len) in[i * seq_len + t] = tok;
      if (t > 0) tg[i * seq_len + t - 1] = tok;
    }
  }
  return {to_device(input, device), to_device(targets, device)};
}

std::vector<std::string> find_token_shards(const std::string& path) {
  REMAT_CHECK(!path.empty(), "token_shards: no path given (set data.path or pass --data)");
  std::vector<std::string> out;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.path().extension() == ".bin" && e.is_regular_file(ec)) out.push_back(e.path().string());
    if (ec) REMAT_THROW("cannot list ", path, ": ", ec.message());
    if (out.empty()) REMAT_THROW(path, ": the folder holds no token shards (*.bin files)");
  } else if (fs::exists(path, ec)) {
    out.push_back(path);
  } else {
    glob_t g{};
    const int rc = ::glob(path.c_str(), 0, nullptr, &g);
    if (rc == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) out.push_back(g.gl_pathv[i]);
    globfree(&g);
    if (rc == GLOB_NOMATCH || (rc == 0 && out.empty()))
      REMAT_THROW(path, ": no such file, and no file matches it as a pattern");
    if (rc != 0) REMAT_THROW(path, ": cannot expand the pattern (glob error ", rc, ")");
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool is_val_shard_name(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  std::string word;
  for (size_t i = 0; i <= name.size(); ++i) {
    const char c = i < name.size() ? name[i] : '\0';
    if (std::isalpha(static_cast<unsigned char>(c))) {
      word.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
      continue;
    }
    if (word == "val") return true;
    word.clear();
  }
  return false;
}

ShardSplit split_token_shards(const std::vector<std::string>& files) {
  ShardSplit s;
  for (const std::string& f : files) (is_val_shard_name(f) ? s.val : s.train).push_back(f);
  return s;
}

namespace {

std::string describe_set(const char* what, const TokenShards& s) {
  const auto f = s.files();
  std::string out = std::string(what) + " " + std::to_string(s.tokens()) + " tokens in " + std::to_string(f.size()) +
                    (f.size() == 1 ? " file" : " files");
  if (!f.empty()) out += " (" + f.front() + (f.size() > 1 ? " ... " + f.back() : std::string()) + ")";
  return out;
}

}  // namespace

TokenShardData load_token_shard_data(const std::string& path, double eval_fraction) {
  const ShardSplit split = split_token_shards(find_token_shards(path));
  if (split.train.empty())
    REMAT_THROW(path, ": all ", split.val.size(),
                " shard(s) are validation shards (their names have the word "
                "\"val\"); training needs at least one other");
  TokenShardData d;
  if (!split.val.empty()) {
    d.train = TokenShards::open(split.train);
    d.eval = TokenShards::open(split.val);
  } else {
    const TokenShards all = TokenShards::open(split.train);
    const int64_t n = all.tokens();
    const auto n_eval = static_cast<int64_t>(static_cast<double>(n) * eval_fraction);
    d.train = all.slice(0, n - n_eval);
    d.eval = all.slice(n - n_eval, n);
  }
  d.describe =
      describe_set("train:", d.train) + "; eval: " +
      (split.val.empty() ? "the last " + std::to_string(d.eval.tokens()) + " tokens of those (no file named val)"
                         : describe_set("", d.eval).substr(1));
  return d;
}

TokenShards load_eval_token_shards(const std::string& path, std::string* describe) {
  std::error_code ec;
  std::vector<std::string> files = find_token_shards(path);
  if (!fs::is_regular_file(path, ec)) {
    ShardSplit split = split_token_shards(files);
    if (!split.val.empty()) files = split.val;
  }
  TokenShards s = TokenShards::open(files);
  if (describe) *describe = describe_set("", s).substr(1);
  return s;
}

}  // namespace remat
