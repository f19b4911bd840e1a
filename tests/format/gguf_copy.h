// Copying a GGUF file read by format/gguf.h through the test writer (gguf_builder.h), so a test
// can make a changed copy of a real file: its metadata (all but general.alignment, which the
// writer sets itself; every integer as i64, every float as f64) and, by the caller, its tensors.
#pragma once
#include <map>
#include <string>

#include "format/gguf.h"
#include "format/gguf_builder.h"

namespace mla::test {

inline void copy_metadata(const std::map<std::string, GgufValue>& meta, GgufBuilder& b) {
  for (const auto& [k, v] : meta) {
    if (k == "general.alignment") continue;
    using K = GgufValue::Kind;
    if (v.kind == K::String) b.add_string(k, v.s);
    else if (v.kind == K::Float) b.add_f64(k, v.f);
    else if (v.kind == K::Bool) b.add_bool(k, v.b);
    else if (v.kind == K::Int) b.add_i64(k, v.i);
    else if (v.elem == K::String) b.add_string_array(k, v.strings);
    else if (v.elem == K::Float) b.add_array<double>(k, GgufBuilder::F64, v.floats);
    else b.add_array<int64_t>(k, GgufBuilder::I64, v.ints);
  }
}

}  // namespace mla::test
