// libFuzzer target: the .npy reader (parse_npy, npy_dataset). The invariants are in
// harness.h.
#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  remat::fuzz::run_npy_input(data, size);
  return 0;
}
