// A safetensors file from the fuzzer's bytes: the 8-byte header length, the JSON header
// (dtypes, shapes, offsets, metadata) and the data. Opening either validates all of it
// (FormatError) or gives tensors that lie inside the mapping; every one is read in full.
#include <cstdint>
#include <cstring>

#include "format/error.h"
#include "format/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 20)) return 0;
  const std::string path = mla::fuzz::write_file("model.safetensors", data, size);
  try {
    mla::SafetensorsFile f(path);
    uint64_t sum = 0;
    for (const auto& [name, t] : f.tensors()) {
      if (t.nbytes && (t.data < f.mapping() || t.data + t.nbytes > f.mapping() + f.mapping_size())) __builtin_trap();
      for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
      (void)t.numel();
      (void)t.shape_str();
    }
    volatile uint64_t keep = sum;
    (void)keep;
  } catch (const mla::FormatError&) {
  }
  return 0;
}
