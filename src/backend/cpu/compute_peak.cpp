#include "backend/cpu/compute_peak.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "backend/cpu/amx.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/dpbf16_gemm.h"
#include "backend/cpu/fma_gemm.h"

namespace mla::cpu {

const char* peak_path_name(PeakPath p) {
  switch (p) {
    case PeakPath::AmxTiles: return "TDPBF16PS (AMX tiles)";
    case PeakPath::Fma: return "VFMADD231PS (AVX-512 float32 FMA)";
    case PeakPath::Vdpbf16ps: break;
  }
  return "VDPBF16PS (AVX-512 BF16)";
}

PeakPath prompt_peak_path(const Context& ctx) {
  const CpuFeatures f = features(ctx);
  return f.amx ? PeakPath::AmxTiles : f.fma_gemm ? PeakPath::Fma : PeakPath::Vdpbf16ps;
}

double flops_per_instruction(PeakPath p) {
  switch (p) {
    case PeakPath::AmxTiles: return 2.0 * 16 * 16 * 32;
    case PeakPath::Fma: return 2.0 * 16;
    case PeakPath::Vdpbf16ps: break;
  }
  return 2.0 * 16 * 2;
}

PeakRun peak_loop(PeakPath p, int64_t iters, float b) {
  if (p == PeakPath::AmxTiles) {
    if (!amx_available()) throw std::logic_error("peak_loop: this CPU has no AMX");
    return {4 * iters, amx_peak_loop(iters, b)};
  }
  if (p == PeakPath::Fma) return {16 * iters, fma_peak_loop(iters, b)};
  return {16 * iters, dpbf16_peak_loop(iters, b)};
}

int64_t peak_iters(PeakPath p, double ms) {
  // TDPBF16PS: 4 per round, about 16 cycles each; VDPBF16PS: 16 per round, 2 per cycle; 3 GHz.
  const double ns_per_round = p == PeakPath::AmxTiles ? 4 * 16 / 3.0 : 16 / 2 / 3.0;
  return std::max<int64_t>(1, int64_t(ms * 1e6 / ns_per_round));
}

double peak_gflops(PeakPath p, int threads, int passes, int64_t iters) {
  threads = std::max(1, threads);
  double best = 0;
  volatile double sink = 0;
  for (int pass = 0; pass <= passes; ++pass) {  // pass 0 warms up (frequency, tile state)
    const auto t0 = std::chrono::steady_clock::now();
    double sum = 0;
    int64_t n = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sum, n)
    {
      const PeakRun r = peak_loop(p, iters, 1.0f / 1024);
      sum += r.sum;
      n += r.instructions;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sink = sink + sum;
    if (pass > 0) best = std::max(best, double(n) * flops_per_instruction(p) / s / 1e9);
  }
  return best;
}

}  // namespace mla::cpu
