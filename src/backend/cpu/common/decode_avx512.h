// AVX-512 decoders of the weight formats, shared by the GEMV kernels (gemv.cpp) and the bf16
// GEMM path (gemm.cpp). A step covers 32 columns ("a chunk") of a weight row, decoded into two
// vectors of 16 floats (a, b). Which columns land in which lane depends on the format, chosen so
// the decode is a couple of integer ops; activations are permuted into the same layout.
//   bf16: a = even columns (word << 16), b = odd columns (word & 0xffff0000)
//   int4: a = even columns, b = odd: each byte's low / high nibble, zero-extended to a lane,
//         indexes a 16-entry table of (q - 8) * scale (vpermps)
//   fp8:  sign-extended byte << 20, masked: the e4m3 bits as a float32, 2^-120 times the value
//         (block scales are applied by the caller)
//   int8: natural order, each byte sign-extended and converted, times the chunk's scale
//   f16, f32: natural order
// Internal to src/backend/cpu.
#pragma once
// GCC 12's AVX-512 headers build results on _mm512_undefined_ps(), which -Wuninitialized
// reports at every inlined use (GCC bug 105593): a false positive, silenced for these files.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "tensor/dtype.h"
#include "tensor/matrix.h"

namespace mla::cpu::avx512 {

constexpr int64_t kChunk = 32;

enum class Layout { Natural, EvenOdd };

// The column (0..31 within the chunk) held by lane 0..15 of a, or 16..31 of b.
inline int layout_col(Layout l, int lane) {
  const int j = lane & 15, b = lane >> 4;
  switch (l) {
    case Layout::Natural: return lane;
    case Layout::EvenOdd: return 2 * j + b;
  }
  return lane;
}

inline Layout layout_of(WeightFormat f) {
  switch (f) {
    case WeightFormat::BF16:
    case WeightFormat::INT4_GROUP:
    case WeightFormat::INT4_WORDS16: return Layout::EvenOdd;
    default: return Layout::Natural;
  }
}

inline bool fast_supported(const MatrixView& W) {
  return !is_int_group(W.format) || (W.group_size > 0 && W.group_size % kChunk == 0);
}

// One weight, as MatrixView::dequant_row computes it (for the columns past the last full chunk).
inline float element(const MatrixView& W, int64_t r, int64_t k) {
  if (W.format == WeightFormat::BF16_PAIRS32)
    return bf16_to_f32(static_cast<const uint16_t*>(W.data)[pairs32_word(r, k, W.cols)]);
  if (W.format == WeightFormat::INT4_WORDS16) {
    const uint32_t w = static_cast<const uint32_t*>(W.data)[words16_word(r, k, W.cols)];
    const uint16_t s = static_cast<const uint16_t*>(W.scales)[words16_scale(W.row0 + r, k / W.group_size, W.scale_cols)];
    return float(int((w >> (4 * (k % 8))) & 0xF) - 8) * bf16_to_f32(s);
  }
  if (W.format == WeightFormat::INT8_WORDS16) {
    const uint8_t b = static_cast<const uint8_t*>(W.data)[4 * int8_words16_word(r, k, W.cols) + k % 4];
    const uint16_t s = static_cast<const uint16_t*>(W.scales)[words16_scale(W.row0 + r, k / W.group_size, W.scale_cols)];
    return float(int(b) - 128) * bf16_to_f32(s);
  }
  const uint8_t* p = static_cast<const uint8_t*>(W.data) + size_t(r) * W.row_bytes();
  switch (W.format) {
    case WeightFormat::F32: { float f; std::memcpy(&f, p + 4 * k, 4); return f; }
    case WeightFormat::BF16: { uint16_t h; std::memcpy(&h, p + 2 * k, 2); return bf16_to_f32(h); }
    case WeightFormat::F16: { uint16_t h; std::memcpy(&h, p + 2 * k, 2); return f16_to_f32(h); }
    case WeightFormat::FP8_BLOCK128:
      return fp8e4m3_to_f32(p[k]) * static_cast<const float*>(W.scales)[((W.row0 + r) / 128) * W.scale_cols + k / 128];
    case WeightFormat::INT4_GROUP: {
      uint32_t w;
      std::memcpy(&w, p + 4 * (k / 8), 4);
      int q = int((w >> (4 * (k % 8))) & 0xF) - 8;
      return float(q) * bf16_to_f32(static_cast<const uint16_t*>(W.scales)[(W.row0 + r) * W.scale_cols + k / W.group_size]);
    }
    case WeightFormat::INT8_GROUP:
      return float(int8_t(p[k])) *
             bf16_to_f32(static_cast<const uint16_t*>(W.scales)[(W.row0 + r) * W.scale_cols + k / W.group_size]);
    case WeightFormat::BF16_PAIRS32: case WeightFormat::INT4_WORDS16: case WeightFormat::INT8_WORDS16: break;  // above
  }
  return 0;
}

// Sum of the 16 lanes (GCC 12's _mm512_reduce_add_ps trips -Wuninitialized in its header).
inline float hsum(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  __m128 x = _mm512_castps512_ps128(v);
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// The group scales (INT4, INT8) of row n as float32, one per chunk of 32 columns.
inline void group_chunk_scales(const MatrixView& W, int64_t n, int64_t Kc, float* s) {
  if (is_words16(W.format)) {
    const uint16_t* src = static_cast<const uint16_t*>(W.scales);
    for (int64_t c = 0; c < Kc; ++c)
      s[c] = bf16_to_f32(src[words16_scale(W.row0 + n, c * kChunk / W.group_size, W.scale_cols)]);
    return;
  }
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
}

// The bf16 scales of one group of a WORDS16 block (its 16 rows, s[0..15]) as float32.
inline __m512 words16_scales(const uint16_t* s) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// ---- decoders: decode(c, a, b) writes chunk c of the row -------------------------------------

// prefetch(c): the cache line kPrefetchBytes past chunk c of the row, into L2. The rows of a
// weight lie back to back, so this reaches a few rows on: the tile after next for bf16 (4 KiB
// rows at 2048 columns), further for FP8 and INT4. Measured with bench/matmul on the 2-core
// development machine, T = 1: 16 KiB into L2 streamed bf16 at 0.86-0.91 of the read loop, FP8
// at 0.65-0.73, INT4 at 0.52-0.57, against 0.72-0.90, 0.45-0.56 and 0.33-0.46 for 1 KiB into
// L1 (L1 fill buffers held for a whole DRAM round trip limit how much is in flight; 32 KiB
// ahead was worse again).
constexpr int64_t kPrefetchBytes = 16384;
inline void prefetch_at(const void* p, int64_t offset) {
  _mm_prefetch(static_cast<const char*>(p) + offset + kPrefetchBytes, _MM_HINT_T1);
}

struct DecF32 {
  const float* row;
  void prefetch(int64_t c) const { prefetch_at(row, c * kChunk * 4), prefetch_at(row, c * kChunk * 4 + 64); }
  void decode(int64_t c, __m512& a, __m512& b) const {
    a = _mm512_loadu_ps(row + c * kChunk);
    b = _mm512_loadu_ps(row + c * kChunk + 16);
  }
};

struct DecF16 {
  const uint16_t* row;
  void prefetch(int64_t c) const { prefetch_at(row, c * kChunk * 2); }
  void decode(int64_t c, __m512& a, __m512& b) const {
    a = _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + c * kChunk)));
    b = _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + c * kChunk + 16)));
  }
};

struct DecBF16 {
  const uint16_t* row;
  void prefetch(int64_t c) const { prefetch_at(row, c * kChunk * 2); }
  void decode(int64_t c, __m512& a, __m512& b) const {
    __m512i v = _mm512_loadu_si512(row + c * kChunk);
    a = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    b = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u))));
  }
};

inline __m512 fp8_bits(__m512i sx) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(sx, 20), _mm512_set1_epi32(int(0x87f00000u))));
}

struct DecFP8 {
  const uint8_t* row;
  void prefetch(int64_t c) const {
    if ((c & 1) == 0) prefetch_at(row, c * kChunk);
  }
  void decode(int64_t c, __m512& a, __m512& b) const {
    a = fp8_bits(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c * kChunk))));
    b = fp8_bits(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c * kChunk + 16))));
  }
};

struct DecInt4 {
  const uint8_t* row;
  const float* scale;  // per chunk, float32
  void prefetch(int64_t c) const {
    if ((c & 3) == 0) prefetch_at(row, c * 16);
  }
  void decode(int64_t c, __m512& a, __m512& b) const {
    const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    // Byte i holds columns 2i (low nibble) and 2i+1 (high nibble). vpermps reads the low 4 bits
    // of each index: byte i zero-extended gives the low nibble; the 16-bit shift by 4 (a 128-bit
    // op, which leaves the 512-bit ports to the rest) brings each byte's high nibble down.
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c * 16));
    const __m512 t = _mm512_mul_ps(table, _mm512_set1_ps(scale[c]));
    a = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(v), t);
    b = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_srli_epi16(v, 4)), t);
  }
};

// Bytes c*32 .. c*32+31 of an int8 row as float32 (natural order).
inline void int8_floats(const uint8_t* p, __m512& a, __m512& b) {
  a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16))));
}

struct DecInt8 {
  const uint8_t* row;
  const float* scale;  // per chunk, float32
  void prefetch(int64_t c) const {
    if ((c & 1) == 0) prefetch_at(row, c * kChunk);
  }
  void decode(int64_t c, __m512& a, __m512& b) const {
    int8_floats(row + c * kChunk, a, b);
    const __m512 s = _mm512_set1_ps(scale[c]);
    a = _mm512_mul_ps(a, s);
    b = _mm512_mul_ps(b, s);
  }
};

// ---- bf16 decoders of the fast precision (cpu::Precision::Fast) -------------------------------
// A step covers 64 columns of a row, decoded into two vectors of 32 bf16 words (a, b) that
// VDPBF16PS dots with bf16 activations in the same layout: float lane i sums the products of
// words 2i and 2i+1. Every decoded bf16 is the weight's exact value (times a power of two for
// fp8; the group scale of int4 is applied afterwards in float32).
//   bf16: natural order (a = columns 0..31, b = 32..63), no conversion
//   fp8:  a = per 128-bit lane L, columns 16L..16L+7, b = 16L+8..16L+15 (unpacklo / unpackhi of
//         bytes into words). Word = the e4m3 bits S EEEE MMM placed as bf16 bits S 0000EEEE MMM0000
//         (the same as the byte in a word's high half, arithmetic-shifted right by 4, masked with
//         0x87f0): a bf16 2^-120 times the value. Two GF2P8AFFINEQB build the words' high bytes
//         (S0000EEE) and low bytes (EMMM0000) of all 64 bytes at once, unpack interleaves them.
//         Exponent-0 codes come out as bf16 denormals, which VDPBF16PS reads as zero: decode()
//         reports them (a mask of the step's bytes) so that the caller adds the subnormals'
//         products itself.
//   int4: a = low nibbles (even columns), b = high nibbles (odd columns) of the 32 bytes,
//         zero-extended to words, through a 32-word table of bf16(q - 8) (vpermw reads 5 bits:
//         the table repeats, so the next nibble's low bit does not matter). Lanes 0..7 hold
//         columns 0..31 (group of chunk 2s), lanes 8..15 columns 32..63 (chunk 2s + 1).
// INT8 has no decoder here: its float32 kernel (DecInt8: sign-extend, convert, FMA) streams
// faster than a conversion on to bf16 before VDPBF16PS could (gemv_kernel, dispatch.cpp).
constexpr int64_t kStep = 64;

// Words16: INT4_WORDS16's bf16 pairs (gemv.cpp's FastRows::words16): pair 4d + j of a step holds
// columns 8d + j and 8d + j + 4, the two nibbles a 16-bit shift by 4j puts at the bottom of a
// word's two halves.
enum class Layout64 { Natural, Fp8Unpack, EvenOdd, Words16 };

// The column (0..63 within the step) held by word w: 0..31 of a, 32..63 of b.
inline int layout64_col(Layout64 l, int w) {
  const int v = w >> 5, j = w & 31;
  switch (l) {
    case Layout64::Natural: return w;
    case Layout64::Fp8Unpack: return (j >> 3) * 16 + v * 8 + (j & 7);
    case Layout64::EvenOdd: return 2 * j + v;
    case Layout64::Words16: return (w / 8) * 8 + (w / 2) % 4 + 4 * (w % 2);
  }
  return w;
}

inline Layout64 layout64_of(WeightFormat f) {
  switch (f) {
    case WeightFormat::FP8_BLOCK128: return Layout64::Fp8Unpack;
    case WeightFormat::INT4_GROUP: return Layout64::EvenOdd;
    case WeightFormat::INT4_WORDS16: return Layout64::Words16;
    default: return Layout64::Natural;
  }
}

// The formats with a bf16 kernel (f32, f16 and int8 weights keep the float32 kernels in both
// modes).
inline bool bf16_kernel(const MatrixView& W) {
  if (W.format == WeightFormat::BF16_PAIRS32) return W.cols % 64 == 0;  // the prepared activations' steps
  if (W.format == WeightFormat::INT4_WORDS16) return true;  // a last half step rounds its own pairs
  return W.format == WeightFormat::BF16 || W.format == WeightFormat::FP8_BLOCK128 ||
         (W.format == WeightFormat::INT4_GROUP && W.group_size > 0 && W.group_size % kChunk == 0);
}

inline __m512bh as_bh(__m512i v) { return (__m512bh)v; }

struct BfDecBF16 {
  static constexpr int kStepsPerScale = 0;  // no scale
  const uint16_t* row;
  void prefetch(int64_t s) const { prefetch_at(row, s * kStep * 2), prefetch_at(row, s * kStep * 2 + 64); }
  uint64_t decode(int64_t s, __m512i& a, __m512i& b) const {
    a = _mm512_loadu_si512(row + s * kStep);
    b = _mm512_loadu_si512(row + s * kStep + 32);
    return 0;
  }
};

struct BfDecFP8 {
  static constexpr int kStepsPerScale = 2;  // one block scale per 128 columns
  const uint8_t* row;
  const float* scales;  // the row block's scales, one per 128 columns
  void prefetch(int64_t s) const { prefetch_at(row, s * kStep); }
  // Bit matrices of GF2P8AFFINEQB: output bit i is the parity of (byte 7 - i of the matrix) & x.
  static constexpr uint64_t gf_matrix(const int (&src)[8]) {  // src[i]: input bit to output bit i, or -1
    uint64_t m = 0;
    for (int i = 0; i < 8; ++i)
      if (src[i] >= 0) m |= uint64_t(1u << src[i]) << (8 * (7 - i));
    return m;
  }
  static constexpr int kHigh[8] = {4, 5, 6, -1, -1, -1, -1, 7};  // S0000EEE: E3..E1, sign
  static constexpr int kLow[8] = {-1, -1, -1, -1, 0, 1, 2, 3};   // EMMM0000: E0, mantissa
  // The words of 64 codes (a, b), and the codes with exponent field 0 (zero and the
  // subnormals, which need fixing up).
  static uint64_t words(__m512i raw, __m512i& a, __m512i& b) {
    const __m512i hi = _mm512_gf2p8affine_epi64_epi8(raw, _mm512_set1_epi64(int64_t(gf_matrix(kHigh))), 0);
    const __m512i lo = _mm512_gf2p8affine_epi64_epi8(raw, _mm512_set1_epi64(int64_t(gf_matrix(kLow))), 0);
    a = _mm512_unpacklo_epi8(lo, hi);
    b = _mm512_unpackhi_epi8(lo, hi);
    return _mm512_testn_epi8_mask(raw, _mm512_set1_epi8(0x78));
  }
  // Calls add(w, v) for each subnormal code among a step's 64 bytes (mask: the codes of
  // exponent field 0, as words() reports them; zeros are skipped): v = its value times scale,
  // w = the word (0..63: a, then b) that holds it.
  template <class Add>
  static void subnormals(const uint8_t* bytes, uint64_t mask, float scale, Add&& add) {
    while (mask) {
      const int i = __builtin_ctzll(mask);
      mask &= mask - 1;
      const int m = bytes[i] & 7;
      if (m == 0) continue;
      add(((i >> 3) & 1) * 32 + (i >> 4) * 8 + (i & 7), float(bytes[i] & 0x80 ? -m : m) * (1.0f / 512.0f) * scale);
    }
  }
  uint64_t decode(int64_t s, __m512i& a, __m512i& b) const {
    return words(_mm512_loadu_si512(row + s * kStep), a, b);
  }
  __m512 scale(int64_t s) const { return _mm512_set1_ps(scales[s / kStepsPerScale]); }
};

// bf16 bits of the integers -8..7, repeated: entry i is bf16((i & 15) - 8).
constexpr uint16_t bf16_of_small_int(int q) {
  if (q == 0) return 0;
  const uint16_t sign = q < 0 ? 0x8000 : 0;
  int a = q < 0 ? -q : q, e = 0;
  while ((a >> (e + 1)) != 0) ++e;
  return uint16_t(sign | (127 + e) << 7 | ((a << (7 - e)) & 0x7f));
}

// Lanes 0..7: the scale of chunk 2s, lanes 8..15: chunk 2s + 1 (INT4 and INT8 steps).
inline __m512 chunk_pair_scale(const float* scales, int64_t s) {
  const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  return _mm512_permutexvar_ps(idx, _mm512_loadu_ps(scales + 2 * s));
}

// vpermw's table of INT4 codes: word i holds bf16((i & 15) - 8), the code of i's low nibble
// (vpermw reads an index's low 5 bits: bit 4 may hold anything).
alignas(64) inline constexpr uint16_t kInt4Bf16[32] = {
#define MLA_Q(i) bf16_of_small_int(((i) & 15) - 8)
    MLA_Q(0),  MLA_Q(1),  MLA_Q(2),  MLA_Q(3),  MLA_Q(4),  MLA_Q(5),  MLA_Q(6),  MLA_Q(7),
    MLA_Q(8),  MLA_Q(9),  MLA_Q(10), MLA_Q(11), MLA_Q(12), MLA_Q(13), MLA_Q(14), MLA_Q(15),
    MLA_Q(16), MLA_Q(17), MLA_Q(18), MLA_Q(19), MLA_Q(20), MLA_Q(21), MLA_Q(22), MLA_Q(23),
    MLA_Q(24), MLA_Q(25), MLA_Q(26), MLA_Q(27), MLA_Q(28), MLA_Q(29), MLA_Q(30), MLA_Q(31)};
#undef MLA_Q

struct BfDecInt4 {
  static constexpr int kStepsPerScale = 1;
  const uint8_t* row;
  const float* scales;  // per chunk of 32 columns, float32, readable 16 past the last chunk
  void prefetch(int64_t s) const {
    if ((s & 1) == 0) prefetch_at(row, s * 32);
  }
  uint64_t decode(int64_t s, __m512i& a, __m512i& b) const {
    const __m512i table = _mm512_load_si512(kInt4Bf16);
    const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + s * 32)));
    a = _mm512_permutexvar_epi16(v, table);
    b = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), table);
    return 0;
  }
  __m512 scale(int64_t s) const { return chunk_pair_scale(scales, s); }
};


}  // namespace mla::cpu::avx512
