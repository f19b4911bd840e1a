// The kernels of INT4_GROUP and INT4_WORDS16 weights (decode.h has their layouts) and their
// registry entries: the row-major GEMVs over the tile walk (gemv_rows.h), the WORDS16 GEMVs over
// its blocks of 16 rows (float32 and bf16 activations here, int8 ones on VPDPBUSD:
// formats/int_group/vnni_gemv.h), and a row as bf16 for the prompt's bf16 GEMMs. The prompt's
// INT4 products on int8 activations are the VNNI GEMM (formats/int_group/vnni_gemm.h); the
// load-time rewrite into blocks is formats/int_group/repack.cpp.
#include "backend/cpu/formats/gemv_rows.h"
#include "backend/cpu/formats/int4/decode.h"
#include "backend/cpu/formats/int_group/scales.h"
#include "backend/cpu/formats/int_group/vnni_gemm.h"
#include "backend/cpu/formats/int_group/vnni_gemv.h"
#include "backend/cpu/formats/int_group/words16.h"
#include "backend/cpu/formats/registry.h"
#include "backend/cpu/formats/rows_bf16.h"
#include "backend/cpu/repack.h"

namespace mla::cpu {

namespace avx512 {
namespace {

// The walk both INT4_WORDS16 GEMVs share (words16_rows_f32, words16_rows_bf16): the rows [n0, n1)
// of W in whole blocks of 16, tokens in groups of up to 4. For each chunk c of 32 columns,
// chunk(tn, part, t0, p, d) adds the products of tokens t0 .. t0 + tn - 1 (tn a
// std::integral_constant: the sums stay in registers) with the block's 4 words of it (p: 16 rows'
// words d = 4c .. 4c + 3, 8 columns each) into part[t][0..3]; their sum times the rows' group
// scales goes into the token's total, stored to y at the end of the block.
template <int TN, class Chunk>
void words16_tokens(const MatrixView& W, const uint32_t* block, const uint16_t* sc, int64_t t0, float* y, int64_t ldy,
                    Chunk& chunk) {
  const int64_t Kc = W.cols / kChunk, per = W.group_size / kChunk;
  __m512 total[TN];
  for (int t = 0; t < TN; ++t) total[t] = _mm512_setzero_ps();
  int64_t in_group = 0;  // chunks of the current group done (sc: its scales)
  for (int64_t c = 0; c < Kc; ++c) {
    const uint32_t* p = block + c * 64;
    if constexpr (kPrefetch)
      for (int l = 0; l < 4; ++l) prefetch_at(p, l * 64);
    __m512 part[TN][4];
    for (auto& a : part)
      for (auto& v : a) v = _mm512_setzero_ps();
    chunk(std::integral_constant<int, TN>{}, part, t0, p, 4 * c);
    const __m512 s = words16_scales(sc);
    for (int t = 0; t < TN; ++t)
      total[t] = _mm512_fmadd_ps(
          _mm512_add_ps(_mm512_add_ps(part[t][0], part[t][1]), _mm512_add_ps(part[t][2], part[t][3])), s, total[t]);
    if (++in_group == per) in_group = 0, sc += 16;
  }
  for (int t = 0; t < TN; ++t) _mm512_storeu_ps(y + (t0 + t) * ldy, total[t]);
}

template <class Chunk>
void words16_blocks(const MatrixView& W, int64_t n0, int64_t n1, int64_t T, float* y, int64_t ldy, Chunk&& chunk) {
  const int64_t words = W.cols / 8;
  for (int64_t b = n0; b < n1; b += 16) {
    const uint32_t* block = static_cast<const uint32_t*>(W.data) + b * words;
    const uint16_t* sc = static_cast<const uint16_t*>(W.scales) + words16_scale(W.row0 + b, 0, W.scale_cols);
    for_each_token_tile(T, [&](auto tn, int64_t t0) {
      words16_tokens<decltype(tn)::value>(W, block, sc, t0, y + b, ldy, chunk);
    });
  }
}

// INT4_WORDS16 rows [n0, n1) (words16_blocks): nibble i of each word, shifted down, picks its
// code's float32 q - 8 from vpermps's table; one FMA a token against column 8d + i, broadcast
// from the unpermuted activations.
void words16_rows_f32(const GemvRows& job, int64_t n0, int64_t n1) {
  const MatrixView& W = job.W;
  const int64_t T = job.T, ldx = job.ldx, ldy = job.ldy;
  const float* x = job.x;
  float* y = job.y;
  const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  words16_blocks(W, n0, n1, T, y, ldy, [&](auto tn, auto& part, int64_t t0, const uint32_t* p, int64_t d0) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m512i w = _mm512_loadu_si512(p + v * 16);
      const float* xc = x + t0 * ldx + (d0 + v) * 8;
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        const __m512 q = _mm512_permutexvar_ps(_mm512_srli_epi32(w, 4 * i), table);
#pragma GCC unroll 4
        for (int t = 0; t < decltype(tn)::value; ++t)
          part[t][i & 3] = _mm512_fmadd_ps(q, _mm512_set1_ps(xc[t * ldx + i]), part[t][i & 3]);
      }
    }
  });
}

// INT4_WORDS16 rows [n0, n1) (words16_blocks): a 16-bit shift by 4j brings nibbles j and j + 4
// of each row's word d to the bottom of its two halves, vpermw makes them bf16 codes
// (kInt4Bf16), and VDPBF16PS multiplies them by the token's pair of columns 8d + j and
// 8d + j + 4 (Layout64::Words16), broadcast; a last chunk past the prepared steps of 64 columns
// rounds its pairs here, as prepare_bf16 does (to nearest even).
void words16_rows_bf16(const GemvFastRows& job, int64_t n0, int64_t n1) {
  const MatrixView* W = job.W;
  const int64_t T = job.T, S = job.S, ldx = job.ldx, ldy = job.ldy;
  const float* x = job.x;
  const uint16_t* xp = job.xp;
  float* y = job.y;
  const __m512i table = _mm512_load_si512(kInt4Bf16);
  const int64_t ld = S * kStep, prepared = S * 8;  // words d of the prepared steps
  words16_blocks(*W, n0, n1, T, y, ldy, [&](auto tn, auto& part, int64_t t0, const uint32_t* p, int64_t d0) {
    uint32_t tail[4][4][4];  // [token][v][j]: the pairs of a chunk past the prepared steps
    const bool in_tail = d0 >= prepared;
    if (in_tail) [[unlikely]]
      for (int t = 0; t < decltype(tn)::value; ++t)
        for (int v = 0; v < 4; ++v)
          for (int j = 0; j < 4; ++j) {
            const float* xt = x + (t0 + t) * ldx + (d0 + v) * 8 + j;
            tail[t][v][j] = uint32_t(f32_to_bf16(xt[0])) | uint32_t(f32_to_bf16(xt[4])) << 16;
          }
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m512i w = _mm512_loadu_si512(p + v * 16);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m512i q = _mm512_permutexvar_epi16(_mm512_srli_epi16(w, 4 * j), table);
#pragma GCC unroll 4
        for (int t = 0; t < decltype(tn)::value; ++t) {
          const void* pair = in_tail ? static_cast<const void*>(&tail[t][v][j]) : xp + (t0 + t) * ld + (d0 + v) * 8 + 2 * j;
          // The pair as the instruction's broadcast memory operand (a load, not a shuffle
          // beside vpermw's; GCC 12 emits the intrinsic with a separate VPBROADCASTD).
          asm("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(part[t][v]) : "v"(q), "m"(*static_cast<const int32_t*>(pair)));
        }
      }
    }
  });
}

void int4_rows_f32(const GemvRows& job, int64_t n0, int64_t n1) { job.segment<DecInt4>(n0, n1, job.xp, 1.0f); }
void int4_rows_bf16(const GemvFastRows& job, int64_t n0, int64_t n1) { job.segment<BfDecInt4>(n0, n1, nullptr, 1.0f); }
void int4_words16_rows_vnni(const GemvVnniRows& job, int64_t n0, int64_t n1) { vnni_words16_rows<Words16Block>(job, n0, n1); }

void int4_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* scales) {
  const int64_t Kc = W.cols / kChunk;
  group_chunk_scales(W, n, Kc, scales);
  decoded_row_bf16(DecInt4{row_bytes_of(W, n), scales}, Kc, out);
}
void int4_words16_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float* scales) {
  words16_row_bf16<DecInt4, 8>(W, n, out, scales, 0);
}

}  // namespace
}  // namespace avx512

using namespace avx512;

// The registry's entries (formats/registry.cpp).
extern const FormatKernels kInt4GroupFormat{.format = WeightFormat::INT4_GROUP, .name = "int4-group",
    .layout = Layout::EvenOdd, .layout64 = Layout64::EvenOdd, .element = int4_element, .groups = true,
    .gemv_f32 = int4_rows_f32, .gemv_bf16 = int4_rows_bf16, .row_bf16 = int4_row_bf16, .gemm_int8 = matmul_vnni,
    .vnni_bias = 8, .repacked = WeightFormat::INT4_WORDS16, .repack_eligible = words16_eligible,
    .repack = repack_words16};
extern const FormatKernels kInt4Words16Format{.format = WeightFormat::INT4_WORDS16, .name = "int4-words16",
    .layout = Layout::EvenOdd, .layout64 = Layout64::Words16, .row_block = 16, .element = int4_words16_element,
    .groups = true, .gemv_f32 = words16_rows_f32, .gemv_bf16 = words16_rows_bf16, .gemv_vnni = int4_words16_rows_vnni,
    .row_bf16 = int4_words16_row_bf16, .gemm_int8 = matmul_vnni, .vnni_bias = 8};

}  // namespace mla::cpu
