// The AVX-512 vocabulary every weight format's decoders and the kernels over them share: a chunk
// of 32 columns decoded into two vectors of 16 floats (a, b), a step of 64 columns into two
// vectors of 32 bf16 words, and the lane orders ("layouts") a format's decoder leaves its columns
// in (activations are permuted into the same order). Each format's decoders live in its folder
// (formats/<format>/decode.h); formats/registry.h says which layout each format decodes to.
// Internal to src/backend/cpu.
#pragma once
// GCC 12's AVX-512 headers build results on _mm512_undefined_ps(), which -Wuninitialized
// reports at every inlined use (GCC bug 105593): a false positive, silenced for these files.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

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

// Sum of the 16 lanes (GCC 12's _mm512_reduce_add_ps trips -Wuninitialized in its header).
inline float hsum(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  __m128 x = _mm512_castps512_ps128(v);
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
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

// ---- bf16 decoders of the fast precision (cpu::Precision::Fast) -------------------------------
// A step covers 64 columns of a row, decoded into two vectors of 32 bf16 words (a, b) that
// VDPBF16PS dots with bf16 activations in the same layout: float lane i sums the products of
// words 2i and 2i+1. Every decoded bf16 is the weight's exact value (times a power of two for
// fp8; the group scale of int4 is applied afterwards in float32). Each format's decode.h says
// its layout.
constexpr int64_t kStep = 64;

// Words16: INT4_WORDS16's bf16 pairs (formats/int4/kernels.cpp: words16_rows_bf16): pair 4d + j of a step holds
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

inline __m512bh as_bh(__m512i v) { return (__m512bh)v; }

}  // namespace mla::cpu::avx512
