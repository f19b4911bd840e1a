// Names of the precisions of the CPU matrix products (see precision.h).
#include "backend/cpu/precision.h"

#include <stdexcept>

namespace mla::cpu {

Precision parse_precision(const std::string& s) {
  if (s == "precise") return Precision::Precise;
  if (s == "fast") return Precision::Fast;
  throw std::invalid_argument("unknown precision '" + s + "' (precise, fast)");
}

const char* precision_name(Precision p) { return p == Precision::Fast ? "fast" : "precise"; }

}  // namespace mla::cpu
