// stream_prefetch.h: a stream of pieces touches each page it crosses exactly once, whatever its
// piece size and wherever it starts in a page.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>

#include "backend/cpu/common/stream_prefetch.h"

namespace {

template <int64_t Piece>
void expect_one_piece_per_page() {
  using mla::cpu::kPageBytes;
  for (uintptr_t start = 0x100000; start < 0x100000 + uintptr_t(kPageBytes); start += 64) {
    std::map<uintptr_t, int> firsts;  // page -> pieces taken as its first
    const int64_t pieces = 5 * kPageBytes / Piece;
    for (int64_t i = 0; i < pieces; ++i) {
      const uintptr_t a = start + uintptr_t(i * Piece);
      if (mla::cpu::first_piece_in_page<Piece>(a)) ++firsts[a / kPageBytes];
    }
    // Every page the stream enters at its start (all but the first when it starts mid-page) has
    // exactly one first piece; no page has two.
    const uintptr_t first_page = start / kPageBytes + (start % kPageBytes >= uintptr_t(Piece) ? 1 : 0);
    const uintptr_t last_page = (start + uintptr_t((pieces - 1) * Piece)) / kPageBytes;
    for (uintptr_t page = first_page; page <= last_page; ++page)
      EXPECT_EQ(firsts[page], 1) << "piece " << Piece << ", start " << start << ", page " << page;
    EXPECT_EQ(firsts.size(), last_page - first_page + 1) << "piece " << Piece << ", start " << start;
  }
}

TEST(StreamPrefetch, EveryPageCrossedHasOneFirstPiece) {
  expect_one_piece_per_page<64>();
  expect_one_piece_per_page<128>();  // BF16_PAIRS32's two streams
  expect_one_piece_per_page<192>();  // a piece that does not divide a page
  expect_one_piece_per_page<256>();  // INT4_WORDS16 chunks, the read loop
  expect_one_piece_per_page<512>();  // INT8_WORDS16 chunks
}

}  // namespace
