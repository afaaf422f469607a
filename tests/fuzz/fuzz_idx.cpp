// libFuzzer target: the IDX reader (parse_idx, idx_dataset, image_batch). The input layout
// and the invariants are in harness.h.
#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  remat::fuzz::run_idx_input(data, size);
  return 0;
}
