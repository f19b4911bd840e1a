// Plain C++ reference for the CUDA MLA decode kernel, and the test problems it runs on: a
// paged latent cache (BF16 rows or the latent pool's FP8 rows) with a random page order,
// unused pages and the tail of each last page filled with NaN.
#pragma once
#include <cstdint>
#include <vector>

namespace mla::test {

constexpr int kLatent = 512, kRope = 64, kDim = 576;
constexpr int kFp8Row = 656;  // 512 e4m3 + 4 float32 scales + 64 bf16, as kv/latent_pool.cpp

// FP8 row of kv/latent_pool.cpp from 576 floats, and back (dequantised to float32).
void encode_fp8_row(const float* row, uint8_t* out);
void decode_fp8_row(const uint8_t* in, float* row);

struct DecodeProblem {
  int batch = 0, s_q = 0, h_q = 0, page_size = 64, max_pages = 0, num_pages = 0;
  bool fp8 = false;
  float scale = 0;
  std::vector<int32_t> lengths;      // [batch]
  std::vector<int32_t> block_table;  // [batch, max_pages]; entries past a sequence's pages name a NaN page
  std::vector<uint16_t> q;           // bf16 [batch, s_q, h_q, 576]
  std::vector<uint8_t> cache;        // [num_pages, page_size, row_bytes()]
  int64_t row_bytes() const { return fp8 ? kFp8Row : kDim * 2; }
  int rows() const { return s_q * h_q; }
};

// Random problem; values are deterministic in the seed. Pages are a random permutation of
// num_pages = needed + extra_pages; every byte not holding a token is NaN.
DecodeProblem make_decode_problem(const std::vector<int32_t>& lengths, int s_q, int h_q, bool fp8, uint64_t seed,
                                  int page_size = 64, int extra_pages = 3);

// Token t of sequence b as 576 float32 values, read through the block table.
void cache_row(const DecodeProblem& p, int b, int t, float* row);

// One sequence: q [s_q * h_q rows ordered (i, h), 576], keys [len, 576]. Only keys in
// [k0, k1) take part; row i sees keys up to len - s_q + i. out [rows, 512], lse [rows]
// (natural log). Float inputs, double sums. A row with no key: out 0, lse -inf.
void reference_attend(const float* q, const float* keys, int len, int k0, int k1, int s_q, int h_q, float scale,
                      float* out, float* lse);

// The whole problem as the kernel defines it: out [batch, s_q, h_q, 512],
// lse [batch, h_q, s_q]; +inf for a row that sees no key.
void reference_decode(const DecodeProblem& p, std::vector<float>& out, std::vector<float>& lse);

}  // namespace mla::test
