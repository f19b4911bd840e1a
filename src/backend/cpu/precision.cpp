// The process-wide precision switch of the CPU matrix products (see precision.h).
#include "backend/cpu/precision.h"

#include <atomic>
#include <stdexcept>

namespace mla::cpu {

namespace {
std::atomic<Precision> g_precision{Precision::Precise};
}

Precision precision() { return g_precision.load(std::memory_order_relaxed); }
void set_precision(Precision p) { g_precision.store(p, std::memory_order_relaxed); }

Precision parse_precision(const std::string& s) {
  if (s == "precise") return Precision::Precise;
  if (s == "fast") return Precision::Fast;
  throw std::invalid_argument("unknown precision '" + s + "' (precise, fast)");
}

const char* precision_name(Precision p) { return p == Precision::Fast ? "fast" : "precise"; }

}  // namespace mla::cpu
