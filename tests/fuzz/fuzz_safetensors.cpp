// libFuzzer target: the safetensors parser (SafetensorsFile::parse and tensor()). The
// invariants are in harness.h.
#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  remat::fuzz::run_safetensors_input(data, size);
  return 0;
}
