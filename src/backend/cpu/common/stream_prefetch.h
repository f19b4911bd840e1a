// Software prefetch for streams of weights read once from memory: the GEMVs of decode (gemv.cpp)
// and mla bench's read loop, the limit they are measured against.
//
// The hardware prefetchers follow a sequential stream within one 4 KiB page and stop at its end:
// each page's stream starts over on its own first misses, cold. A stream that touches a line of
// the page two ahead of the one it enters (one prefetch instruction per 4 KiB) finds the hardware
// already running in every page it reads. Prefetching every line instead (a line per 64 bytes, 2
// to 8 KiB ahead) costs an instruction and a fill buffer per line and was slower than none.
// Measured on an AMD EPYC Zen 5 VM, 2 threads, weights on huge pages, alternating in one process
// (the MoE products of a decode step, shared + 6 of 32 experts of 1408 x 2048, 5 layers, from
// DRAM; median of 21 rounds):
//   INT8_WORDS16 VNNI GEMV, a line per 64 bytes 2 KiB ahead: 30-34 GB/s; none 0.96-1.08x that;
//     a line per 512 bytes 8 KiB ahead 1.27-1.30x; a line per 4 KiB, 8 KiB ahead 1.66-1.74x
//     (50-57 GB/s); 4 KiB ahead 0.97x of 8, 12 and 16 KiB 1.00x;
//   INT4_WORDS16, a line per 64 bytes 8 KiB ahead against a line per 4 KiB: 1.23-1.27x;
//   the lm_head (129280 x 2048 BF16_PAIRS32, two streams a block): 1.16-1.19x;
//   a plain AVX-512 read of the same bytes in the same units, without touches: 0.78x of the INT8
//   GEMV with them.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace mla::cpu {

inline constexpr int64_t kPageBytes = 4096;
inline constexpr int64_t kPagesAhead = 2;

// Whether, of a stream's consecutive pieces of Piece bytes, the one at address a is the one that
// starts in its page's first Piece bytes: exactly one piece of every page the stream crosses.
template <int64_t Piece>
constexpr bool first_piece_in_page(uintptr_t a) {
  static_assert(Piece > 0 && Piece <= kPageBytes);
  return (a & uintptr_t(kPageBytes - 1)) < uintptr_t(Piece);
}

// For a stream read in consecutive pieces of Piece bytes, called with each piece's address: that
// page's first piece prefetches the line kPagesAhead pages on, into L1. A prefetch never faults,
// past the stream's end included.
template <int64_t Piece>
[[gnu::always_inline]] inline void touch_page_ahead(const void* piece) {
  if (first_piece_in_page<Piece>(reinterpret_cast<uintptr_t>(piece)))
    _mm_prefetch(static_cast<const char*>(piece) + kPagesAhead * kPageBytes, _MM_HINT_T0);
}

}  // namespace mla::cpu
