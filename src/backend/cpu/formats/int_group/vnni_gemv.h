// The decode GEMV of the WORDS16 formats on int8 activations (Kernel::GemvVnni): INT4_WORDS16 and
// INT8_WORDS16 blocks of 16 rows (vnni_gemm.h's Words16Block, Int8Words16Block) on VNNI's
// VPDPBUSD, the activations quantized to int8 per chunk of 32 as the prompt's VNNI GEMM does
// (activations_int8, formats/gemm.h), with the same results. One sequential stream of 64-byte
// vectors of 16 rows. formats/int4/kernels.cpp and formats/int8/kernels.cpp instantiate it.
// Internal to src/backend/cpu.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cpu/common/avx512.h"
#include "backend/cpu/common/stream_prefetch.h"
#include "backend/cpu/formats/gemv_rows.h"
#include "backend/cpu/formats/int_group/vnni_gemm.h"

namespace mla::cpu::avx512 {

namespace {  // internal linkage, as the decoders' (decode.h)

// The VNNI GEMV's blocks are one sequential stream (16 rows' 4 or 8 columns a 64-byte vector),
// which it prefetches a page at a time (touch_page_ahead, stream_prefetch.h). Its scales, a
// second stream of 32 bytes a chunk, it prefetches a line every other chunk, this many bytes of
// codes ahead of the chunk it computes; a work unit fetches its first this many bytes of codes
// into L1 as it starts. The distances were measured when the codes too were prefetched a line at
// a time (batches of 12 experts from DRAM as a decode step's, 2 threads, one token, GB/s relative
// to 2 KiB: INT4 8 KiB 1.09-1.21, INT8 8 KiB 0.94-0.97).
template <class Block>
constexpr int64_t kVnniPrefetchBytes = std::is_same_v<Block, Int8Words16Block> ? 2048 : 8192;

// Rows b .. b + 15 (blk: vnni_gemm.h's Words16Block or Int8Words16Block) for tokens
// t0 .. t0 + TN - 1: per chunk of 32 columns, each token's integer sum starts at its correction
// qc, takes the block's 8 code vectors by VPDPBUSD against the token's 4 activation codes
// broadcast, and adds into the float32 total as the VNNI GEMM's micro kernel does (the same
// block reader, the same operations in the same order: equal results).
template <int TN, class Block>
[[gnu::always_inline]] inline void vnni_words16_block(const Block blk, int64_t Kc, const int8_t* q, int64_t ldq,
                                                      const float* qs, const int32_t* qc, int64_t lds, float* y,
                                                      int64_t ldy) {
  constexpr int64_t kAhead = kVnniPrefetchBytes<Block> / Block::kChunkBytes;  // chunks
  const char* p = reinterpret_cast<const char*>(blk.p);
  __m512 f[TN];
  for (int t = 0; t < TN; ++t) f[t] = _mm512_setzero_ps();
  for (int64_t c = 0; c < Kc; ++c, p += Block::kChunkBytes) {
    touch_page_ahead<Block::kChunkBytes>(p);
    // The scales' stream, 32 bytes a group of 16 rows: a line every other chunk.
    if ((c & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(blk.s + (c + kAhead) / blk.per * 16), _MM_HINT_T0);
    __m512i acc[TN];
    for (int t = 0; t < TN; ++t) acc[t] = _mm512_set1_epi32(qc[t * lds + c]);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512i w = blk.code(c, j);
      for (int t = 0; t < TN; ++t) {
        // The activations' 4 codes as the instruction's broadcast memory operand (vnni_gemm.cpp).
        const void* a = q + t * ldq + c * kChunk + 4 * j;
        asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc[t]) : "v"(w), "m"(*static_cast<const int32_t*>(a)));
      }
    }
    const __m512 s = blk.scale(c);
    for (int t = 0; t < TN; ++t)
      f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t]), _mm512_mul_ps(s, _mm512_set1_ps(qs[t * lds + c])), f[t]);
  }
  for (int t = 0; t < TN; ++t) _mm512_storeu_ps(y + t * ldy, f[t]);
}

// The rows [n0, n1) (whole blocks of 16) of a GEMV job on int8 activations.
template <class Block>
void vnni_words16_rows(const GemvVnniRows& job, int64_t n0, int64_t n1) {
  const MatrixView* W = job.W;
  const int8_t* q = job.q;
  const float* qs = job.qs;
  const int32_t* qc = job.qc;
  const int64_t T = job.T, ldy = job.ldy;
  float* y = job.y;
  const int64_t K = W->cols, Kc = K / kChunk;
  // A unit starts its stream cold: its first kVnniPrefetchBytes into L1 at once (the kernel's
  // page touches run two pages ahead of it; touching the unit's second page here too measured
  // alike).
  constexpr int64_t kAheadBytes = kVnniPrefetchBytes<Block>;
  const char* start = reinterpret_cast<const char*>(words16_block<Block>(*W, n0).p);
  const int64_t bytes = (n1 - n0) * int64_t(W->row_bytes());
  for (int64_t o = 0; o < std::min(kAheadBytes, bytes); o += 64) _mm_prefetch(start + o, _MM_HINT_T0);
  for (int64_t b = n0; b < n1; b += 16) {
    const Block blk = words16_block<Block>(*W, b);
    for_each_token_tile(T, [&](auto tn, int64_t t0) {
      vnni_words16_block<decltype(tn)::value>(blk, Kc, q + t0 * K, K, qs + t0 * Kc, qc + t0 * Kc, Kc, y + t0 * ldy + b, ldy);
    });
  }
}

}  // namespace

}  // namespace mla::cpu::avx512
