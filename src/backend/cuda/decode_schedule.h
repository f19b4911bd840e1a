// Split-KV schedule for the MLA decode kernel, computed on the host from the cache lengths.
// Plain C++ (no CUDA) so it is tested on any machine. The query rows of one sequence
// (s_q * h_q of them, ordered [s_q, h_q]) are cut into tiles of 16, 32 or 64 rows; every tile
// gets `num_parts` CTAs. The key blocks (64 tokens) of all sequences, laid end to end, are cut
// into `num_parts` contiguous ranges of about equal cost; a sequence whose blocks fall into
// more than one range is "split": each piece writes a float32 partial result (and its LSE)
// into its own slot and a combine kernel merges them by log-sum-exp.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace mla::cuda {

// One contiguous run of key blocks of one sequence, handled by one CTA.
struct DecodePiece {
  int32_t batch;
  int32_t block_begin, block_end;  // key blocks [begin, end) of kBlockTokens tokens
  int32_t slot;                    // partial-result slot, or -1: write the final output directly
};

struct DecodeSchedule {
  int batch = 0, s_q = 0, h_q = 0;
  int rows = 0;         // s_q * h_q query rows per sequence
  int tile_rows = 0;    // 16, 32 or 64 query rows per CTA
  int num_m_tiles = 0;  // ceil(rows / tile_rows)
  int num_parts = 0;    // CTAs per row tile (grid = num_parts x num_m_tiles)
  int num_slots = 0;    // partial-result slots over all split sequences
  std::vector<DecodePiece> pieces;     // grouped by part, in order
  std::vector<int32_t> part_begin;     // [num_parts + 1]: pieces of part p are [part_begin[p], part_begin[p+1])
  std::vector<int32_t> split_begin;    // [batch]: first slot of a split sequence (unused when num_splits == 1)
  std::vector<int32_t> num_splits;     // [batch]: pieces of the sequence (1: not split)
};

// block_tokens: tokens per key block (the kernel's 64). fixed_cost_blocks: the cost of one
// piece beyond its blocks (loading the queries, the epilogue, a combine input), in blocks.
inline DecodeSchedule schedule_decode(const int32_t* lengths, int batch, int s_q, int h_q, int num_sms,
                                      int block_tokens = 64, int fixed_cost_blocks = 4) {
  if (batch < 1) throw std::invalid_argument("schedule_decode: batch must be >= 1, got " + std::to_string(batch));
  if (s_q < 1 || s_q > 4) throw std::invalid_argument("schedule_decode: s_q must be in [1, 4], got " + std::to_string(s_q));
  if (h_q < 1 || h_q > 128)
    throw std::invalid_argument("schedule_decode: h_q must be in [1, 128], got " + std::to_string(h_q));
  if (num_sms < 1) throw std::invalid_argument("schedule_decode: num_sms must be >= 1");
  if (block_tokens < 1 || fixed_cost_blocks < 0) throw std::invalid_argument("schedule_decode: bad block size or cost");
  if (!lengths) throw std::invalid_argument("schedule_decode: lengths is null");

  DecodeSchedule s;
  s.batch = batch;
  s.s_q = s_q;
  s.h_q = h_q;
  s.rows = s_q * h_q;
  s.tile_rows = s.rows <= 16 ? 16 : s.rows <= 32 ? 32 : 64;
  s.num_m_tiles = (s.rows + s.tile_rows - 1) / s.tile_rows;
  s.num_parts = std::max(1, num_sms / s.num_m_tiles);

  std::vector<int64_t> blocks(static_cast<size_t>(batch));
  int64_t total = 0;
  for (int b = 0; b < batch; ++b) {
    if (lengths[b] < 0)
      throw std::invalid_argument("schedule_decode: length of sequence " + std::to_string(b) + " is negative (" +
                                  std::to_string(lengths[b]) + ")");
    blocks[size_t(b)] = (int64_t(lengths[b]) + block_tokens - 1) / block_tokens;
    total += blocks[size_t(b)] + fixed_cost_blocks;
  }
  // Part p fills up to a cumulative cost of (p + 1) * target; the last part takes the rest.
  // The target holds one extra piece overhead per part: cutting a sequence adds a piece, and
  // with at most num_parts - 1 cuts the last part then gets no more than the others.
  const int64_t P = s.num_parts;
  const double target = std::max(double(total) / double(P) + fixed_cost_blocks, double(fixed_cost_blocks + 1));
  auto limit = [&](int64_t part) { return int64_t(std::ceil(double(part + 1) * target)); };

  std::vector<std::vector<DecodePiece>> by_part(static_cast<size_t>(P));
  int64_t part = 0, used = 0;
  for (int b = 0; b < batch; ++b) {
    const int64_t nb = blocks[size_t(b)];
    int64_t pos = 0;
    do {
      // Move on when this part (already holding work) has no room for a piece of one block.
      while (part + 1 < P && !by_part[size_t(part)].empty() && limit(part) - used - fixed_cost_blocks < 1) ++part;
      int64_t take = nb - pos;
      if (part + 1 < P) take = std::min(take, std::max<int64_t>(limit(part) - used - fixed_cost_blocks, 1));
      by_part[size_t(part)].push_back(DecodePiece{b, int32_t(pos), int32_t(pos + take), -1});
      used += take + fixed_cost_blocks;
      pos += take;
    } while (pos < nb);
  }

  s.part_begin.assign(size_t(P) + 1, 0);
  for (int64_t p = 0; p < P; ++p) {
    s.part_begin[size_t(p)] = int32_t(s.pieces.size());
    s.pieces.insert(s.pieces.end(), by_part[size_t(p)].begin(), by_part[size_t(p)].end());
  }
  s.part_begin[size_t(P)] = int32_t(s.pieces.size());

  s.num_splits.assign(size_t(batch), 0);
  s.split_begin.assign(size_t(batch), 0);
  for (const DecodePiece& pc : s.pieces) ++s.num_splits[size_t(pc.batch)];
  for (int b = 0; b < batch; ++b)
    if (s.num_splits[size_t(b)] > 1) {
      s.split_begin[size_t(b)] = s.num_slots;
      s.num_slots += s.num_splits[size_t(b)];
    }
  std::vector<int32_t> next(size_t(batch), 0);
  for (DecodePiece& pc : s.pieces)
    if (s.num_splits[size_t(pc.batch)] > 1) pc.slot = s.split_begin[size_t(pc.batch)] + next[size_t(pc.batch)]++;
  return s;
}

}  // namespace mla::cuda
