#include "backend/cpu/index_score.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <stdexcept>

#include "backend/cpu/common/amx.h"
#include "backend/cpu/common/avx512.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/parallel.h"
#include "tensor/dtype.h"

namespace mla::cpu {

namespace {

constexpr int64_t kLanes = 16;       // heads per vector
constexpr int64_t kGroup = 4;        // keys sharing each load of q
constexpr int64_t kMaxBlocks = 4;    // head vectors held at once (64 heads)
constexpr int64_t kAmxKeys = 32;     // keys per amx_gemm_rows32 call
constexpr int64_t kKeyBlock = 1024;  // keys per parallel work item
constexpr int64_t kFp8Block = 128;   // values per fp8 scale

int64_t round16(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// 16 e4m3 codes to their float32 values times 2^-8... exactly: the code's bits placed as an
// IEEE half (S EEEE MMM -> S 0EEEE MMM0000000) is the value times 2^-8, subnormals included, and
// VCVTPH2PS converts it exactly (it never flushes denormal inputs).
inline __m512 fp8x16_to_f32(const uint8_t* p, __m512 mul) {
  const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)), 7),
                                    _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8));
  return _mm512_mul_ps(_mm512_cvtph_ps(h), mul);
}

float fp8_scale(const uint8_t* row, int64_t dim, int64_t block) {
  float s;
  std::memcpy(&s, row + dim + block * 4, 4);
  return s;
}

// Key row s as float32 values into out[dim] (dim % 16 == 0), as gather_index decodes it.
void decode_f32(const IndexKeyPages& k, const uint8_t* row, float* out) {
  const int64_t dim = k.dim;
  switch (k.dtype) {
    case KvDType::F32: std::memcpy(out, row, size_t(dim) * 4); break;
    case KvDType::BF16:
      for (int64_t i = 0; i < dim; i += 16)
        _mm512_storeu_ps(out + i, _mm512_castsi512_ps(_mm512_slli_epi32(
                                      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                                          reinterpret_cast<const uint16_t*>(row) + i))),
                                      16)));
      break;
    case KvDType::FP8:
      for (int64_t i = 0; i < dim; i += 16)
        _mm512_storeu_ps(out + i, fp8x16_to_f32(row + i, _mm512_set1_ps(256.0f * fp8_scale(row, dim, i / kFp8Block))));
      break;
  }
}

// Key row as bf16 words into out[dim]; returns the factor its dot products take (an fp8 key's
// scale when one scale covers the row, so the e4m3 values stay exact in bf16; else 1).
float decode_bf16(const IndexKeyPages& k, const uint8_t* row, uint16_t* out) {
  const int64_t dim = k.dim;
  alignas(64) float tmp[32];
  float factor = 1.0f;
  for (int64_t i = 0; i < dim; i += 32) {
    switch (k.dtype) {
      case KvDType::F32:
        std::memcpy(tmp, reinterpret_cast<const float*>(row) + i, 128);
        break;
      case KvDType::FP8: {
        const float s = dim <= kFp8Block ? 256.0f : 256.0f * fp8_scale(row, dim, i / kFp8Block);
        _mm512_store_ps(tmp, fp8x16_to_f32(row + i, _mm512_set1_ps(s)));
        _mm512_store_ps(tmp + 16, fp8x16_to_f32(row + i + 16, _mm512_set1_ps(s)));
        break;
      }
      case KvDType::BF16: std::memcpy(out + i, reinterpret_cast<const uint16_t*>(row) + i, 64); continue;
    }
    // _mm512_cvtne2ps_pbh(b, a): a in the low half.
    _mm512_storeu_si512(out + i, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_load_ps(tmp + 16), _mm512_load_ps(tmp))));
  }
  if (k.dtype == KvDType::FP8 && dim <= kFp8Block) factor = fp8_scale(row, dim, 0);
  return factor;
}

// acc[g][b] = q[heads of vector b] . key g over dim values; q in the kernel's layout with Hp
// heads per dim step (already offset to the first head vector).
template <int NB, int G>
inline void dot_f32(const float* qT, int64_t Hp, const float* const* rows, int64_t dim, __m512 (&acc)[G][NB]) {
  for (int g = 0; g < G; ++g)
    for (int b = 0; b < NB; ++b) acc[g][b] = _mm512_setzero_ps();
  for (int64_t d = 0; d < dim; ++d) {
    __m512 qv[NB];
    for (int b = 0; b < NB; ++b) qv[b] = _mm512_loadu_ps(qT + d * Hp + b * kLanes);
    for (int g = 0; g < G; ++g) {
      const __m512 kv = _mm512_set1_ps(rows[g][d]);
      for (int b = 0; b < NB; ++b) acc[g][b] = _mm512_fmadd_ps(qv[b], kv, acc[g][b]);
    }
  }
}

template <int NB, int G>
inline void dot_bf16(const uint32_t* qP, int64_t Hp, const uint32_t* const* rows, int64_t dim,
                     __m512 (&acc)[G][NB]) {
  for (int g = 0; g < G; ++g)
    for (int b = 0; b < NB; ++b) acc[g][b] = _mm512_setzero_ps();
  for (int64_t p = 0; p < dim / 2; ++p) {
    __m512bh qv[NB];
    for (int b = 0; b < NB; ++b) qv[b] = (__m512bh)_mm512_loadu_si512(qP + p * Hp + b * kLanes);
    for (int g = 0; g < G; ++g) {
      const __m512bh kv = (__m512bh)_mm512_set1_epi32(int(rows[g][p]));
      for (int b = 0; b < NB; ++b) acc[g][b] = _mm512_dpbf16_ps(acc[g][b], qv[b], kv);
    }
  }
}

// part[g] += sum over the NB head vectors of w relu(acc).
template <int NB, int G>
inline void weigh(const __m512 (&acc)[G][NB], const float* w, __m512 (&part)[G]) {
  for (int g = 0; g < G; ++g)
    for (int b = 0; b < NB; ++b)
      part[g] = _mm512_fmadd_ps(_mm512_max_ps(acc[g][b], _mm512_setzero_ps()), _mm512_loadu_ps(w + b * kLanes), part[g]);
}

// G keys' scores from their rows in the kernel's element type.
template <bool BF, int G>
void score_group(const IndexQuery& Q, const void* const* rows, const float* factor, float* out) {
  const int64_t Hp = round16(Q.heads), dim = Q.dim, nblocks = Hp / kLanes;
  const float* buf = Q.buf.data();
  const float* w = buf + (BF ? dim / 2 : dim) * Hp;
  __m512 part[G];
  for (int g = 0; g < G; ++g) part[g] = _mm512_setzero_ps();
  for (int64_t b0 = 0; b0 < nblocks; b0 += kMaxBlocks) {
    const int64_t nb = std::min(kMaxBlocks, nblocks - b0);
    auto run = [&]<int NB>() {
      __m512 acc[G][NB];
      if constexpr (BF)
        dot_bf16<NB, G>(reinterpret_cast<const uint32_t*>(buf) + b0 * kLanes, Hp,
                        reinterpret_cast<const uint32_t* const*>(rows), dim, acc);
      else
        dot_f32<NB, G>(buf + b0 * kLanes, Hp, reinterpret_cast<const float* const*>(rows), dim, acc);
      weigh<NB, G>(acc, w + b0 * kLanes, part);
    };
    switch (nb) {
      case 1: run.template operator()<1>(); break;
      case 2: run.template operator()<2>(); break;
      case 3: run.template operator()<3>(); break;
      default: run.template operator()<4>(); break;
    }
  }
  for (int g = 0; g < G; ++g) out[g] = avx512::hsum(part[g]) * factor[g];
}

// Keys [s0, s1) on the F32 or Bf16 kernel, kGroup at a time.
template <bool BF>
void score_vector(const IndexQuery& Q, const IndexKeyPages& k, int64_t s0, int64_t s1, float* out) {
  const int64_t dim = k.dim;
  // Rows that need converting land here (kGroup rows of the kernel's element type).
  thread_local std::vector<float> conv;
  conv.resize(size_t(kGroup * dim));
  const bool direct = BF ? k.dtype == KvDType::BF16 : k.dtype == KvDType::F32;
  const void* rows[kGroup];
  float factor[kGroup];
  auto fetch = [&](int64_t s, int g) {
    const uint8_t* r = k.row(s);
    factor[g] = 1.0f;
    if (direct) {
      rows[g] = r;
    } else if constexpr (BF) {
      uint16_t* o = reinterpret_cast<uint16_t*>(conv.data()) + g * dim;
      factor[g] = decode_bf16(k, r, o);
      rows[g] = o;
    } else {
      decode_f32(k, r, conv.data() + g * dim);
      rows[g] = conv.data() + g * dim;
    }
  };
  int64_t s = s0;
  for (; s + kGroup <= s1; s += kGroup) {
    for (int g = 0; g < kGroup; ++g) fetch(s + g, g);
    score_group<BF, kGroup>(Q, rows, factor, out + (s - s0));
  }
  for (; s < s1; ++s) {
    fetch(s, 0);
    score_group<BF, 1>(Q, rows, factor, out + (s - s0));
  }
}

// Keys [s0, s1) on AMX tiles, 32 at a time: y [heads, 32] = q k^T, then the weighted ReLU sum
// down the heads (two vectors of 16 keys per head row).
void score_amx(const IndexQuery& Q, const IndexKeyPages& k, int64_t s0, int64_t s1, float* out) {
  const int64_t dim = k.dim, heads = Q.heads, Hp = round16(heads);
  const uint16_t* qp = reinterpret_cast<const uint16_t*>(Q.buf.data());
  const float* w = Q.buf.data() + (amx_packed_size(heads, dim) + 1) / 2;
  thread_local std::vector<uint16_t> rows;
  thread_local std::vector<float> y;
  rows.resize(size_t(kAmxKeys * dim));
  y.resize(size_t(Hp * kAmxKeys));
  float factor[kAmxKeys];
  // Straight from the page: bf16 keys, 32 slots of one page (pages a multiple of 32 slots, so a
  // block never crosses a page; slots past s1 are read but their columns are not).
  const bool in_place = k.dtype == KvDType::BF16 && k.page_size % kAmxKeys == 0;
  for (int64_t j0 = s0; j0 < s1; j0 += kAmxKeys) {
    const int64_t n = std::min(kAmxKeys, s1 - j0);
    const uint16_t* W;
    if (in_place && j0 % kAmxKeys == 0) {
      W = reinterpret_cast<const uint16_t*>(k.row(j0));
      std::fill(factor, factor + n, 1.0f);
    } else {
      for (int64_t j = 0; j < kAmxKeys; ++j) {
        uint16_t* o = rows.data() + j * dim;
        if (j < n) factor[j] = decode_bf16(k, k.row(j0 + j), o);
        else std::fill(o, o + dim, uint16_t(0));
      }
      W = rows.data();
    }
    amx_gemm_rows32(qp, heads, dim, W, dim, n, false, y.data(), kAmxKeys);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (int64_t h = 0; h < heads; ++h) {
      const __m512 wh = _mm512_set1_ps(w[h]);
      a0 = _mm512_fmadd_ps(_mm512_max_ps(_mm512_loadu_ps(y.data() + h * kAmxKeys), _mm512_setzero_ps()), wh, a0);
      a1 = _mm512_fmadd_ps(_mm512_max_ps(_mm512_loadu_ps(y.data() + h * kAmxKeys + 16), _mm512_setzero_ps()), wh, a1);
    }
    alignas(64) float sc[kAmxKeys];
    _mm512_store_ps(sc, a0);
    _mm512_store_ps(sc + 16, a1);
    for (int64_t j = 0; j < n; ++j) out[j0 - s0 + j] = sc[j] * factor[j];
  }
}

}  // namespace

const char* index_kernel_name(IndexKernel k) {
  switch (k) {
    case IndexKernel::F32: return "index-f32";
    case IndexKernel::Bf16: return "index-avx512-bf16";
    case IndexKernel::Amx: return "index-amx";
  }
  return "?";
}

bool index_kernel_supported(IndexKernel k, int64_t dim) {
  // The key decoders work 32 values at a time (the Amx kernel's tile steps too).
  if (dim <= 0 || dim % 32 != 0) return false;
  return k != IndexKernel::Amx || host_features().amx;
}

void IndexQuery::prepare(IndexKernel k, const float* q, const float* w, int64_t h, int64_t d) {
  if (!index_kernel_supported(k, d))
    throw std::logic_error(std::string("IndexQuery: ") + index_kernel_name(k) + " does not run here for dim " +
                           std::to_string(d));
  kernel = k, heads = h, dim = d;
  const int64_t Hp = round16(h);
  int64_t qfloats = 0;
  switch (k) {
    case IndexKernel::F32: qfloats = d * Hp; break;
    case IndexKernel::Bf16: qfloats = d / 2 * Hp; break;
    case IndexKernel::Amx: qfloats = (amx_packed_size(h, d) + 1) / 2; break;
  }
  buf.assign(size_t(qfloats + Hp), 0.0f);
  float* wb = buf.data() + qfloats;
  std::copy(w, w + h, wb);
  switch (k) {
    case IndexKernel::F32:
      for (int64_t hh = 0; hh < h; ++hh)
        for (int64_t i = 0; i < d; ++i) buf[size_t(i * Hp + hh)] = q[hh * d + i];
      break;
    case IndexKernel::Bf16: {
      uint32_t* qp = reinterpret_cast<uint32_t*>(buf.data());
      for (int64_t hh = 0; hh < h; ++hh)
        for (int64_t p = 0; p < d / 2; ++p)
          qp[p * Hp + hh] = uint32_t(f32_to_bf16(q[hh * d + 2 * p])) | uint32_t(f32_to_bf16(q[hh * d + 2 * p + 1])) << 16;
      break;
    }
    case IndexKernel::Amx: {
      std::vector<uint16_t> qb(size_t(h * d));
      for (int64_t i = 0; i < h * d; ++i) qb[size_t(i)] = f32_to_bf16(q[i]);
      amx_pack_activations(qb.data(), h, d, d, reinterpret_cast<uint16_t*>(buf.data()));
      break;
    }
  }
}

void index_scores(const Context& ctx, const IndexQuery& q, const IndexKeyPages& keys, int64_t n, float* score) {
  if (keys.dim != q.dim) throw std::invalid_argument("index_scores: the query and the keys differ in dim");
  const int64_t blocks = (n + kKeyBlock - 1) / kKeyBlock;
  parallel_for(ctx, blocks, n >= 2 * kKeyBlock, [&](int64_t b) {
    const int64_t s0 = b * kKeyBlock, s1 = std::min(n, s0 + kKeyBlock);
    switch (q.kernel) {
      case IndexKernel::F32: score_vector<false>(q, keys, s0, s1, score + s0); break;
      case IndexKernel::Bf16: score_vector<true>(q, keys, s0, s1, score + s0); break;
      case IndexKernel::Amx: score_amx(q, keys, s0, s1, score + s0); break;
    }
  });
}

void index_scores_reference(const IndexKeyPages& keys, const float* q, const float* w, int64_t heads, int64_t n,
                            float* score) {
  const int64_t dim = keys.dim;
  std::vector<float> k(static_cast<size_t>(dim));
  for (int64_t s = 0; s < n; ++s) {
    const uint8_t* row = keys.row(s);
    for (int64_t i = 0; i < dim; ++i) {
      switch (keys.dtype) {
        case KvDType::F32: std::memcpy(&k[size_t(i)], row + 4 * i, 4); break;
        case KvDType::BF16: {
          uint16_t b;
          std::memcpy(&b, row + 2 * i, 2);
          k[size_t(i)] = bf16_to_f32(b);
          break;
        }
        case KvDType::FP8: k[size_t(i)] = fp8e4m3_to_f32(row[i]) * fp8_scale(row, dim, i / kFp8Block); break;
      }
    }
    double total = 0;
    for (int64_t h = 0; h < heads; ++h) {
      double d = 0;
      for (int64_t i = 0; i < dim; ++i) d += double(q[h * dim + i]) * double(k[size_t(i)]);
      total += double(w[h]) * std::max(d, 0.0);
    }
    score[s] = float(total);
  }
}

// ---- top-k ----------------------------------------------------------------------------------

namespace {

// The order-preserving image of a score: larger score, larger key; -0 as +0.
inline uint32_t order_key(float f) {
  uint32_t u;
  f += 0.0f;  // -0 + 0 = +0
  std::memcpy(&u, &f, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

constexpr int64_t kTopkChunk = 8192;  // scores per thread's share of a pass

}  // namespace

void topk_positions(const Context& ctx, const float* score, int64_t n, int64_t k, int32_t* out) {
  if (k >= n) {
    std::iota(out, out + n, 0);
    return;
  }
  if (k <= 0) return;
  const int64_t chunks = (n + kTopkChunk - 1) / kTopkChunk;
  const bool split = n >= 2 * kTopkChunk;
  thread_local std::vector<uint32_t> hist;
  thread_local std::vector<int64_t> gt, eq;
  // Three passes narrow the k-th largest key: bits 31..21, 20..10, 9..0. Within the prefix found
  // so far, `need` is how many of the k lie at or below the current bin.
  uint32_t prefix = 0;
  int64_t need = k;
  const int shifts[3] = {21, 10, 0}, widths[3] = {11, 11, 10};
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = shifts[pass], bins = 1 << widths[pass];
    const int hi_shift = shift + widths[pass];  // bits above this pass's are the prefix
    hist.assign(size_t(chunks * bins), 0);
    uint32_t* H = hist.data();
    parallel_for(ctx, chunks, split, [&](int64_t c) {
      uint32_t* h = H + c * bins;
      const int64_t s1 = std::min(n, (c + 1) * kTopkChunk);
      for (int64_t s = c * kTopkChunk; s < s1; ++s) {
        const uint32_t key = order_key(score[s]);
        if (hi_shift < 32 && (key >> hi_shift) != prefix) continue;
        h[(key >> shift) & uint32_t(bins - 1)]++;
      }
    });
    for (int64_t c = 1; c < chunks; ++c)
      for (int b = 0; b < bins; ++b) H[b] += H[c * bins + b];
    int b = bins - 1;
    for (; b > 0 && int64_t(H[b]) < need; --b) need -= H[b];
    prefix = (prefix << widths[pass]) | uint32_t(b);
  }
  // prefix: the k-th largest key; `need` of those equal to it are taken, lowest positions first.
  const uint32_t kth = prefix;
  // (The thread_local buffers by pointer: inside the regions their names are the workers' own.)
  gt.assign(size_t(chunks), 0);
  eq.assign(size_t(chunks), 0);
  int64_t *const G = gt.data(), *const E = eq.data();
  parallel_for(ctx, chunks, split, [&](int64_t c) {
    const int64_t s1 = std::min(n, (c + 1) * kTopkChunk);
    int64_t g = 0, e = 0;
    for (int64_t s = c * kTopkChunk; s < s1; ++s) {
      const uint32_t key = order_key(score[s]);
      g += key > kth;
      e += key == kth;
    }
    G[c] = g, E[c] = e;
  });
  // Chunk c writes from offset[c], taking take[c] of its equal keys (in place of G and E).
  int64_t *const offset = G, *const take = E;
  int64_t at = 0, left = need;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t g = G[c], t = std::min(E[c], left);
    left -= t;
    offset[c] = at;
    take[c] = t;
    at += g + t;
  }
  parallel_for(ctx, chunks, split, [&](int64_t c) {
    const int64_t s1 = std::min(n, (c + 1) * kTopkChunk);
    int32_t* o = out + offset[c];
    int64_t t = take[c];
    for (int64_t s = c * kTopkChunk; s < s1; ++s) {
      const uint32_t key = order_key(score[s]);
      if (key > kth || (key == kth && t-- > 0)) *o++ = int32_t(s);
    }
  });
}

void topk_positions_reference(const float* score, int64_t n, int64_t k, int32_t* out) {
  std::vector<int32_t> ord(static_cast<size_t>(n));
  std::iota(ord.begin(), ord.end(), 0);
  k = std::min(k, n);
  std::nth_element(ord.begin(), ord.begin() + k, ord.end(), [score](int32_t a, int32_t b) {
    return score[a] > score[b] || (score[a] == score[b] && a < b);
  });
  std::copy(ord.begin(), ord.begin() + k, out);
  std::sort(out, out + k);
}

}  // namespace mla::cpu
