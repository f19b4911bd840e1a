// oneDNN's OpenMP runtime sizes its parallel regions by the calling thread's nthreads-var
// (omp_get_max_threads), the one thing it reads for a thread count. OneDnnThreads sets that of
// the calling thread to the context's count for the lifetime of one oneDNN call and restores it;
// inside a parallel region (where oneDNN runs sequentially) it does nothing. Internal to
// src/backend/cpu.
#pragma once
#include <omp.h>

#include "backend/cpu/context.h"

namespace mla::cpu {

class OneDnnThreads {
 public:
  explicit OneDnnThreads(const Context& ctx) {
    if (omp_in_parallel()) return;
    const int n = ctx.num_threads(), now = omp_get_max_threads();
    if (n == now) return;
    saved_ = now;
    omp_set_num_threads(n);
  }
  ~OneDnnThreads() {
    if (saved_ > 0) omp_set_num_threads(saved_);
  }
  OneDnnThreads(const OneDnnThreads&) = delete;
  OneDnnThreads& operator=(const OneDnnThreads&) = delete;

 private:
  int saved_ = 0;
};

}  // namespace mla::cpu
