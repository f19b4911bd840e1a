// The lightning indexer's two kernels (DeepSeek Sparse Attention, model/indexer.h), for one
// query against the cached indexer keys of one sequence and layer, read straight from the
// latent pool's pages:
//   scores  I[s] = sum_h w[h] relu(q[h] . k[s]) for s < n: a [heads x dim] x [dim x n] product,
//           a ReLU and a weighted sum over the heads;
//   top-k   the k positions of the largest scores, ascending, ties to the lower position.
//
// Scoring kernels (IndexKernel, chosen by dispatch.h's index_kernel):
//   F32   float32 FMAs: q transposed [dim][heads] held per 16 heads in registers, each key value
//         broadcast; keys decoded to their float32 values (what LatentPool::gather_index gives).
//         The precise precision's kernel.
//   Bf16  VDPBF16PS: q rounded to bf16 (pairs of values per head), each key's pairs broadcast;
//         bf16 keys as stored, fp8 keys decoded to bf16 exactly (an e4m3 value is a bf16 value;
//         the key's scale multiplies its dot products), f32 keys rounded to bf16.
//   Amx   TDPBF16PS: keys as the A operand, 32 at a time as bf16 tiles read straight from the
//         pages (bf16 cache, pages a multiple of 32 slots; other formats and page sizes decode
//         or copy 32 rows to a buffer first), q packed once as the B operand (amx.h's
//         amx_gemm_rows32). Needs AMX and dim % 32 == 0.
// Both bf16 kernels sum in float32; only q (and f32 keys) are rounded, so their scores differ
// from the reference by bf16's rounding of q: selected positions can change where the k-th and
// (k+1)-th scores are that close (tests count them).
// The plain references (index_scores_reference, topk_positions_reference) sit beside them.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/cpu/context.h"
#include "kv/cache_size.h"

namespace mla::cpu {

// A sequence's indexer keys in one layer of the pool: key s lies at
// data + (pages[s / page_size] * page_size + s % page_size) * row_bytes, `dim` values as
// float32, bf16, or e4m3 followed by one float32 scale per 128 values (kv/cache_size.h).
struct IndexKeyPages {
  const uint8_t* data;
  const int32_t* pages;
  int64_t page_size, row_bytes, dim;
  KvDType dtype;
  const uint8_t* row(int64_t s) const {
    return data + (int64_t(pages[s / page_size]) * page_size + s % page_size) * row_bytes;
  }
};

enum class IndexKernel { F32, Bf16, Amx };
const char* index_kernel_name(IndexKernel k);
// Whether the kernel runs here for keys of `dim` values: dim % 32 == 0 (every kernel), and for
// Amx a CPU with AMX.
bool index_kernel_supported(IndexKernel k, int64_t dim);

// One query prepared for a kernel: q converted and laid out once, reused over every key.
// Owned by the caller (a buffer kept between calls); prepare() throws std::logic_error where
// the kernel is not supported.
struct IndexQuery {
  IndexKernel kernel = IndexKernel::F32;
  int64_t heads = 0, dim = 0;
  std::vector<float> buf;  // the kernel's layout of q, then w (heads padded to 16 with zeros)
  void prepare(IndexKernel k, const float* q, const float* w, int64_t heads, int64_t dim);
};

// score[s] for s in [0, n), in blocks of keys split over ctx's threads.
void index_scores(const Context& ctx, const IndexQuery& q, const IndexKeyPages& keys, int64_t n, float* score);

// The plain reference: each key decoded to float32 as LatentPool::gather_index decodes it, the
// dot products and the weighted sum in double.
void index_scores_reference(const IndexKeyPages& keys, const float* q, const float* w, int64_t heads, int64_t n,
                            float* score);

// out[0..k) = the positions of the k largest of score[0, n) in ascending order, ties to the
// lower position (k <= n). A radix select of the order-preserving 32-bit image of each score
// (three histogram passes of 11, 11 and 10 bits find the k-th largest value exactly), then one
// pass that writes, in position order, every score above it and the lowest-positioned of those
// equal to it; each pass split over ctx's threads. -0 counts as +0.
void topk_positions(const Context& ctx, const float* score, int64_t n, int64_t k, int32_t* out);
// The reference: nth_element over positions by (score descending, position ascending), sorted.
void topk_positions_reference(const float* score, int64_t n, int64_t k, int32_t* out);

}  // namespace mla::cpu
