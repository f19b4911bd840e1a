#include "backend/cpu/attention.h"

#include <omp.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "backend/cpu/common/amx.h"
#include "backend/cpu/common/avx512.h"
#include "backend/cpu/formats/bf16/dpbf16_gemm.h"
#include "backend/cpu/formats/activations.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/attention/small_gemm.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/common/transpose_avx512.h"
#include "backend/cpu/common/vec_math.h"

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
// weights in bf16 pairs (weight_pairs, np per row) and the bf16 rows v: key j's row at
// groups[j / 32] + (j % 32) ldv (key n readable when n is odd, its products then times 0). For 16
// columns at a time, the rows of two consecutive keys are interleaved into one register's dwords,
// (v[j, c], v[j + 1, c]) in lane c, and each query row's pair of weights, broadcast, multiplies
// them on VDPBF16PS: R accumulators of 16 columns, one float32 chain each.
template <int R>
void pv_rows_dpbf16(const uint32_t* pairs, int64_t np, const uint16_t* const* groups, int64_t ldv, int64_t kvr,
                    float* acc, int64_t ldacc) {
  alignas(64) static const uint16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                        8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i idx = _mm512_load_si512(kInterleave);
  for (int64_t c0 = 0; c0 < kvr; c0 += 16) {
    __m512 s[R];
    for (int r = 0; r < R; ++r) s[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g * 16 < np; ++g) {
      const uint16_t* row = groups[g] + c0;
      for (int64_t i = g * 16; i < std::min(np, g * 16 + 16); ++i, row += 2 * ldv) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + ldv));
        const __m512bh x =
            avx512::as_bh(_mm512_permutexvar_epi16(idx, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1)));
        for (int r = 0; r < R; ++r)
          s[r] = _mm512_dpbf16_ps(s[r], avx512::as_bh(_mm512_set1_epi32(int32_t(pairs[r * np + i]))), x);
      }
    }
    for (int r = 0; r < R; ++r) {
      float* o = acc + r * ldacc + c0;
      _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), s[r]));
    }
  }
}

void pv_dpbf16(const uint32_t* pairs, int64_t M, int64_t np, const uint16_t* const* groups, int64_t ldv, int64_t kvr,
               float* acc) {
  for (int64_t r0 = 0; r0 < M; r0 += 16) {
    const uint32_t* pr = pairs + r0 * np;
    float* ar = acc + r0 * kvr;
    switch (std::min<int64_t>(16, M - r0)) {
#define MLA_PV_CASE(n) \
  case n: pv_rows_dpbf16<n>(pr, np, groups, ldv, kvr, ar, kvr); break;
      MLA_PV_CASE(1) MLA_PV_CASE(2) MLA_PV_CASE(3) MLA_PV_CASE(4) MLA_PV_CASE(5) MLA_PV_CASE(6) MLA_PV_CASE(7)
      MLA_PV_CASE(8) MLA_PV_CASE(9) MLA_PV_CASE(10) MLA_PV_CASE(11) MLA_PV_CASE(12) MLA_PV_CASE(13)
      MLA_PV_CASE(14) MLA_PV_CASE(15) MLA_PV_CASE(16)
#undef MLA_PV_CASE
    }
  }
}

// The scaled bf16 queries q [M, dim] with 16 rows to a register: out[(b * dim / 2 + p) * 16 + l]
// holds column pair p of row 16 b + l (0 past M), so that one VDPBF16PS multiplies pair p of a
// block's 16 rows by the same pair of one key, broadcast.
void pack_query_lanes(const uint16_t* q, int64_t M, int64_t dim, uint32_t* out) {
  const int64_t np = dim / 2;
  for (int64_t b = 0; b < (M + 15) / 16; ++b)
    for (int64_t p = 0; p < np; ++p)
      for (int64_t l = 0; l < 16; ++l) {
        uint32_t v = 0;
        if (b * 16 + l < M) std::memcpy(&v, q + (b * 16 + l) * dim + 2 * p, sizeof v);
        out[(b * np + p) * 16 + l] = v;
      }
}

// out[k * 16 + l] = the score of query row l (lane l of q's block) against key k < KB, whose rows
// lie ld apart from `key`: over the np column pairs, each key's pair broadcast from its row as it
// lies. Two accumulators a key (even and odd pairs) keep 2 KB float32 chains in flight. pf (or
// null): KB rows ld apart to fetch towards L2 meanwhile, a cache line of each per 16 pairs.
template <int KB>
[[gnu::always_inline]] inline void key_scores(const uint32_t* q, int64_t np, const uint16_t* key, int64_t ld,
                                              const uint16_t* pf, float* out) {
  __m512 a0[KB], a1[KB];
  for (int k = 0; k < KB; ++k) a0[k] = a1[k] = _mm512_setzero_ps();
  for (int64_t p = 0; p < np; p += 2) {
    if (pf != nullptr && p % 16 == 0)
      for (int k = 0; k < KB; ++k) _mm_prefetch(reinterpret_cast<const char*>(pf + k * ld + 2 * p), _MM_HINT_T1);
    const __m512bh q0 = avx512::as_bh(_mm512_loadu_si512(q + p * 16));
    const __m512bh q1 = avx512::as_bh(_mm512_loadu_si512(q + (p + 1) * 16));
#pragma GCC unroll 8
    for (int k = 0; k < KB; ++k) {
      int32_t w0, w1;
      std::memcpy(&w0, key + k * ld + 2 * p, sizeof w0);
      std::memcpy(&w1, key + k * ld + 2 * p + 2, sizeof w1);
      a0[k] = _mm512_dpbf16_ps(a0[k], q0, avx512::as_bh(_mm512_set1_epi32(w0)));
      a1[k] = _mm512_dpbf16_ps(a1[k], q1, avx512::as_bh(_mm512_set1_epi32(w1)));
    }
  }
  for (int k = 0; k < KB; ++k) _mm512_storeu_ps(out + k * 16, _mm512_add_ps(a0[k], a1[k]));
}

// Scores P [M, n] (row stride n) of the queries qh (pack_query_lanes) against n keys, key j's row
// at groups[j / 32] + (j % 32) dim. Each block of 16 query rows scores the keys into PT [n16, 16]
// (a key's 16 scores, one store), then 16 keys at a time are transposed into P's rows.
// PT: n rounded up to 16, times 16 floats. after (or null): the rows of the 32 keys that follow
// (the caller's next block), fetched towards L2 while the last group is scored, as each group
// fetches the next: keys read where they lie come from DRAM a group ahead of their products.
void block_scores(const uint32_t* qh, int64_t M, int64_t dim, const uint16_t* const* groups, int64_t n,
                  const uint16_t* after, float* PT, float* P) {
  const int64_t np = dim / 2, n16 = (n + 15) / 16 * 16;
  for (int64_t b = 0; b * 16 < M; ++b) {
    const uint32_t* q = qh + b * np * 16;
    for (int64_t j0 = 0; j0 < n; j0 += 32) {
      const uint16_t* key = groups[j0 / 32];
      const uint16_t* next = b > 0 ? nullptr : j0 + 32 < n ? groups[j0 / 32 + 1] : after;
      const int64_t cnt = std::min<int64_t>(32, n - j0);
      int64_t k = 0;
      for (; k + 8 <= cnt; k += 8)
        key_scores<8>(q, np, key + k * dim, dim, next ? next + k * dim : nullptr, PT + (j0 + k) * 16);
      for (; k < cnt; ++k) key_scores<1>(q, np, key + k * dim, dim, nullptr, PT + (j0 + k) * 16);
    }
    std::fill(PT + n * 16, PT + n16 * 16, 0.0f);
    const int64_t rows = std::min<int64_t>(16, M - b * 16);
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_castps_si512(_mm512_loadu_ps(PT + (j0 + i) * 16));
      transpose16(r);  // r[l]: query row l's scores of the 16 keys
      const __mmask16 keep = n - j0 >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j0)) - 1);
      for (int64_t l = 0; l < rows; ++l) _mm512_mask_storeu_ps(P + (b * 16 + l) * n + j0, keep, _mm512_castsi512_ps(r[l]));
    }
  }
}

}  // namespace

const char* absorb_kernel_name(AbsorbKernel k) { return k == AbsorbKernel::Dpbf16 ? "dpbf16" : "f32"; }

bool dpbf16_absorb_supported(const AbsorbArgs& a) {
  return (a.bf16_rows || a.gather_bf16) && (a.kv_lora + a.rope) % 32 == 0 && a.kv_lora % 16 == 0;
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
  thread_local std::vector<uint32_t> qlanes_buf;
  std::vector<float>&Q = q_buf, &parts = parts_buf, &part_lse = part_lse_buf;
  std::vector<uint16_t>& Qb = qb_buf;          // Dpbf16: the scaled queries in bf16
  std::vector<uint32_t>& Qlanes = qlanes_buf;  // and 16 rows to a register (pack_query_lanes)
  Q.resize(size_t(tb * H * dim));
  if (bf16) Qb.resize(size_t(tb * H * dim)), Qlanes.resize(size_t((tb * H + 15) / 16 * 16 * dim / 2));
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
      pack_query_lanes(Qb.data(), M, dim, Qlanes.data());
    }
    // One thread's share: key blocks [b0, b1) into acc [M, kv_lora] and its lse [M].
    auto run = [&](int64_t b0, int64_t b1, float* acc, float* row_lse) {
      const vec::FlushDenormals flush;
      thread_local std::vector<float> C, P, m, l;
      thread_local std::vector<uint16_t> Cb;     // Dpbf16: rows copied (gather_bf16, or a group cut short)
      thread_local std::vector<uint32_t> pairs;  // Dpbf16: the block's weights in bf16 pairs
      thread_local std::vector<float> PT;        // Dpbf16: a block of 16 query rows' scores, key by key
      thread_local std::vector<const uint16_t*> groups;  // Dpbf16: the first row of each 32 keys
      if (bf16) {
        Cb.resize(static_cast<size_t>((kKeyBlock + 32) * dim)), pairs.resize(size_t(M * (kKeyBlock / 2)));
        PT.resize(size_t(kKeyBlock * 16)), groups.resize(size_t(kKeyBlock / 32));
      }
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
          // The keys 32 at a time: in place where bf16_rows gives them and the group is whole,
          // else copied into Cb (a zero row after an odd last key, for the paired values).
          if (!a.bf16_rows) a.gather_bf16(j0, n, Cb.data());
          for (int64_t r0 = 0; r0 < n; r0 += 32) {
            const int64_t cnt = std::min<int64_t>(32, n - r0);
            uint16_t* copy = Cb.data() + r0 * dim;
            if (a.bf16_rows) {
              const uint16_t* rows32 = a.bf16_rows(j0 + r0);
              if (cnt == 32) {
                groups[size_t(r0 / 32)] = rows32;
                continue;
              }
              std::copy(rows32, rows32 + cnt * dim, copy);
            }
            if (cnt % 2) std::fill(copy + cnt * dim, copy + (cnt + 1) * dim, uint16_t(0));
            groups[size_t(r0 / 32)] = copy;
          }
          // Scores [M, n] on VDPBF16PS, the next block's first keys fetched meanwhile.
          const int64_t j1 = j0 + kKeyBlock;
          const uint16_t* after = a.bf16_rows && b + 1 < b1 && j1 + 32 <= a.S ? a.bf16_rows(j1) : nullptr;
          block_scores(Qlanes.data(), M, dim, groups.data(), n, after, PT.data(), P.data());
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
          const float bm = vec::max_of(p, vis);
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
          pv_dpbf16(pairs.data(), M, (n + 1) / 2, groups.data(), dim, kvr, acc);
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
