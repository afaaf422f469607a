// Token shards in llm.c's format (data.dataset "token_shards"): a header of 256
// little-endian int32 (magic 20240520, version 1, the token count, then 253 reserved
// zeros) followed by the tokens as little-endian uint16. Files are memory-mapped, never
// read whole; a batch copies its windows out of the mapping.
//
// Every header field is checked against the file before a token is read, and each error
// names the file and the field, e.g.
//   data/x_train_000001.bin: header field 0 (magic) is 20240801, expected 20240520 ...
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "remat/data.h"
#include "remat/io.h"

namespace remat {

constexpr int kShardHeaderInts = 256;
constexpr size_t kShardHeaderBytes = kShardHeaderInts * 4;
constexpr int32_t kShardMagic = 20240520;  // llm.c's GPT-2 shards (uint16 tokens)
constexpr int32_t kShardVersion = 1;
constexpr int32_t kShardMagicLlama3 = 20240801;  // llm.c's uint32 shards: recognised, refused

// Validates the bytes of one shard file (header and size) and returns its token count.
// `bytes` may be a mapping or a buffer; `name` is used in the messages.
int64_t check_token_shard(const unsigned char* bytes, size_t size, const std::string& name);

// A set of shards, each a mapped file or a part of one, read as one sequence of windows.
// Window w of a part is tokens [w*T, w*T + T) with targets shifted by one token (llm.c
// reads B*T + 1 tokens for B*T targets); windows never span two parts, so a part of n
// tokens has (n - 1) / T windows.
class TokenShards {
 public:
  TokenShards() = default;
  // Maps and validates every file (in the given order).
  static TokenShards open(const std::vector<std::string>& files);
  // One shard from bytes in memory (tests and the fuzz target).
  static TokenShards from_bytes(std::string bytes, const std::string& name);

  // Tokens [begin, end) of the whole set, in file order: a part of it (held-out tails).
  TokenShards slice(int64_t begin, int64_t end) const;

  int64_t tokens() const;
  int64_t windows(int64_t seq_len) const;
  std::vector<std::string> files() const;  // the files with tokens in this set, in order
  // The windows `indices` (each in [0, windows(seq_len))) as a text batch: input [B, T]
  // and targets [B * T] i32. A token >= vocab is an error naming the file and position.
  Batch batch(const std::vector<int64_t>& indices, int64_t seq_len, int64_t vocab, Device device) const;

 private:
  struct Part {
    std::shared_ptr<const void> holder;  // the MappedFile or buffer `tokens` points into
    std::string name;
    const unsigned char* tokens = nullptr;  // little-endian uint16
    int64_t first = 0;                      // index of tokens[0] in its file
    int64_t count = 0;
  };
  std::vector<Part> parts_;
};

// The shard files of `path`: a file, a folder (its *.bin files) or a glob pattern, sorted
// by name. An empty match is an error naming the path.
std::vector<std::string> find_token_shards(const std::string& path);

// llm.c's split by file name: a file whose name has the word "val" (split at anything but
// letters: fineweb_val_000000.bin, tiny_shakespeare_val.bin, val.bin) is validation data,
// every other file training data.
struct ShardSplit {
  std::vector<std::string> train, val;
};
ShardSplit split_token_shards(const std::vector<std::string>& files);
bool is_val_shard_name(const std::string& path);

// What data.dataset "token_shards" trains and evaluates on, from data.path: the training
// shards and the validation shards by name; when there is no validation shard, the last
// eval_fraction of the training tokens is held out instead (as for "text").
struct TokenShardData {
  TokenShards train, eval;
  std::string describe;  // one line: files and token counts of each side
};
TokenShardData load_token_shard_data(const std::string& path, double eval_fraction);
// What `remat eval --data PATH` evaluates on: the file itself, whatever its name; of a
// folder or pattern, its validation shards, or all of them when none is one.
TokenShards load_eval_token_shards(const std::string& path, std::string* describe = nullptr);

}  // namespace remat
