// Limits of one render, for templates that come with a checkpoint and so are untrusted code: a
// template must not crash (stack overflow), stall or exhaust the memory of the server rendering
// it. Each limit exceeded throws LimitError naming it (error.h).
//
// The defaults sit far above what real chat templates use: DeepSeek-V3's template nests under
// 25 deep, calls no macro, and renders a conversation in about 70 steps a message (2,000
// messages: 135,000 steps, a few ms); Kimi K2's and GLM-4.7-Flash's are of the same kind (a loop
// over the messages, a few macros, no recursion). The worst a template can do within them
// costs a second or two and some hundreds of MiB.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mla::jinja {

struct Limits {
  // Nesting of expressions and statements: the depth of the parsed tree (parentheses, operators,
  // filters, nested if/for ...) and, while rendering, of the evaluation including the bodies of
  // the macros being called. Bounds the interpreter's stack (a few KiB a level).
  size_t max_depth = 256;
  // Macro calls in progress at once: a macro calling itself stops here.
  size_t max_call_depth = 64;
  // Bytes of the rendered text (and of each {% set %} / {% filter %} block's captured text).
  size_t max_output_bytes = size_t{64} << 20;
  // Bytes of one string a template builds: "a" * n, concatenation (+, ~), join, replace, format,
  // indent, tojson, and the printed form of a value.
  size_t max_string_bytes = size_t{64} << 20;
  // Items of one list a template builds: range(), list * n, list + list.
  size_t max_list_items = size_t{1} << 20;
  // Work of one render: one step per expression evaluated, statement rendered, item iterated and
  // comparison made by sort / unique, and kLoopIterationSteps per iteration of a for loop.
  uint64_t max_steps = 10'000'000;
};

// Steps one for-loop iteration counts (its loop variable and frame cost about as much as ten
// expressions), so max_steps bounds the time of a loop as it bounds that of expressions.
inline constexpr uint64_t kLoopIterationSteps = 10;

// Nesting of lists and dicts that printing, comparing and serialising a value follow: a list
// appended to itself stops here instead of recursing without end.
inline constexpr size_t kMaxValueDepth = 256;

}  // namespace mla::jinja
