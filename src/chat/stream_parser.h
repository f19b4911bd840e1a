// The interface of the server's streaming output parsers (reasoning_parser.h, tool_parser.h):
// model text in fragments of any size (split anywhere, inside a marker or a UTF-8 character),
// deltas out.
#pragma once
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace mla::chat {

// One per request. feed() and finish() append deltas to out; they never throw on any model
// output. After finish() the parser takes no more text.
template <class Delta>
class StreamParser {
 public:
  virtual ~StreamParser() = default;
  virtual void feed(std::string_view text, std::vector<Delta>& out) = 0;
  virtual void finish(std::vector<Delta>& out) = 0;
  virtual std::string_view name() const = 0;

  // The deltas of a whole output: exactly what feed(text) and finish() stream.
  std::vector<Delta> parse_whole(std::string_view text) {
    std::vector<Delta> deltas;
    feed(text, deltas);
    finish(deltas);
    return deltas;
  }
};

// The error of a factory asked for a parser it does not know: "unknown <kind> 'name' (known: a, b)".
inline std::invalid_argument unknown_parser(std::string_view kind, std::string_view name,
                                            const std::vector<std::string>& known) {
  std::string list;
  for (const std::string& n : known) list += (list.empty() ? "" : ", ") + n;
  return std::invalid_argument("unknown " + std::string(kind) + " '" + std::string(name) + "' (known: " + list + ")");
}

}  // namespace mla::chat
