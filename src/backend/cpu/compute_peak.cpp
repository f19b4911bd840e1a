#include "backend/cpu/compute_peak.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <cstring>

#include "backend/cpu/common/amx.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/common/avx512.h"

namespace mla::cpu {

namespace {

// `iters` rounds of 16 products op(acc, one, b) into 16 zmm accumulators, the operands in
// registers; returns the sum of every accumulator lane at the end, read as float32 or, with
// IntLanes, as int32.
template <bool IntLanes = false, class V, class Op>
double zmm_peak_loop(int64_t iters, V one, V b, Op op) {
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (int64_t i = 0; i < iters; ++i) {
    // Keeps the operand in a register the compiler cannot hoist the products out of the loop for.
    asm volatile("" : "+v"(b));
#pragma GCC unroll 16
    for (int a = 0; a < 16; ++a) acc[a] = op(acc[a], one, b);
  }
  double sum = 0;
  for (auto& a : acc) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, a);
    for (const float& v : lanes) {
      if constexpr (IntLanes) {
        int32_t n;
        std::memcpy(&n, &v, 4);
        sum += n;
      } else {
        sum += v;
      }
    }
  }
  return sum;
}

// VDPBF16PS: 1.0 and b in every bf16 word, 16 lanes += 2 products each.
double dpbf16_peak_loop(int64_t iters, float b) {
  return zmm_peak_loop(iters, _mm512_set1_epi16(short(f32_to_bf16(1.0f))), _mm512_set1_epi16(short(f32_to_bf16(b))),
                               [](__m512 acc, __m512i x, __m512i y) { return _mm512_dpbf16_ps(acc, avx512::as_bh(x), avx512::as_bh(y)); });
}

// VFMADD231PS: 16 lanes += 1.0 * b.
double fma_peak_loop(int64_t iters, float b) {
  return zmm_peak_loop(iters, _mm512_set1_ps(1.0f), _mm512_set1_ps(b),
                               [](__m512 acc, __m512 x, __m512 y) { return _mm512_fmadd_ps(x, y, acc); });
}

// VPDPBUSD: 16 int32 lanes += 4 products of the bytes 1 x 1 each; the sum is returned times b
// (the products counted as the other loops count theirs).
double vnni_peak_loop(int64_t iters, float b) {
  // The instruction in asm: from the intrinsic GCC 12 copied every accumulator between registers
  // each round and spilled two, which halved the loop's rate (542 against 1024 GOPS a thread on
  // AMD Zen 5).
  return b * zmm_peak_loop<true>(iters, _mm512_set1_epi8(1), _mm512_set1_epi8(1), [](__m512 acc, __m512i x, __m512i y) {
           asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(x), "v"(y));
           return acc;
         });
}

}  // namespace

const char* peak_path_name(PeakPath p) {
  switch (p) {
    case PeakPath::AmxTiles: return "TDPBF16PS (AMX tiles)";
    case PeakPath::Fma: return "VFMADD231PS (AVX-512 float32 FMA)";
    case PeakPath::Vnni: return "VPDPBUSD (AVX-512 VNNI int8)";
    case PeakPath::Vdpbf16ps: break;
  }
  return "VDPBF16PS (AVX-512 BF16)";
}

PeakPath prompt_peak_path(const Context& ctx, bool int_weights) {
  const CpuFeatures f = features(ctx);
  if (f.amx) return PeakPath::AmxTiles;
  if (int_weights && ctx.fast() && ctx.int8_activations) return PeakPath::Vnni;
  return f.fma_gemm ? PeakPath::Fma : PeakPath::Vdpbf16ps;
}

double flops_per_instruction(PeakPath p) {
  switch (p) {
    case PeakPath::AmxTiles: return 2.0 * 16 * 16 * 32;
    case PeakPath::Fma: return 2.0 * 16;
    case PeakPath::Vnni: return 2.0 * 16 * 4;
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
  if (p == PeakPath::Vnni) return {16 * iters, vnni_peak_loop(iters, b)};
  return {16 * iters, dpbf16_peak_loop(iters, b)};
}

bool fma_beats_vdpbf16ps() {
  // FLOPs per second of each loop on this thread: 16 instructions a round, 32 (FMA) or 64
  // (VDPBF16PS) FLOPs each.
  const auto rate = [](double (*loop)(int64_t, float), int64_t iters, double flops) {
    double best = 0;
    volatile double sink = 0;
    for (int pass = 0; pass < 4; ++pass) {  // pass 0 warms the unit up
      const auto t0 = std::chrono::steady_clock::now();
      sink = sink + loop(iters, 1.0f / 1024);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (pass > 0 && s > 0) best = std::max(best, double(iters) * 16 * flops / s);
    }
    return best;
  };
  return rate(fma_peak_loop, 100000, 32) >= 1.5 * rate(dpbf16_peak_loop, 50000, 64);
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
