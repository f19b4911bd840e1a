// The CPU context (see context.h).
#include "backend/cpu/context.h"

#include <omp.h>

#include <algorithm>

namespace mla::cpu {

int threads_or_default(int n) { return n > 0 ? n : std::max(1, omp_get_max_threads()); }

int Context::num_threads() const { return threads_or_default(threads); }

}  // namespace mla::cpu
