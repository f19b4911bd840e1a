// Fused dequantize-and-dot kernels for a few tokens (see gemv.h): a tile of R rows x up to 4
// tokens, each chunk of 32 columns decoded once in registers (decode_avx512.h) and dotted with
// the tokens' activations, permuted once per call into the format's lane layout ("prepared").
// FP8 block scales are folded into the activations per 128-row block (times 2^64, the sum
// times 2^56, keeping the 2^-120 of the decode far from float32's range limits).
#include "backend/cpu/gemv.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "backend/cpu/decode_avx512.h"
#include "tensor/dtype.h"

namespace mla::cpu {

namespace {

using namespace avx512;

constexpr bool kPrefetch = true;  // software prefetch ahead in each row of a tile
constexpr int kMaxTT = 4;            // tokens sharing one decode of a chunk
// Below this many weights a product runs on the calling thread alone: a parallel region costs a
// few microseconds of fork and barrier (far more when the cores are shared), which is what
// streaming 256K weights takes.
constexpr int64_t kSerialWork = int64_t(1) << 18;
constexpr double kUnitBytes = 192 * 1024;  // weight bytes per dynamically scheduled work unit

struct Unit {
  size_t job;
  int64_t n0, n1;
};
constexpr float kFp8XScale = 18446744073709551616.0f;  // 2^64
constexpr float kFp8YScale = 72057594037927936.0f;     // 2^56 (2^64 * 2^56 = 2^120)

// ---- the tile kernel: R rows x TT tokens over Kc chunks ---------------------------------------

template <int TT, int R, class Dec>
inline void tile(const Dec* dec, const float* xp, int64_t ldxp, int64_t Kc, float (&out)[R][TT]) {
  __m512 acc[R][TT], acc2[R][TT];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < TT; ++t) acc[r][t] = acc2[r][t] = _mm512_setzero_ps();
  for (int64_t c = 0; c < Kc; ++c) {
    __m512 xa[TT], xb[TT];
#pragma GCC unroll 8
    for (int t = 0; t < TT; ++t) {
      xa[t] = _mm512_loadu_ps(xp + t * ldxp + c * kChunk);
      xb[t] = _mm512_loadu_ps(xp + t * ldxp + c * kChunk + 16);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m512 a, b;
      if constexpr (kPrefetch) dec[r].prefetch(c);
      dec[r].decode(c, a, b);
#pragma GCC unroll 8
      for (int t = 0; t < TT; ++t) {
        acc[r][t] = _mm512_fmadd_ps(a, xa[t], acc[r][t]);
        acc2[r][t] = _mm512_fmadd_ps(b, xb[t], acc2[r][t]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < TT; ++t) out[r][t] = hsum(_mm512_add_ps(acc[r][t], acc2[r][t]));
}

// Per-thread scratch, reused across calls (no allocation once warm).
struct Scratch {
  std::vector<float> xs;      // FP8: the prepared activations times a row block's scales
  std::vector<float> scales;  // INT4: per-chunk float32 scales of the rows of a tile
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// The rows [n0, n1) of one thread.
struct Rows {
  const MatrixView& W;
  const float* x;
  int64_t ldx;
  const float* xp;  // prepared, [T, Kc * 32]
  int64_t T, Kc;
  float* y;
  int64_t ldy;

  template <class Dec>
  Dec make(int slot, int64_t n, float* sbuf) const {
    const uint8_t* row = static_cast<const uint8_t*>(W.data) + size_t(n) * W.row_bytes();
    if constexpr (std::is_same_v<Dec, DecF32>) return {reinterpret_cast<const float*>(row)};
    else if constexpr (std::is_same_v<Dec, DecF16> || std::is_same_v<Dec, DecBF16>) return {reinterpret_cast<const uint16_t*>(row)};
    else if constexpr (std::is_same_v<Dec, DecFP8>) return {row};
    else {
      float* s = sbuf + slot * Kc;
      const uint16_t* src = static_cast<const uint16_t*>(W.scales) + (W.row0 + n) * W.scale_cols;
      if (W.group_size == kChunk) {
        int64_t c = 0;
        for (; c + 16 <= Kc; c += 16) {
          __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + c)));
          _mm512_storeu_ps(s + c, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
        }
        for (; c < Kc; ++c) s[c] = bf16_to_f32(src[c]);
      } else {
        const int64_t per = W.group_size / kChunk;
        for (int64_t c = 0; c < Kc; ++c) s[c] = bf16_to_f32(src[c / per]);
      }
      return {row, s};
    }
  }

  template <class Dec, int TT, int R>
  void do_tile(int64_t n, int64_t t0, const float* xseg, float post, float* sbuf) const {
    Dec dec[R];
    for (int r = 0; r < R; ++r) dec[r] = make<Dec>(r, n + r, sbuf);
    float out[R][TT];
    tile<TT, R>(dec, xseg + t0 * Kc * kChunk, Kc * kChunk, Kc, out);
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < TT; ++t) {
        float v = out[r][t] * post;
        for (int64_t k = Kc * kChunk; k < W.cols; ++k) v += element(W, n + r, k) * x[(t0 + t) * ldx + k];
        y[(t0 + t) * ldy + n + r] = v;
      }
  }

  template <class Dec, int TT>
  void rows_tt(int64_t s, int64_t e, int64_t t0, const float* xseg, float post, float* sbuf) const {
    constexpr int R = TT <= 2 ? 4 : 2;
    int64_t n = s;
    for (; n + R <= e; n += R) do_tile<Dec, TT, R>(n, t0, xseg, post, sbuf);
    for (; n < e; ++n) do_tile<Dec, TT, 1>(n, t0, xseg, post, sbuf);
  }

  template <class Dec>
  void segment(int64_t s, int64_t e, const float* xseg, float post) const {
    Scratch& sc = scratch();
    float* sbuf = nullptr;
    if constexpr (std::is_same_v<Dec, DecInt4>) {
      if (sc.scales.size() < size_t(4 * Kc)) sc.scales.resize(size_t(4 * Kc));
      sbuf = sc.scales.data();
    }
    for (int64_t t0 = 0; t0 < T; t0 += kMaxTT) {
      switch (std::min<int64_t>(kMaxTT, T - t0)) {
        case 1: rows_tt<Dec, 1>(s, e, t0, xseg, post, sbuf); break;
        case 2: rows_tt<Dec, 2>(s, e, t0, xseg, post, sbuf); break;
        case 3: rows_tt<Dec, 3>(s, e, t0, xseg, post, sbuf); break;
        default: rows_tt<Dec, 4>(s, e, t0, xseg, post, sbuf); break;
      }
    }
  }

  void run(int64_t n0, int64_t n1) const {
    if (n0 >= n1) return;
    switch (W.format) {
      case WeightFormat::F32: segment<DecF32>(n0, n1, xp, 1.0f); break;
      case WeightFormat::F16: segment<DecF16>(n0, n1, xp, 1.0f); break;
      case WeightFormat::BF16: segment<DecBF16>(n0, n1, xp, 1.0f); break;
      case WeightFormat::INT4_GROUP: segment<DecInt4>(n0, n1, xp, 1.0f); break;
      case WeightFormat::FP8_BLOCK128: {
        // Rows of one 128-row block share their scales: fold them into the activations.
        Scratch& sc = scratch();
        const int64_t width = Kc * kChunk;
        if (sc.xs.size() < size_t(T * width)) sc.xs.resize(size_t(T * width));
        const float* bs = static_cast<const float*>(W.scales);
        for (int64_t s = n0; s < n1;) {
          const int64_t blk = (W.row0 + s) / 128;
          const int64_t e = std::min(n1, (blk + 1) * 128 - W.row0);
          for (int64_t t = 0; t < T; ++t)
            for (int64_t c = 0; c < Kc; ++c) {
              const __m512 f = _mm512_set1_ps(bs[blk * W.scale_cols + (c * kChunk) / 128] * kFp8XScale);
              const float* src = xp + t * width + c * kChunk;
              float* dst = sc.xs.data() + t * width + c * kChunk;
              _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_loadu_ps(src), f));
              _mm512_storeu_ps(dst + 16, _mm512_mul_ps(_mm512_loadu_ps(src + 16), f));
            }
          segment<DecFP8>(s, e, sc.xs.data(), kFp8YScale);
          s = e;
        }
        break;
      }
    }
  }
};

}  // namespace

void gemv_reference(const float* x, int64_t T, int64_t ldx, const MatrixView& W, float* y, int64_t ldy) {
  std::vector<float> row(static_cast<size_t>(W.cols));
  for (int64_t n = 0; n < W.rows; ++n) {
    W.dequant_row(n, row.data());
    for (int64_t t = 0; t < T; ++t) {
      float s = 0;
      for (int64_t k = 0; k < W.cols; ++k) s += row[size_t(k)] * x[t * ldx + k];
      y[t * ldy + n] = s;
    }
  }
}

void gemv_batch(std::span<const GemvJob> jobs) {
  // Jobs without a fast kernel run on the reference; the rest are prepared (activations permuted
  // into the format's lane layout, on this thread) and split across the threads by weight bytes.
  thread_local std::vector<float> prepared;
  thread_local std::vector<Rows> rows;
  thread_local std::vector<double> cum;  // weight bytes before each fast job
  thread_local std::vector<Unit> units;
  size_t need = 0;
  for (const auto& j : jobs)
    if (j.T > 0 && j.W.rows > 0 && fast_supported(j.W)) need += size_t(j.T * (j.W.cols / kChunk) * kChunk);
  if (prepared.size() < need) prepared.resize(need);
  rows.clear();
  cum.clear();
  double total = 0;
  int64_t weights = 0;
  size_t off = 0;
  for (const auto& j : jobs) {
    if (j.T <= 0 || j.W.rows <= 0) continue;
    if (!fast_supported(j.W)) {
      gemv_reference(j.x, j.T, j.ldx, j.W, j.y, j.ldy);
      continue;
    }
    const int64_t Kc = j.W.cols / kChunk, width = Kc * kChunk;
    float* xp = prepared.data() + off;
    off += size_t(j.T * width);
    const Layout layout = layout_of(j.W.format);
    alignas(64) int32_t ia[16], ib[16];
    for (int l = 0; l < 16; ++l) {
      ia[l] = layout_col(layout, l);
      ib[l] = layout_col(layout, 16 + l);
    }
    const __m512i pa = _mm512_load_si512(ia), pb = _mm512_load_si512(ib);
    for (int64_t t = 0; t < j.T; ++t)
      for (int64_t c = 0; c < Kc; ++c) {
        const float* src = j.x + t * j.ldx + c * kChunk;
        const __m512 lo = _mm512_loadu_ps(src), hi = _mm512_loadu_ps(src + 16);
        _mm512_storeu_ps(xp + t * width + c * kChunk, _mm512_permutex2var_ps(lo, pa, hi));
        _mm512_storeu_ps(xp + t * width + c * kChunk + 16, _mm512_permutex2var_ps(lo, pb, hi));
      }
    rows.push_back(Rows{j.W, j.x, j.ldx, xp, j.T, Kc, j.y, j.ldy});
    cum.push_back(total);
    total += double(j.W.rows) * double(j.W.row_bytes() + (j.W.scale_bytes() + j.W.rows - 1) / j.W.rows);
    weights += j.W.rows * j.W.cols;
  }
  if (rows.empty()) return;
  cum.push_back(total);
  const bool serial = weights < kSerialWork || omp_in_parallel() || omp_get_max_threads() == 1;
  if (serial) {
    for (const auto& r : rows) r.run(0, r.W.rows);
    return;
  }
  // Work units of about kUnitBytes of weights (whole multiples of 8 rows), handed out
  // dynamically: a thread that is descheduled for a while (shared cores) holds up one unit, not
  // half of the product.
  units.clear();
  for (size_t k = 0; k < rows.size(); ++k) {
    const int64_t N = rows[k].W.rows;
    const double row_bytes = (cum[k + 1] - cum[k]) / double(N);
    const int64_t step = std::max<int64_t>(8, int64_t(kUnitBytes / std::max(1.0, row_bytes)) / 8 * 8);
    for (int64_t n = 0; n < N; n += step) units.push_back({k, n, std::min(N, n + step)});
  }
  // The workers read this thread's lists (thread_local names would be their own).
  const std::vector<Rows>& all = rows;
  const std::vector<Unit>& work = units;
  const int64_t nunits = int64_t(work.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t u = 0; u < nunits; ++u) all[work[size_t(u)].job].run(work[size_t(u)].n0, work[size_t(u)].n1);
}

void gemv(const float* x, int64_t T, int64_t ldx, const MatrixView& W, float* y, int64_t ldy) {
  const GemvJob job{x, T, ldx, W, y, ldy};
  gemv_batch(std::span<const GemvJob>(&job, 1));
}

}  // namespace mla::cpu
