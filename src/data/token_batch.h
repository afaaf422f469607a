// What the text reader (batch.cpp) and the token-shard reader (token_shards.cpp) share
// to build a batch of token windows: tensors made on the host, then moved to the device.
#pragma once

#include <cstdint>

#include "remat/data.h"

namespace remat::data_detail {

// Tensors of a batch are built on the host; for cuda they are then copied over, and for
// meta only allocated (meta holds no data). No copy for cpu.
Tensor to_device(const Tensor& host, Device device);

// An unfilled token batch on `on`: input and targets [b, seq_len], i32.
Batch empty_token_batch(int64_t b, int64_t seq_len, Device on);

}  // namespace remat::data_detail
