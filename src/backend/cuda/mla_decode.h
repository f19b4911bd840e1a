// MLA decode attention on Hopper (sm_90a) over the paged latent cache, absorbed (MQA) form:
// every query head attends to the shared 576-value latent (512 c_KV + 64 k_pe) of each cached
// token, and the output is the weighted sum of c_KV. The cache is BF16 rows or the latent
// pool's FP8 rows (512 e4m3 bytes, 4 float32 scales, 64 bf16 k_pe = 656 bytes). Work is split
// across SMs by a schedule computed from the lengths (`plan_decode`); a plan can be reused by
// every layer of a step. Tensor cores through mma.sync m16n8k16 (bf16 in, f32 accumulate),
// cp.async double buffering of 64-token key blocks.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "backend/cuda/decode_schedule.h"

namespace mla::cuda {

constexpr int kKvLora = 512;
constexpr int kRopeDim = 64;
constexpr int kHeadDim = kKvLora + kRopeDim;  // 576
constexpr int kBlockTokens = 64;              // key block of the kernel (any page size works)
constexpr int kFp8RowBytes = kKvLora + kKvLora / 128 * 4 + kRopeDim * 2;  // 656, as kv/latent_pool.cpp

enum class CacheDType { BF16, FP8 };

// Device metadata and workspace of one schedule. Cheap to copy (shared ownership).
struct DecodePlan {
  DecodeSchedule schedule;  // host copy, for inspection
  std::shared_ptr<void> memory;
  const int32_t* lengths = nullptr;      // [batch]
  const DecodePiece* pieces = nullptr;   // schedule.pieces
  const int32_t* part_begin = nullptr;   // [num_parts + 1]
  const int32_t* split_begin = nullptr;  // [batch]
  const int32_t* num_splits = nullptr;   // [batch]
  float* o_part = nullptr;               // [num_slots, rows, 512]
  float* lse_part = nullptr;             // [num_slots, rows] (natural log)
};

// Builds the schedule on the host and copies it to the current device (synchronous).
// lengths_host[batch]: cached tokens per sequence, the new s_q tokens included.
DecodePlan plan_decode(const int32_t* lengths_host, int batch, int s_q, int h_q, int num_sms);

struct DecodeArgs {
  const void* q = nullptr;          // bf16 [batch, s_q, h_q, 576]: q_nope through W_UK, then rotated q_pe
  const void* cache = nullptr;      // [num_pages, page_size, row]: 576 bf16 or kFp8RowBytes bytes per token
  CacheDType cache_dtype = CacheDType::BF16;
  int page_size = 64;
  const int32_t* block_table = nullptr;  // [batch, block_table_stride] page ids
  int64_t block_table_stride = 0;
  float softmax_scale = 0;          // applied to q . k
  void* out = nullptr;              // bf16 [batch, s_q, h_q, 512]
  float* lse = nullptr;             // [batch, h_q, s_q], natural log; +inf for a row that sees no key
};

// Query row i (of s_q) of sequence b sees keys [0, lengths[b] - s_q + i]. A row that sees no
// key gets output 0 and LSE +inf. Throws std::invalid_argument on bad arguments and
// std::runtime_error on a CUDA error at launch.
void run_decode(const DecodePlan& plan, const DecodeArgs& args, cudaStream_t stream);

// Streaming multiprocessors of the current device (for plan_decode).
int device_sm_count();

}  // namespace mla::cuda
