// libFuzzer target: llm.c token shards (TokenShards::from_bytes, windows and batches). The
// invariants are in harness.h.
#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  remat::fuzz::run_token_shard_input(data, size);
  return 0;
}
