// How deeply a JSON text nests, found without parsing it: values are later copied, dumped and
// rendered by recursive code (nlohmann's dump, the Jinja interpreter), so whatever takes JSON
// from outside (a request body, tool-call arguments in a string, a model's output) checks this
// first and refuses or keeps as text what nests deeper than kMaxJsonDepth.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace mla {

// The most levels of nested arrays and objects the engine takes from outside.
inline constexpr size_t kMaxJsonDepth = 64;

// The deepest nesting of arrays and objects in a JSON text (strings skipped; not validated);
// stops at the first level past stop_at, its byte offset in *offset.
inline size_t json_nesting_depth(std::string_view text, size_t stop_at = SIZE_MAX, size_t* offset = nullptr) {
  size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
      if (deepest > stop_at) {
        if (offset) *offset = i;
        return deepest;
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

// Whether the text nests no deeper than kMaxJsonDepth.
inline bool json_depth_ok(std::string_view text) { return json_nesting_depth(text, kMaxJsonDepth) <= kMaxJsonDepth; }

}  // namespace mla
