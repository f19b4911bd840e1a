// Parallel loops and regions on a context's threads (context.h) that open no OpenMP region when
// they would run on one thread: libgomp allocates a team for every region of a single thread
// (an `if` clause that is false, num_threads(1), or a region nested in another), so a decode
// step's small loops would allocate a few dozen times. Iterations are split as schedule(static)
// splits them, so results do not depend on which way a loop ran.
#pragma once
#include <omp.h>

#include <cstdint>

#include "backend/cpu/context.h"

namespace mla::cpu {

// The threads a region asked to split (`split`) gets: ctx's, or 1 inside another region (nested
// regions are inactive).
inline int region_threads(const Context& ctx, bool split) { return split && !omp_in_parallel() ? ctx.num_threads() : 1; }

// body(i) for i in [0, n), split across ctx's threads (static schedule) when `split`.
template <class Body>
void parallel_for(const Context& ctx, int64_t n, bool split, Body&& body) {
  const int threads = n > 1 ? region_threads(ctx, split) : 1;
  if (threads == 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) body(i);
}

// region() on each of ctx's threads when `split`, else once on the calling thread. Worksharing
// loops inside must use schedule(static): outside any region (the serial case) they run whole
// on the calling thread without the runtime (a dynamic one would allocate its work share).
// Inside another region, region() runs in a nested region of one thread as before, so that its
// worksharing loops bind to that and not to the enclosing team.
template <class Region>
void parallel_region(const Context& ctx, bool split, Region&& region) {
  if (omp_in_parallel()) {
#pragma omp parallel num_threads(1)
    region();
    return;
  }
  const int threads = split ? ctx.num_threads() : 1;
  if (threads == 1) {
    region();
    return;
  }
#pragma omp parallel num_threads(threads)
  region();
}

}  // namespace mla::cpu
