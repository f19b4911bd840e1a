// A 16 x 16 transpose of dwords in AVX-512 registers, shared by the GEMM kernels that
// reorder a block of weight rows into column groups (bf16 column pairs: fma_gemm.cpp,
// dpbf16_gemm.cpp; int8 column quads: vnni_gemm.cpp). Internal to src/backend/cpu.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <vector>

namespace mla::cpu {

// Transposes 16 rows of 16 dwords: r[j] holds dword j of every row afterwards.
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xDD);
    r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xDD);
  }
}

// True where 32 rows `row_bytes` apart start in at most 4 of L1's 64 sets of lines (a stride
// of a multiple of 1 KiB: 2048 bf16 columns, 7168, 4096): read 32 at a time, a column block of
// each, they and the hardware prefetcher's next lines overflow those sets' 12 ways, and every
// load waits on L2.
inline bool rows_share_l1_sets(int64_t row_bytes) { return row_bytes % 1024 == 0; }

// out[p * 32 + r] = the dword (W[r, 2p], W[r, 2p + 1]) of bf16 rows r < 32 (ldw apart, K % 32 ==
// 0) for the K / 2 column pairs p; out 64-byte aligned. Rows that share L1 sets
// (rows_share_l1_sets) are first copied one after another, each a single stream, into a
// per-thread buffer 64 bytes longer a row: 32 rows of 2048 columns in L2 took 5.4-6.3 us in
// place and 3.9-4.0 us staged (one thread, AMD Zen 5; 2.7 us in place where the stride is not
// a multiple of 4 KiB).
inline void pack_column_pairs32(const uint16_t* W, int64_t ldw, int64_t K, uint32_t* out) {
  if (rows_share_l1_sets(ldw * 2)) {
    thread_local std::vector<uint16_t> staged;
    const int64_t ld = K + 32;
    if (staged.size() < size_t(32 * ld + 32)) staged.resize(size_t(32 * ld + 32));
    uint16_t* s = reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(staged.data()) + 63) & ~uintptr_t(63));
    for (int r = 0; r < 32; ++r)
      for (int64_t k = 0; k < K; k += 32) _mm512_store_si512(s + r * ld + k, _mm512_loadu_si512(W + r * ldw + k));
    W = s;
    ldw = ld;
  }
  for (int64_t k0 = 0; k0 < K; k0 += 32)
    for (int h = 0; h < 2; ++h) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(W + (h * 16 + i) * ldw + k0);
      transpose16(r);
      for (int j = 0; j < 16; ++j) _mm512_store_si512(out + (k0 / 2 + j) * 32 + h * 16, r[j]);
    }
}

}  // namespace mla::cpu
