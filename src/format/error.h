// The one error type for bad input: carries the file, the tensor or key, and what is wrong.
#pragma once
#include <stdexcept>
#include <string>

namespace mla {

struct FormatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// "FILE: tensor 'NAME': WHAT" (parts left empty are left out).
[[noreturn]] void format_error(const std::string& file, const std::string& tensor, const std::string& what);

}  // namespace mla
