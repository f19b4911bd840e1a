// The paged latent KV cache. Per token and layer it stores one latent row: the normalised
// c_KV (kv_lora_rank values) and the rotated k_pe (qk_rope_head_dim values). One buffer per
// layer, [num_pages, page_size, row]; pages come from a free list with reference counts, so a
// sequence can share another's full prefix pages (fork). Exhaustion is reported, never fatal.
// For DeepSeek Sparse Attention models (index_dim > 0) each token and layer also holds its
// indexer key (index_dim values) in a second buffer per layer under the same page table, so
// prefix sharing, forks, truncation and preemption carry it with the latent. In the fp8 format
// a key is quantized as DeepSeek-V3.2's code caches it (act_quant: tensor/quantize.h's
// fp8_act_scale, power-of-two scales where index_pow2_scales, the checkpoint's scale_fmt ue8m0).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/cache_size.h"

namespace mla {

const char* kv_dtype_name(KvDType t);
KvDType parse_kv_dtype(const std::string& s);  // "f32" | "bf16" | "fp8"; throws otherwise

struct PageTable {
  std::vector<int32_t> pages;
  int64_t length = 0;  // tokens whose latent rows are written
};

class LatentPool {
 public:
  LatentPool(int64_t num_layers, int64_t kv_lora_rank, int64_t rope_dim, int64_t num_pages, int64_t page_size = 64,
             KvDType dtype = KvDType::BF16, int64_t index_dim = 0, bool index_pow2_scales = false);
  LatentPool(const LatentPool& other);  // a copy of every page
  LatentPool& operator=(const LatentPool& other);
  LatentPool(LatentPool&&) = default;
  LatentPool& operator=(LatentPool&&) = default;
  // Pages that fit in a budget of bytes (all layers).
  static int64_t pages_for_budget(double bytes, int64_t num_layers, int64_t kv_lora_rank, int64_t rope_dim,
                                  int64_t page_size, KvDType dtype, int64_t index_dim = 0);

  int64_t num_layers() const { return num_layers_; }
  int64_t page_size() const { return page_size_; }
  int64_t num_pages() const { return num_pages_; }
  int64_t free_pages() const { return int64_t(free_.size()); }
  KvDType dtype() const { return dtype_; }
  int64_t row_dim() const { return kv_lora_rank_ + rope_dim_; }
  int64_t index_dim() const { return index_dim_; }
  int64_t bytes_per_token() const { return (row_bytes_ + index_row_bytes_) * num_layers_; }  // all layers
  int64_t bytes_per_page() const { return (row_bytes_ + index_row_bytes_) * page_size_ * num_layers_; }
  int64_t total_bytes() const { return bytes_per_page() * num_pages_; }
  int refcount(int32_t page) const { return refs_.at(size_t(page)); }

  // Grows a sequence's page table so it can hold `new_length` tokens. All or nothing: false
  // (and no change) when the free pages do not suffice.
  bool reserve(PageTable& seq, int64_t new_length);
  int64_t pages_needed(const PageTable& seq, int64_t new_length) const;
  // Returns the sequence's pages (those no other sequence shares go back to the free list).
  void release(PageTable& seq);
  // A new sequence holding the first `prefix` tokens of `src`: full pages are shared by
  // reference count; a partial last page is copied. False when no page is free for that copy.
  bool fork(const PageTable& src, int64_t prefix, PageTable* out);
  // Truncates a sequence to `length` tokens, releasing pages past it.
  void truncate(PageTable& seq, int64_t length);

  // One page on its own, for the prefix cache's tiers (kv/prefix_cache.h): another reference
  // to a page in use, and giving one back (the page is free when none is left).
  void retain(int32_t page);
  void drop(int32_t page);
  // A page's bytes as stored, every layer's latent rows then every layer's indexer keys
  // (bytes_per_page() in all): the parts in that order (views into the pool, valid while the
  // page is held), a copy of them, and writing them back into a page no two sequences share.
  std::vector<std::span<const uint8_t>> page_parts(int32_t page) const;
  void copy_page_out(int32_t page, uint8_t* out) const;
  void copy_page_in(int32_t page, const uint8_t* in);
  // The same parts of a page no two sequences share, to fill in place (a read from disk).
  std::vector<std::span<uint8_t>> page_parts_to_fill(int32_t page);

  // One token's row: c (kv_lora_rank floats) and k_pe (rope_dim floats), at position pos.
  void write(int64_t layer, const PageTable& seq, int64_t pos, const float* c, const float* k_pe);
  // Rows [s0, s0+n) as float32, out[n, kv_lora_rank + rope_dim].
  void gather(int64_t layer, const PageTable& seq, int64_t s0, int64_t n, float* out) const;
  // Rows [s0, s0+n) of a bf16 pool as stored, out[n, kv_lora_rank + rope_dim] bf16 values (the
  // fast precision's bf16 attention reads them so); throws for the other dtypes.
  void gather_bf16(int64_t layer, const PageTable& seq, int64_t s0, int64_t n, uint16_t* out) const;
  // Row s of a bf16 pool where it lies: the rows of the positions after it on the same page
  // follow at kv_lora_rank + rope_dim values apart. Throws for the other dtypes.
  const uint16_t* bf16_row(int64_t layer, const PageTable& seq, int64_t s) const;
  // Rows at the n listed positions, out[n, kv_lora_rank + rope_dim] (sparse attention's gather).
  void gather_at(int64_t layer, const PageTable& seq, const int32_t* positions, int64_t n, float* out) const;

  // The indexer key of one token (index_dim floats; index_dim() > 0 only), and rows [s0, s0+n)
  // of them as float32, out[n, index_dim].
  void write_index(int64_t layer, const PageTable& seq, int64_t pos, const float* k);
  void gather_index(int64_t layer, const PageTable& seq, int64_t s0, int64_t n, float* out) const;
  // The indexer keys of one layer as stored, [num_pages, page_size, index_bytes_per_row()]: the
  // indexer's kernels read a sequence's keys through its page table (cpu::IndexKeyPages).
  const uint8_t* index_data(int64_t layer) const { return index_layers_.at(size_t(layer)); }
  int64_t index_bytes_per_row() const { return index_row_bytes_; }

 private:
  uint8_t* row_ptr(int64_t layer, int32_t page, int64_t slot);
  const uint8_t* row_ptr(int64_t layer, int32_t page, int64_t slot) const;
  void check_position(const PageTable& seq, int64_t pos, const char* what) const;
  void decode_row(const uint8_t* row, float* out) const;
  uint8_t* index_ptr(int64_t layer, int32_t page, int64_t slot);
  const uint8_t* index_ptr(int64_t layer, int32_t page, int64_t slot) const;

  int64_t num_layers_, kv_lora_rank_, rope_dim_, num_pages_, page_size_;
  KvDType dtype_;
  int64_t row_bytes_;
  int64_t memory_bytes_ = 0;
  std::shared_ptr<void> memory_;  // every layer's rows, then every layer's indexer keys (huge pages)
  std::vector<uint8_t*> layers_;   // [num_pages, page_size, row] per layer, in memory_
  int64_t index_dim_ = 0, index_row_bytes_ = 0;
  bool index_pow2_scales_ = false;
  std::vector<uint8_t*> index_layers_;  // [num_pages, page_size, index row] per layer, in memory_
  std::vector<int32_t> free_;
  std::vector<int> refs_;
};

}  // namespace mla
