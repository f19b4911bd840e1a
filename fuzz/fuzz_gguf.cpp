// A GGUF file from the fuzzer's bytes: header, metadata of every value type, tensor records and
// data. Opening it validates all of it (FormatError) or gives values and tensors that lie inside
// the mapping; every value is walked and every tensor byte read.
#include <cstdint>
#include <cstring>

#include "format/error.h"
#include "format/gguf.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 20)) return 0;
  const std::string path = mla::fuzz::write_file("model.gguf", data, size);
  try {
    mla::GgufFile f(path);
    uint64_t sum = f.version() + f.alignment();
    for (const auto& [key, v] : f.metadata()) {
      sum += key.size() + v.size() + uint64_t(v.i) + uint64_t(v.b) + v.s.size() + uint64_t(v.type);
      for (int64_t i : v.ints) sum += uint64_t(i);
      for (double x : v.floats) sum += x == x ? 1 : 0;
      for (const std::string& s : v.strings) sum += s.size();
      if (v.kind != mla::GgufValue::Kind::Array && v.size() != 1) __builtin_trap();
    }
    // The typed reads throw FormatError for a value of another kind, never anything else.
    for (const auto& [key, v] : f.metadata()) {
      try { sum += uint64_t(f.get_int(key).value_or(0)); } catch (const mla::FormatError&) {}
      try { sum += f.get_string(key).value_or("").size(); } catch (const mla::FormatError&) {}
      try { sum += uint64_t(f.get_float(key).value_or(0) != 0); } catch (const mla::FormatError&) {}
      try { sum += uint64_t(f.get_bool(key).value_or(false)); } catch (const mla::FormatError&) {}
    }
    // One part (the name is no split set's), mapped whole: every tensor lies inside it.
    if (f.parts().size() != 1 || f.mapping_size(0) != size) __builtin_trap();
    const uint8_t* map = f.mapping(0);
    size_t total = 0;
    for (const auto& [name, t] : f.tensors()) {
      auto info = mla::ggml_type_info(t.type);
      if (!info || t.ne.empty() || t.ne.size() > 4 || t.ne[0] % info->values != 0) __builtin_trap();
      if (t.nbytes && (t.data < map || t.nbytes > size || t.data + t.nbytes > map + size)) __builtin_trap();
      for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
      total += t.nbytes;
      (void)t.shape_str();
    }
    if (total != f.total_bytes() || total > size) __builtin_trap();
    volatile uint64_t keep = sum;
    (void)keep;
  } catch (const mla::FormatError&) {
  }
  return 0;
}
