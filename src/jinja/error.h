// Errors of the Jinja interpreter: syntax errors, errors a template raises while rendering, and
// the limits of limits.h when a template goes past one. Messages name the line and column.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace mla::jinja {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The limit a template went past (see Limits in limits.h for what each one bounds).
enum class Limit { Depth, CallDepth, OutputBytes, StringBytes, ListItems, Steps };

// The name of the Limits field, as the error message shows it: "max_depth", "max_steps" ...
const char* limit_name(Limit limit);

// A template that went past one of its limits: treated as untrusted code, it is stopped here
// instead of exhausting the stack, the memory or the time of the process rendering it.
class LimitError : public Error {
 public:
  LimitError(Limit limit, size_t value, const std::string& where);
  Limit limit() const { return limit_; }
  size_t value() const { return value_; }  // the limit's setting that was exceeded

 private:
  Limit limit_;
  size_t value_;
};

}  // namespace mla::jinja
