#include "backend/cpu/attention.h"

#include <omp.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "backend/cpu/amx.h"
#include "backend/cpu/decode_avx512.h"
#include "backend/cpu/dpbf16_gemm.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/small_gemm.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/vec_math.h"

namespace mla::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Score buffer budget (floats) per block of query rows, so long prefills stay in memory.
constexpr int64_t kScoreBudget = int64_t(1) << 22;
// Query rows per block of the expand path's causal attention.
constexpr int64_t kExpandRows = 64;

// Masks row r (query position qpos) of scores [*, S] and normalises it; returns its lse. The
// masked scores get probability 0 without an exponential.
float causal_softmax(float* s, int64_t S, int64_t qpos, int64_t k_pos0) {
  const int64_t visible = std::clamp<int64_t>(qpos - k_pos0 + 1, 0, S);
  std::fill(s + visible, s + S, 0.0f);
  return softmax_inplace(s, visible);
}

int64_t round32(int64_t n) { return (n + 31) / 32 * 32; }

// The products of the fast precision's expand path, on one of two instruction sets. Each packs
// a block of bf16 query (or probability) rows once, then multiplies it by 32 bf16 rows of keys
// (or of transposed values) at a time, float32 sums.
struct AmxProducts {  // AMX tiles (amx.h)
  using Packed = uint16_t;
  static int64_t packed_size(int64_t M, int64_t K) { return amx_packed_size(M, K); }
  static void pack(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, Packed* out) {
    amx_pack_activations(x, M, K, ldx, out);
  }
  static void rows32(const Packed* xp, int64_t M, int64_t K, const uint16_t* W, int64_t ldw, int64_t rows, float* y,
                     int64_t ldy) {
    amx_gemm_rows32(xp, M, K, W, ldw, rows, false, y, ldy);
  }
};
struct Dpbf16Products {  // VDPBF16PS on column pairs (dpbf16_gemm.h)
  using Packed = uint32_t;
  static int64_t packed_size(int64_t M, int64_t K) { return M * K / 2; }
  static void pack(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, Packed* out) {
    pack_activation_pairs(x, M, K, ldx, out);
  }
  static void rows32(const Packed* xp, int64_t M, int64_t K, const uint16_t* W, int64_t ldw, int64_t rows, float* y,
                     int64_t ldy) {
    dpbf16_gemm_pairs_rows32(xp, M, K, W, ldw, rows, false, y, ldy);
  }
};

// The fast precision's expand path on bf16 products: per head, the keys [S, nope + rope] and the
// values transposed [v, S] as bf16 (zero-padded to 32 rows and columns), then per block of
// query rows the scores Q K^T and the output P V as bf16 products with float32 sums, the softmax
// in float32 between them. Same blocks, masking and lse as the float32 path below.
template <class Products>
void expand_bf16(const Context& ctx, const ExpandArgs& a, int64_t tb, float* out, float* lse) {
  using Packed = typename Products::Packed;
  const int64_t qk = a.nope + a.rope, ldkv = a.H * (a.nope + a.v);
  const int64_t S32 = round32(a.S), V32 = round32(a.v);
#pragma omp parallel num_threads(ctx.num_threads())
  {
    const vec::FlushDenormals flush;
    std::vector<uint16_t> K(static_cast<size_t>(S32 * qk)), Vt(static_cast<size_t>(V32 * S32), 0),
        Qb(static_cast<size_t>(tb * qk)), Pb(static_cast<size_t>(tb * S32));
    std::vector<Packed> Qp(static_cast<size_t>(Products::packed_size(tb, qk))),
        Pp(static_cast<size_t>(Products::packed_size(tb, S32)));
    std::vector<float> Q(static_cast<size_t>(tb * qk)), P(static_cast<size_t>(tb * S32));
    // The keys' rope part is every head's.
    activations_bf16(a.k_pe, a.S, a.ld_kpe, a.rope, WeightFormat::BF16, false, K.data() + a.nope, qk);
#pragma omp for schedule(dynamic)
    for (int64_t h = 0; h < a.H; ++h) {
      const float* kvh = a.kv + h * (a.nope + a.v);
      activations_bf16(kvh, a.S, ldkv, a.nope, WeightFormat::BF16, false, K.data(), qk);
      // Vt[d, j] = V[j, d], 16 x 16 blocks at a time (keys past S read as zero).
      const int64_t v16 = a.v / 16 * 16;
      for (int64_t j0 = 0; j0 < a.S; j0 += 16)
        for (int64_t d0 = 0; d0 < v16; d0 += 16) {
          __m512 col[16];
          vec::transpose16(kvh + j0 * ldkv + a.nope + d0, ldkv, std::min<int64_t>(16, a.S - j0), col);
          for (int i = 0; i < 16; ++i)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(Vt.data() + (d0 + i) * S32 + j0),
                                reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(col[i])));
        }
      for (int64_t j = 0; j < a.S; ++j)
        for (int64_t d = v16; d < a.v; ++d) Vt[size_t(d * S32 + j)] = f32_to_bf16(kvh[j * ldkv + a.nope + d]);
      for (int64_t t0 = 0; t0 < a.T; t0 += tb) {
        const int64_t nt = std::min(tb, a.T - t0);
        for (int64_t t = 0; t < nt; ++t) {
          const float* src = a.q + ((t0 + t) * a.H + h) * qk;
          for (int64_t d = 0; d < qk; ++d) Q[size_t(t * qk + d)] = src[d] * a.scale;
        }
        activations_bf16(Q.data(), nt, qk, qk, WeightFormat::BF16, false, Qb.data(), qk);
        Products::pack(Qb.data(), nt, qk, qk, Qp.data());
        const int64_t S = std::clamp<int64_t>(a.q_pos0 + t0 + nt - a.k_pos0, 0, a.S), Sp = round32(S);
        for (int64_t j0 = 0; j0 < S; j0 += 32)
          Products::rows32(Qp.data(), nt, qk, K.data() + j0 * qk, qk, std::min<int64_t>(32, S - j0), P.data() + j0, Sp);
        for (int64_t t = 0; t < nt; ++t) {
          float* p = P.data() + t * Sp;
          lse[(t0 + t) * a.H + h] = causal_softmax(p, S, a.q_pos0 + t0 + t, a.k_pos0);
          std::fill(p + S, p + Sp, 0.0f);
        }
        activations_bf16(P.data(), nt, Sp, Sp, WeightFormat::BF16, false, Pb.data(), Sp);
        Products::pack(Pb.data(), nt, Sp, Sp, Pp.data());
        float* o = out + (t0 * a.H + h) * a.v;
        for (int64_t d0 = 0; d0 < a.v; d0 += 32)
          Products::rows32(Pp.data(), nt, Sp, Vt.data() + d0 * S32, S32, std::min<int64_t>(32, a.v - d0), o + d0,
                           a.H * a.v);
      }
    }
  }
}

// Query rows in blocks; each block sees the keys up to its last row's position only, so a
// causal prompt computes the lower triangle of the scores (and a few blocks' diagonal).
int64_t expand_row_block(const ExpandArgs& a) {
  return std::max<int64_t>(1, std::min({a.T, kExpandRows, kScoreBudget / std::max<int64_t>(1, a.S)}));
}

}  // namespace

const char* expand_kernel_name(ExpandKernel k) {
  switch (k) {
    case ExpandKernel::Amx: return "amx";
    case ExpandKernel::Dpbf16: return "dpbf16";
    case ExpandKernel::F32: break;
  }
  return "f32";
}

bool amx_expand_supported(const ExpandArgs& a) { return (a.nope + a.rope) % 32 == 0 && host_features().amx; }

bool dpbf16_expand_supported(const ExpandArgs& a) { return (a.nope + a.rope) % 32 == 0; }

ExpandKernel expand_kernel(const Context& ctx, const ExpandArgs& a) {
  if (!ctx.fast()) return ExpandKernel::F32;
  const CpuFeatures f = features(ctx);
  if (f.amx && amx_expand_supported(a)) return ExpandKernel::Amx;
  return !f.fma_gemm && dpbf16_expand_supported(a) ? ExpandKernel::Dpbf16 : ExpandKernel::F32;
}

void attention_expand(const Context& ctx, const ExpandArgs& a, float* out, float* lse) {
  switch (expand_kernel(ctx, a)) {
    case ExpandKernel::Amx: attention_expand_amx(ctx, a, out, lse); break;
    case ExpandKernel::Dpbf16: attention_expand_dpbf16(ctx, a, out, lse); break;
    case ExpandKernel::F32: attention_expand_f32(ctx, a, out, lse); break;
  }
}

void attention_expand_amx(const Context& ctx, const ExpandArgs& a, float* out, float* lse) {
  if (!amx_expand_supported(a))
    throw std::logic_error(host_features().amx ? "attention_expand_amx: nope + rope is not a multiple of 32"
                                           : "attention_expand_amx: this CPU has no AMX");
  expand_bf16<AmxProducts>(ctx, a, expand_row_block(a), out, lse);
}

void attention_expand_dpbf16(const Context& ctx, const ExpandArgs& a, float* out, float* lse) {
  if (!dpbf16_expand_supported(a)) throw std::logic_error("attention_expand_dpbf16: nope + rope is not a multiple of 32");
  expand_bf16<Dpbf16Products>(ctx, a, expand_row_block(a), out, lse);
}

void attention_expand_f32(const Context& ctx, const ExpandArgs& a, float* out, float* lse) {
  const int64_t qk = a.nope + a.rope, ldkv = a.H * (a.nope + a.v);
  const int64_t tb = expand_row_block(a);
#pragma omp parallel num_threads(ctx.num_threads())
  {
    const vec::FlushDenormals flush;
    std::vector<float> K(static_cast<size_t>(a.S * qk)), Q(static_cast<size_t>(tb * qk)), P(static_cast<size_t>(tb * a.S));
#pragma omp for schedule(dynamic)
    for (int64_t h = 0; h < a.H; ++h) {
      for (int64_t j = 0; j < a.S; ++j) {
        const float* src = a.kv + j * ldkv + h * (a.nope + a.v);
        std::copy(src, src + a.nope, K.data() + j * qk);
        std::copy(a.k_pe + j * a.ld_kpe, a.k_pe + j * a.ld_kpe + a.rope, K.data() + j * qk + a.nope);
      }
      for (int64_t t0 = 0; t0 < a.T; t0 += tb) {
        int64_t nt = std::min(tb, a.T - t0);
        for (int64_t t = 0; t < nt; ++t) {
          const float* src = a.q + ((t0 + t) * a.H + h) * qk;
          std::copy(src, src + qk, Q.data() + t * qk);
        }
        const int64_t S = std::clamp<int64_t>(a.q_pos0 + t0 + nt - a.k_pos0, 0, a.S);  // keys this block sees
        sgemm(ctx, false, true, nt, S, qk, a.scale, Q.data(), qk, K.data(), qk, 0.0f, P.data(), S);
        for (int64_t t = 0; t < nt; ++t)
          lse[(t0 + t) * a.H + h] = causal_softmax(P.data() + t * S, S, a.q_pos0 + t0 + t, a.k_pos0);
        // out[t, h, :] = P V_h, V_h = kv[:, h, nope:] with row stride ldkv.
        sgemm(ctx, false, false, nt, a.v, S, 1.0f, P.data(), S, a.kv + h * (a.nope + a.v) + a.nope, ldkv, 0.0f,
              out + (t0 * a.H + h) * a.v, a.H * a.v);
      }
    }
  }
}

namespace {

// Keys per block of the absorb path's online softmax, and the shortest key range worth
// splitting across threads.
constexpr int64_t kKeyBlock = 256;
constexpr int64_t kSplitKeys = 1024;
// Query rows (tokens x heads) up to which the products run on small_gemm.h's kernels (decode:
// one token of up to 128 heads), which allocate nothing; one thread, bench/absorb_gemm: at 16-32
// rows as fast as oneDNN's sgemm (both products together), at 64-128 rows 0.75x (scores) and
// 0.9x (P c_KV) of it. Past it oneDNN's sgemm, whose packing pays off on many rows (the absorb
// of 16 tokens x 16 heads: ~15-25% faster in bench/attention_paths) but allocates on every call.
constexpr int64_t kSmallGemmRows = 128;

// The weights p [M, n] (ldp apart) as bf16 pairs of consecutive keys: out[r * np + i] holds
// (p[r, 2i], p[r, 2i + 1]) in its low and high half, np = (n + 1) / 2, a missing odd key 0.
void weight_pairs(const float* p, int64_t M, int64_t n, int64_t ldp, uint32_t* out) {
  const int64_t np = (n + 1) / 2;
  for (int64_t r = 0; r < M; ++r) {
    const float* pr = p + r * ldp;
    uint16_t* o = reinterpret_cast<uint16_t*>(out + r * np);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + j), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(pr + j)));
    for (; j < n; ++j) o[j] = f32_to_bf16(pr[j]);
    if (n % 2) o[n] = 0;
  }
}

// acc[r, c] += sum over keys j < n of p[r, j] v[j, c], r < R, c < kvr (kvr % 16 == 0), from the
// weights in bf16 pairs (weight_pairs, np per row) and the bf16 rows v (ldv apart; row n readable
// when n is odd, its products then times 0). For 16 columns at a time, the rows of two
// consecutive keys are interleaved into one register's dwords, (v[j, c], v[j + 1, c]) in lane c,
// and each query row's pair of weights, broadcast, multiplies them on VDPBF16PS: R accumulators
// of 16 columns, one float32 chain each.
template <int R>
void pv_rows_dpbf16(const uint32_t* pairs, int64_t np, const uint16_t* v, int64_t ldv, int64_t kvr, float* acc,
                    int64_t ldacc) {
  alignas(64) static const uint16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                        8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i idx = _mm512_load_si512(kInterleave);
  for (int64_t c0 = 0; c0 < kvr; c0 += 16) {
    __m512 s[R];
    for (int r = 0; r < R; ++r) s[r] = _mm512_setzero_ps();
    const uint16_t* row = v + c0;
    for (int64_t i = 0; i < np; ++i, row += 2 * ldv) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + ldv));
      const __m512bh x = avx512::as_bh(_mm512_permutexvar_epi16(idx, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1)));
      for (int r = 0; r < R; ++r)
        s[r] = _mm512_dpbf16_ps(s[r], avx512::as_bh(_mm512_set1_epi32(int32_t(pairs[r * np + i]))), x);
    }
    for (int r = 0; r < R; ++r) {
      float* o = acc + r * ldacc + c0;
      _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), s[r]));
    }
  }
}

void pv_dpbf16(const uint32_t* pairs, int64_t M, int64_t np, const uint16_t* v, int64_t ldv, int64_t kvr, float* acc) {
  for (int64_t r0 = 0; r0 < M; r0 += 16) {
    const uint32_t* pr = pairs + r0 * np;
    float* ar = acc + r0 * kvr;
    switch (std::min<int64_t>(16, M - r0)) {
#define MLA_PV_CASE(n) \
  case n: pv_rows_dpbf16<n>(pr, np, v, ldv, kvr, ar, kvr); break;
      MLA_PV_CASE(1) MLA_PV_CASE(2) MLA_PV_CASE(3) MLA_PV_CASE(4) MLA_PV_CASE(5) MLA_PV_CASE(6) MLA_PV_CASE(7)
      MLA_PV_CASE(8) MLA_PV_CASE(9) MLA_PV_CASE(10) MLA_PV_CASE(11) MLA_PV_CASE(12) MLA_PV_CASE(13)
      MLA_PV_CASE(14) MLA_PV_CASE(15) MLA_PV_CASE(16)
#undef MLA_PV_CASE
    }
  }
}

}  // namespace

const char* absorb_kernel_name(AbsorbKernel k) { return k == AbsorbKernel::Dpbf16 ? "dpbf16" : "f32"; }

bool dpbf16_absorb_supported(const AbsorbArgs& a) {
  return a.gather_bf16 && (a.kv_lora + a.rope) % 32 == 0 && a.kv_lora % 16 == 0;
}

AbsorbKernel absorb_kernel(const Context& ctx, const AbsorbArgs& a) {
  return ctx.fast() && dpbf16_absorb_supported(a) ? AbsorbKernel::Dpbf16 : AbsorbKernel::F32;
}

void attention_absorb(const Context& ctx, const AbsorbArgs& a, float* out_lat, float* lse) {
  const int64_t dim = a.kv_lora + a.rope, kvr = a.kv_lora, H = a.H;
  const bool bf16 = absorb_kernel(ctx, a) == AbsorbKernel::Dpbf16;
  if (!bf16 && !a.latent && !a.gather) throw std::invalid_argument("attention_absorb: no latent rows and no gather");
  // Token blocks bound the score block (rows x kKeyBlock) and the accumulators (rows x kv_lora).
  const int64_t tb = std::max<int64_t>(1, std::min<int64_t>(a.T, kScoreBudget / (H * std::max(kKeyBlock, kvr))));
  const int64_t nblocks = (a.S + kKeyBlock - 1) / kKeyBlock;
  const int nthr = a.S >= kSplitKeys && !omp_in_parallel()
                       ? int(std::min<int64_t>(ctx.num_threads(), std::max<int64_t>(1, nblocks)))
                       : 1;
  // Kept between calls (no allocation per decode step). The references are this thread's
  // buffers also inside the parallel region below, where the thread_local names are the workers'.
  thread_local std::vector<float> q_buf, parts_buf, part_lse_buf;
  thread_local std::vector<uint16_t> qb_buf;
  thread_local std::vector<uint32_t> qpairs_buf;
  std::vector<float>&Q = q_buf, &parts = parts_buf, &part_lse = part_lse_buf;
  std::vector<uint16_t>& Qb = qb_buf;          // Dpbf16: the scaled queries in bf16
  std::vector<uint32_t>& Qpairs = qpairs_buf;  // and as the paired kernel's activations
  Q.resize(size_t(tb * H * dim));
  if (bf16) Qb.resize(size_t(tb * H * dim)), Qpairs.resize(size_t(tb * H * dim / 2));
  parts.resize(size_t(nthr > 1 ? nthr * tb * H * kvr : 0));
  part_lse.resize(size_t(nthr > 1 ? nthr * tb * H : 0));
  for (int64_t t0 = 0; t0 < a.T; t0 += tb) {
    const int64_t nt = std::min(tb, a.T - t0), M = nt * H;
    for (int64_t t = 0; t < nt; ++t)
      for (int64_t h = 0; h < H; ++h) {
        float* dst = Q.data() + (t * H + h) * dim;
        const float* ql = a.q_lat + ((t0 + t) * H + h) * kvr;
        std::copy(ql, ql + kvr, dst);
        const float* qp = a.q_pe + (t0 + t) * a.ld_qpe + h * a.head_stride_qpe;
        std::copy(qp, qp + a.rope, dst + kvr);
      }
    if (bf16) {
      for (int64_t i = 0; i < M * dim; ++i) Qb[size_t(i)] = f32_to_bf16(Q[size_t(i)] * a.scale);
      pack_activation_pairs(Qb.data(), M, dim, dim, Qpairs.data());
    }
    // One thread's share: key blocks [b0, b1) into acc [M, kv_lora] and its lse [M].
    auto run = [&](int64_t b0, int64_t b1, float* acc, float* row_lse) {
      const vec::FlushDenormals flush;
      thread_local std::vector<float> C, P, m, l;
      thread_local std::vector<uint16_t> Cb;     // Dpbf16: the block's rows as stored, zero rows to a multiple of 32
      thread_local std::vector<uint32_t> pairs;  // Dpbf16: the block's weights in bf16 pairs
      if (bf16) Cb.resize(static_cast<size_t>((kKeyBlock + 32) * dim)), pairs.resize(size_t(M * (kKeyBlock / 2)));
      else if (a.gather) C.resize(static_cast<size_t>(kKeyBlock * dim));
      P.resize(static_cast<size_t>(M * kKeyBlock));
      m.assign(static_cast<size_t>(M), kNegInf);
      l.assign(static_cast<size_t>(M), 0.0f);
      std::fill(acc, acc + M * kvr, 0.0f);
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t j0 = b * kKeyBlock, n = std::min(kKeyBlock, a.S - j0);
        // Keys past every query of this token block are masked for all of its rows.
        const int64_t last_visible = a.q_pos0 + t0 + nt - 1 - a.k_pos0;
        if (j0 > last_visible) break;
        const float* rows = a.latent ? a.latent + j0 * dim : C.data();
        if (bf16) {
          // Scores [M, n] on VDPBF16PS, 32 keys at a time (the last group padded with zero rows).
          a.gather_bf16(j0, n, Cb.data());
          const int64_t n32 = (n + 31) / 32 * 32;
          std::fill(Cb.begin() + n * dim, Cb.begin() + n32 * dim, uint16_t(0));
          for (int64_t r0 = 0; r0 < n; r0 += 32)
            dpbf16_gemm_pairs_rows32(Qpairs.data(), M, dim, Cb.data() + r0 * dim, dim, std::min<int64_t>(32, n - r0),
                                     false, P.data() + r0, n);
        } else {
          if (!a.latent) a.gather(j0, n, C.data());
          // One shared key per cached token for all heads: scores [M, n] = Q rows^T.
          if (M <= kSmallGemmRows) gemm_nt_f32(M, n, dim, a.scale, Q.data(), dim, rows, dim, 0.0f, P.data(), n);
          else sgemm(ctx, false, true, M, n, dim, a.scale, Q.data(), dim, rows, dim, 0.0f, P.data(), n);
        }
        for (int64_t r = 0; r < M; ++r) {
          float* p = P.data() + r * n;
          const int64_t vis = std::clamp<int64_t>(a.q_pos0 + t0 + r / H - a.k_pos0 + 1 - j0, 0, n);
          if (vis == 0) {
            std::fill(p, p + n, 0.0f);
            continue;
          }
          float bm = *std::max_element(p, p + vis);
          const float mn = std::max(m[size_t(r)], bm);
          const float keep = m[size_t(r)] == kNegInf ? 0.0f : std::exp(m[size_t(r)] - mn);
          const double sum = vec::exp_shifted(p, vis, mn);
          std::fill(p + vis, p + n, 0.0f);
          l[size_t(r)] = float(double(l[size_t(r)]) * keep + sum);
          m[size_t(r)] = mn;
          if (keep != 1.0f)
            for (float* o = acc + r * kvr; o < acc + (r + 1) * kvr; ++o) *o *= keep;
        }
        // One shared value: acc [M, kv_lora] += P c_KV.
        if (bf16) {
          weight_pairs(P.data(), M, n, n, pairs.data());
          pv_dpbf16(pairs.data(), M, (n + 1) / 2, Cb.data(), dim, kvr, acc);
        } else if (M <= kSmallGemmRows) gemm_nn_f32(M, kvr, n, 1.0f, P.data(), n, rows, dim, 1.0f, acc, kvr);
        else sgemm(ctx, false, false, M, kvr, n, 1.0f, P.data(), n, rows, dim, 1.0f, acc, kvr);
      }
      for (int64_t r = 0; r < M; ++r) {
        if (l[size_t(r)] == 0.0f) {
          row_lse[r] = kNegInf;
          continue;
        }
        const float inv = 1.0f / l[size_t(r)];
        for (float* o = acc + r * kvr; o < acc + (r + 1) * kvr; ++o) *o *= inv;
        row_lse[r] = m[size_t(r)] + std::log(l[size_t(r)]);
      }
    };
    float* out = out_lat + t0 * H * kvr;
    float* out_lse = lse + t0 * H;
    if (nthr == 1) {
      run(0, nblocks, out, out_lse);
      continue;
    }
#pragma omp parallel num_threads(nthr)
    {
      const int64_t id = omp_get_thread_num(), nt_ = omp_get_num_threads();
      const int64_t b0 = nblocks * id / nt_, b1 = nblocks * (id + 1) / nt_;
      run(b0, b1, parts.data() + id * M * kvr, part_lse.data() + id * M);
    }
    std::copy(parts.begin(), parts.begin() + M * kvr, out);
    std::copy(part_lse.begin(), part_lse.begin() + M, out_lse);
    for (int64_t id = 1; id < nthr; ++id)
      merge_partial(out, out_lse, parts.data() + id * M * kvr, part_lse.data() + id * M, M, kvr);
  }
}

void merge_partial(float* acc, float* acc_lse, const float* part, const float* part_lse, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) {
    float la = acc_lse[r], lb = part_lse[r];
    if (lb == kNegInf) continue;
    if (la == kNegInf) {
      std::copy(part + r * d, part + (r + 1) * d, acc + r * d);
      acc_lse[r] = lb;
      continue;
    }
    float m = std::max(la, lb), ea = std::exp(la - m), eb = std::exp(lb - m), sum = ea + eb;
    float wa = ea / sum, wb = eb / sum;
    for (int64_t i = 0; i < d; ++i) acc[r * d + i] = wa * acc[r * d + i] + wb * part[r * d + i];
    acc_lse[r] = m + std::log(sum);
  }
}

}  // namespace mla::cpu
