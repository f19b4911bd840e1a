// bf16 GEMM on VDPBF16PS (see dpbf16_gemm.h). A call covers 32 weight rows against the tokens in
// groups of up to 3 blocks of 16, and a last block of at most 8 tokens at half width (micro_half,
// on ymm registers: routed experts get a few dozen tokens each, and a short last block otherwise
// costs a whole one). Register blocking: R weight rows x NT token blocks of float32
// accumulators (8 x 3 = 24, 8 x 2 = 16, 16 x 1 = 16 of the 32 zmm registers; a VDPBF16PS has a
// latency of several cycles on 2 ports, so at least a dozen independent chains keep both busy),
// per column pair NT loads of packed activations and R broadcasts of a weight pair, each
// broadcast shared by NT products.
#include "backend/cpu/dpbf16_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/decode_avx512.h"

namespace mla::cpu {

namespace {

using avx512::as_bh;

constexpr int64_t kBlock = 16;        // tokens per block (a zmm of float32 lanes)
constexpr int64_t kStep = 32;         // columns per packed step
constexpr int64_t kStepValues = 512;  // bf16 values of one token block's step (16 pairs x 16 tokens x 2)
constexpr int64_t kPrefetchSteps = 4; // weight lines fetched ahead (as the AMX kernel, amx.cpp)

inline __m512i broadcast_pair(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

// Fetches step s of R weight rows (ldw apart) towards L2, kPrefetchSteps ahead of its use.
template <int R>
inline void prefetch_rows(const uint16_t* w, int64_t ldw, int64_t s) {
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(w + r * ldw + s * kStep), _MM_HINT_T1);
}

// c[r * 48 + j * 16 + t] (+)= row r of w (R rows, ldw apart) . token t of block j (NT blocks of
// xp, bs values apart), over steps s0..s1 of 32 columns (of Kc): set by the first steps, added
// to by the later ones.
template <int R, int NT>
void micro(const uint16_t* w, int64_t ldw, const uint16_t* xp, int64_t bs, int64_t s0, int64_t s1, int64_t Kc,
           bool prefetch, float* c) {
  __m512 acc[R][NT];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
    for (int j = 0; j < NT; ++j) acc[r][j] = s0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * 48 + j * kBlock);
  for (int64_t s = s0; s < s1; ++s) {
    if (prefetch && s + kPrefetchSteps < Kc) prefetch_rows<R>(w, ldw, s + kPrefetchSteps);
    const uint16_t* xs = xp + s * kStepValues;
    const uint16_t* ws = w + s * kStep;
#pragma GCC unroll 2
    for (int p = 0; p < 16; ++p) {
      __m512i x[NT];
#pragma GCC unroll 3
      for (int j = 0; j < NT; ++j) x[j] = _mm512_loadu_si512(xs + j * bs + p * 32);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m512i b = broadcast_pair(ws + r * ldw + 2 * p);
#pragma GCC unroll 3
        for (int j = 0; j < NT; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], as_bh(x[j]), as_bh(b));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NT; ++j) _mm512_storeu_ps(c + r * 48 + j * kBlock, acc[r][j]);
}

// micro<16, 1> on the first 8 tokens of one block: a block's last tokens when no more than 8 are
// left, on 256-bit registers (the packed block holds tokens 0-7 of a column pair in its first 32
// bytes), so a short last block costs half a block.
void micro_half(const uint16_t* w, int64_t ldw, const uint16_t* xp, int64_t Kc, bool prefetch, float* c) {
  constexpr int R = 16;
  __m256 acc[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t s = 0; s < Kc; ++s) {
    if (prefetch && s + kPrefetchSteps < Kc) prefetch_rows<R>(w, ldw, s + kPrefetchSteps);
    const uint16_t* xs = xp + s * kStepValues;
    const uint16_t* ws = w + s * kStep;
#pragma GCC unroll 2
    for (int p = 0; p < 16; ++p) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs + p * 32));
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        int32_t pair;
        std::memcpy(&pair, ws + r * ldw + 2 * p, sizeof pair);
        acc[r] = _mm256_dpbf16_ps(acc[r], (__m256bh)x, (__m256bh)_mm256_set1_epi32(pair));
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(c + r * 48, acc[r]);
}

// The 32 rows of W against NT token blocks, R rows at a time, over chunks of kChunkSteps steps:
// a chunk's activations (NT x 8 KiB) and weights (16 KiB) stay in L1 while the R-row groups take
// their turns, where whole rows of K would stream the activations from L2 once per group.
constexpr int64_t kChunkSteps = 8;
template <int R, int NT>
void rows32(const uint16_t* W, int64_t ldw, const uint16_t* xp, int64_t bs, int64_t Kc, bool prefetch, float* c) {
  for (int64_t s0 = 0; s0 < Kc; s0 += kChunkSteps) {
    const int64_t s1 = std::min(Kc, s0 + kChunkSteps);
    for (int r0 = 0; r0 < 32; r0 += R) micro<R, NT>(W + r0 * ldw, ldw, xp, bs, s0, s1, Kc, prefetch, c + r0 * 48);
  }
}

}  // namespace

void dpbf16_gemm_rows32(const uint16_t* xp, int64_t M, int64_t K, const uint16_t* W, int64_t ldw, int64_t rows,
                        bool prefetch, float* y, int64_t ldy) {
  const int64_t Kc = K / kStep, Mb = (M + kBlock - 1) / kBlock, bs = Kc * kStepValues;
  alignas(64) float c[32 * 48];
  // A last block of at most 8 tokens runs on its own at half width.
  const bool half_tail = M - (Mb - 1) * kBlock <= kBlock / 2;
  const int64_t full = half_tail ? Mb - 1 : Mb;
  auto store = [&](int64_t t0, int64_t tokens) {
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t r = 0; r < rows; ++r) y[(t0 + t) * ldy + r] = c[r * 48 + t];
  };
  for (int64_t tb = 0; tb < full; tb += 3) {
    const int nt = int(std::min<int64_t>(3, full - tb));
    const uint16_t* x = xp + tb * bs;
    const bool pf = prefetch && tb == 0;  // later groups find the rows in L2
    if (nt == 3) rows32<8, 3>(W, ldw, x, bs, Kc, pf, c);
    else if (nt == 2) rows32<8, 2>(W, ldw, x, bs, Kc, pf, c);
    else rows32<16, 1>(W, ldw, x, bs, Kc, pf, c);
    store(tb * kBlock, std::min(int64_t(nt) * kBlock, M - tb * kBlock));
  }
  if (half_tail) {
    const uint16_t* x = xp + full * bs;
    for (int r0 = 0; r0 < 32; r0 += 16) micro_half(W + r0 * ldw, ldw, x, Kc, prefetch && full == 0, c + r0 * 48);
    store(full * kBlock, M - full * kBlock);
  }
}

double dpbf16_peak_loop(int64_t iters, float b) {
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512i one = _mm512_set1_epi16(short(f32_to_bf16(1.0f)));
  __m512i bv = _mm512_set1_epi16(short(f32_to_bf16(b)));
  for (int64_t i = 0; i < iters; ++i) {
    // Keeps the operand in a register the compiler cannot hoist the products out of the loop for.
    asm volatile("" : "+v"(bv));
#pragma GCC unroll 16
    for (int a = 0; a < 16; ++a) acc[a] = _mm512_dpbf16_ps(acc[a], as_bh(one), as_bh(bv));
  }
  double sum = 0;
  alignas(64) float lanes[16];
  for (auto& a : acc) {
    _mm512_store_ps(lanes, a);
    for (float v : lanes) sum += v;
  }
  return sum;
}

}  // namespace mla::cpu
