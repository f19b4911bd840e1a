#include "kv/latent_pool.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "kv/huge_memory.h"
#include "tensor/dtype.h"
#include "tensor/quantize.h"

namespace mla {

namespace {

// n values of a cached row as the pool stores them: float32, bf16, or (FP8) e4m3 codes followed
// by one float32 scale per 128 values (absmax / 448). Each returns the bytes written or read.
int64_t encode_values(KvDType t, const float* x, int64_t n, uint8_t* out) {
  switch (t) {
    case KvDType::F32: std::memcpy(out, x, size_t(n) * 4); return n * 4;
    case KvDType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return n * 2;
    case KvDType::FP8: {
      const int64_t nblocks = (n + 127) / 128;
      for (int64_t b = 0; b < nblocks; ++b) {
        const int64_t i0 = b * 128, i1 = std::min(n, i0 + 128);
        float amax = 0;
        for (int64_t i = i0; i < i1; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float scale = amax > 0 ? amax / 448.0f : 1.0f, inv = 1.0f / scale;
        std::memcpy(out + n + b * 4, &scale, 4);
        for (int64_t i = i0; i < i1; ++i) out[i] = f32_to_fp8e4m3(x[i] * inv);
      }
      return n + nblocks * 4;
    }
  }
  return 0;
}

int64_t decode_values(KvDType t, const uint8_t* in, int64_t n, float* o) {
  switch (t) {
    case KvDType::F32: std::memcpy(o, in, size_t(n) * 4); return n * 4;
    case KvDType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, in + 2 * i, 2);
        o[i] = bf16_to_f32(h);
      }
      return n * 2;
    case KvDType::FP8: {
      const uint8_t* sc = in + n;
      for (int64_t i = 0; i < n; ++i) {
        float scale;
        std::memcpy(&scale, sc + (i / 128) * 4, 4);
        o[i] = fp8e4m3_to_f32(in[i]) * scale;
      }
      return n + (n + 127) / 128 * 4;
    }
  }
  return 0;
}

// A latent row is c_KV then k_pe; in an FP8 row k_pe stays bf16 (after c_KV's scales).
KvDType k_pe_dtype(KvDType t) { return t == KvDType::FP8 ? KvDType::BF16 : t; }

}  // namespace

const char* kv_dtype_name(KvDType t) {
  switch (t) {
    case KvDType::F32: return "f32";
    case KvDType::BF16: return "bf16";
    case KvDType::FP8: return "fp8";
  }
  return "?";
}

KvDType parse_kv_dtype(const std::string& s) {
  for (KvDType t : {KvDType::F32, KvDType::BF16, KvDType::FP8})
    if (s == kv_dtype_name(t)) return t;
  throw std::invalid_argument("unknown KV cache dtype '" + s + "' (f32, bf16, fp8)");
}

int64_t LatentPool::pages_for_budget(double bytes, int64_t num_layers, int64_t kvr, int64_t rope, int64_t page_size,
                                     KvDType dtype, int64_t index_dim) {
  double per_page = double(latent_row_bytes(kvr, rope, dtype) + index_row_bytes(index_dim, dtype)) * double(page_size) *
                    double(num_layers);
  return std::max<int64_t>(0, int64_t(bytes / per_page));
}

LatentPool::LatentPool(int64_t num_layers, int64_t kvr, int64_t rope, int64_t num_pages, int64_t page_size,
                       KvDType dtype, int64_t index_dim, bool index_pow2_scales)
    : num_layers_(num_layers), kv_lora_rank_(kvr), rope_dim_(rope), num_pages_(num_pages), page_size_(page_size),
      dtype_(dtype), row_bytes_(latent_row_bytes(kvr, rope, dtype)), index_dim_(index_dim),
      index_row_bytes_(index_row_bytes(index_dim, dtype)), index_pow2_scales_(index_pow2_scales) {
  if (num_layers <= 0 || kvr <= 0 || rope < 0 || num_pages < 0 || page_size <= 0 || index_dim < 0)
    throw std::invalid_argument("LatentPool: bad geometry");
  if (num_pages > INT32_MAX) throw std::invalid_argument("LatentPool: too many pages");
  // One zeroed allocation, populated now: on 2 MiB pages when large (kv/huge_memory.h), since
  // attention streams it and a prompt cache hit copies pages into it.
  auto rounded = [](int64_t n) { return (n + 63) / 64 * 64; };
  const int64_t layer_bytes = rounded(num_pages * page_size * row_bytes_);
  const int64_t index_bytes = index_dim > 0 ? rounded(num_pages * page_size * index_row_bytes_) : 0;
  const size_t total = size_t(num_layers * (layer_bytes + index_bytes));
  memory_bytes_ = int64_t(total);
#if defined(__SANITIZE_ADDRESS__)
  constexpr bool kMapped = false;  // AddressSanitizer checks the bounds of heap blocks, not of mappings
#else
  constexpr bool kMapped = true;
#endif
  if (kMapped && total >= (size_t(2) << 20)) memory_ = huge_mapping(total, true);
  if (!memory_) memory_ = std::shared_ptr<void>(new uint8_t[std::max<size_t>(total, 1)](), std::default_delete<uint8_t[]>());
  uint8_t* at = static_cast<uint8_t*>(memory_.get());
  for (int64_t l = 0; l < num_layers; ++l, at += layer_bytes) layers_.push_back(at);
  if (index_dim > 0)
    for (int64_t l = 0; l < num_layers; ++l, at += index_bytes) index_layers_.push_back(at);
  free_.resize(size_t(num_pages));
  for (int64_t i = 0; i < num_pages; ++i) free_[size_t(i)] = int32_t(num_pages - 1 - i);  // pop_back gives page 0 first
  refs_.assign(size_t(num_pages), 0);
}

LatentPool::LatentPool(const LatentPool& o)
    : LatentPool(o.num_layers_, o.kv_lora_rank_, o.rope_dim_, o.num_pages_, o.page_size_, o.dtype_, o.index_dim_,
                 o.index_pow2_scales_) {
  std::memcpy(memory_.get(), o.memory_.get(), size_t(memory_bytes_));
  free_ = o.free_;
  refs_ = o.refs_;
}

LatentPool& LatentPool::operator=(const LatentPool& o) {
  if (this != &o) *this = LatentPool(o);
  return *this;
}

int64_t LatentPool::pages_needed(const PageTable& seq, int64_t new_length) const {
  int64_t want = pages_for_tokens(new_length, page_size_);
  return std::max<int64_t>(0, want - int64_t(seq.pages.size()));
}

bool LatentPool::reserve(PageTable& seq, int64_t new_length) {
  int64_t need = pages_needed(seq, new_length);
  if (need > free_pages()) return false;
  for (int64_t i = 0; i < need; ++i) {
    int32_t p = free_.back();
    free_.pop_back();
    refs_[size_t(p)] = 1;
    seq.pages.push_back(p);
  }
  return true;
}

void LatentPool::truncate(PageTable& seq, int64_t length) {
  length = std::clamp<int64_t>(length, 0, seq.length);
  int64_t keep = (length + page_size_ - 1) / page_size_;
  while (int64_t(seq.pages.size()) > keep) {
    int32_t p = seq.pages.back();
    seq.pages.pop_back();
    if (--refs_[size_t(p)] == 0) free_.push_back(p);
  }
  seq.length = length;
}

void LatentPool::release(PageTable& seq) {
  seq.length = std::min<int64_t>(seq.length, int64_t(seq.pages.size()) * page_size_);
  truncate(seq, 0);
  seq.pages.clear();
}

bool LatentPool::fork(const PageTable& src, int64_t prefix, PageTable* out) {
  if (prefix < 0 || prefix > src.length) throw std::out_of_range("LatentPool::fork: prefix past the source's length");
  PageTable t;
  int64_t full = prefix / page_size_, rest = prefix % page_size_;
  if (rest && free_.empty()) return false;
  for (int64_t i = 0; i < full; ++i) {
    int32_t p = src.pages[size_t(i)];
    ++refs_[size_t(p)];
    t.pages.push_back(p);
  }
  if (rest) {
    int32_t p = free_.back();
    free_.pop_back();
    refs_[size_t(p)] = 1;
    int32_t from = src.pages[size_t(full)];
    for (int64_t l = 0; l < num_layers_; ++l)
      std::memcpy(row_ptr(l, p, 0), row_ptr(l, from, 0), size_t(rest * row_bytes_));
    for (int64_t l = 0; l < int64_t(index_layers_.size()); ++l)
      std::memcpy(index_ptr(l, p, 0), index_ptr(l, from, 0), size_t(rest * index_row_bytes_));
    t.pages.push_back(p);
  }
  t.length = prefix;
  *out = std::move(t);
  return true;
}

void LatentPool::retain(int32_t page) {
  if (page < 0 || page >= num_pages_ || refs_[size_t(page)] < 1)
    throw std::logic_error("LatentPool::retain: page " + std::to_string(page) + " is not in use");
  ++refs_[size_t(page)];
}

void LatentPool::drop(int32_t page) {
  if (page < 0 || page >= num_pages_ || refs_[size_t(page)] < 1)
    throw std::logic_error("LatentPool::drop: page " + std::to_string(page) + " is not in use");
  if (--refs_[size_t(page)] == 0) free_.push_back(page);
}

std::vector<std::span<const uint8_t>> LatentPool::page_parts(int32_t page) const {
  std::vector<std::span<const uint8_t>> parts;
  for (int64_t l = 0; l < num_layers_; ++l) parts.emplace_back(row_ptr(l, page, 0), size_t(page_size_ * row_bytes_));
  for (int64_t l = 0; l < int64_t(index_layers_.size()); ++l)
    parts.emplace_back(index_ptr(l, page, 0), size_t(page_size_ * index_row_bytes_));
  return parts;
}

void LatentPool::copy_page_out(int32_t page, uint8_t* out) const {
  for (std::span<const uint8_t> part : page_parts(page)) {
    std::memcpy(out, part.data(), part.size());
    out += part.size();
  }
}

void LatentPool::copy_page_in(int32_t page, const uint8_t* in) {
  for (std::span<uint8_t> part : page_parts_to_fill(page)) {
    std::memcpy(part.data(), in, part.size());
    in += part.size();
  }
}

std::vector<std::span<uint8_t>> LatentPool::page_parts_to_fill(int32_t page) {
  if (refs_.at(size_t(page)) > 1) throw std::logic_error("LatentPool: a shared page cannot be filled");
  std::vector<std::span<uint8_t>> parts;
  for (int64_t l = 0; l < num_layers_; ++l) parts.emplace_back(row_ptr(l, page, 0), size_t(page_size_ * row_bytes_));
  for (int64_t l = 0; l < int64_t(index_layers_.size()); ++l)
    parts.emplace_back(index_ptr(l, page, 0), size_t(page_size_ * index_row_bytes_));
  return parts;
}

uint8_t* LatentPool::row_ptr(int64_t layer, int32_t page, int64_t slot) {
  return layers_[size_t(layer)] + (int64_t(page) * page_size_ + slot) * row_bytes_;
}
const uint8_t* LatentPool::row_ptr(int64_t layer, int32_t page, int64_t slot) const {
  return layers_[size_t(layer)] + (int64_t(page) * page_size_ + slot) * row_bytes_;
}

uint8_t* LatentPool::index_ptr(int64_t layer, int32_t page, int64_t slot) {
  return index_layers_[size_t(layer)] + (int64_t(page) * page_size_ + slot) * index_row_bytes_;
}
const uint8_t* LatentPool::index_ptr(int64_t layer, int32_t page, int64_t slot) const {
  return index_layers_[size_t(layer)] + (int64_t(page) * page_size_ + slot) * index_row_bytes_;
}

void LatentPool::check_position(const PageTable& seq, int64_t pos, const char* what) const {
  if (pos < 0 || pos >= int64_t(seq.pages.size()) * page_size_)
    throw std::out_of_range(std::string("LatentPool::") + what + ": position " + std::to_string(pos) +
                            " has no page reserved");
}

void LatentPool::write(int64_t layer, const PageTable& seq, int64_t pos, const float* c, const float* k_pe) {
  check_position(seq, pos, "write");
  int32_t page = seq.pages[size_t(pos / page_size_)];
  if (refs_[size_t(page)] > 1) throw std::logic_error("LatentPool::write: page is shared with another sequence");
  uint8_t* row = row_ptr(layer, page, pos % page_size_);
  const int64_t at = encode_values(dtype_, c, kv_lora_rank_, row);
  encode_values(k_pe_dtype(dtype_), k_pe, rope_dim_, row + at);
}

void LatentPool::gather(int64_t layer, const PageTable& seq, int64_t s0, int64_t n, float* out) const {
  const int64_t dim = row_dim();
  if (n <= 0) return;
  check_position(seq, s0, "gather");  // the whole range is checked before anything is written
  check_position(seq, s0 + n - 1, "gather");
  for (int64_t s = s0; s < s0 + n; ++s) {
    const uint8_t* row = row_ptr(layer, seq.pages[size_t(s / page_size_)], s % page_size_);
    decode_row(row, out + (s - s0) * dim);
  }
}

void LatentPool::gather_bf16(int64_t layer, const PageTable& seq, int64_t s0, int64_t n, uint16_t* out) const {
  if (dtype_ != KvDType::BF16)
    throw std::logic_error(std::string("gather_bf16: the pool stores ") + kv_dtype_name(dtype_) + " rows, not bf16");
  const int64_t dim = row_dim();
  if (n <= 0) return;
  check_position(seq, s0, "gather_bf16");
  check_position(seq, s0 + n - 1, "gather_bf16");
  // A page's rows lie together: one copy per page's run.
  for (int64_t s = s0; s < s0 + n;) {
    const int64_t slot = s % page_size_, run = std::min(page_size_ - slot, s0 + n - s);
    std::memcpy(out + (s - s0) * dim, row_ptr(layer, seq.pages[size_t(s / page_size_)], slot),
                size_t(run * dim) * sizeof(uint16_t));
    s += run;
  }
}

const uint16_t* LatentPool::bf16_row(int64_t layer, const PageTable& seq, int64_t s) const {
  if (dtype_ != KvDType::BF16)
    throw std::logic_error(std::string("bf16_row: the pool stores ") + kv_dtype_name(dtype_) + " rows, not bf16");
  check_position(seq, s, "bf16_row");
  return reinterpret_cast<const uint16_t*>(row_ptr(layer, seq.pages[size_t(s / page_size_)], s % page_size_));
}

void LatentPool::decode_row(const uint8_t* row, float* o) const {
  const int64_t at = decode_values(dtype_, row, kv_lora_rank_, o);
  decode_values(k_pe_dtype(dtype_), row + at, rope_dim_, o + kv_lora_rank_);
}

void LatentPool::gather_at(int64_t layer, const PageTable& seq, const int32_t* positions, int64_t n, float* out) const {
  const int64_t dim = row_dim();
  for (int64_t i = 0; i < n; ++i) check_position(seq, positions[i], "gather_at");
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = positions[i];
    decode_row(row_ptr(layer, seq.pages[size_t(s / page_size_)], s % page_size_), out + i * dim);
  }
}

void LatentPool::write_index(int64_t layer, const PageTable& seq, int64_t pos, const float* k) {
  if (index_dim_ == 0) throw std::logic_error("LatentPool::write_index: the pool holds no indexer keys");
  check_position(seq, pos, "write_index");
  int32_t page = seq.pages[size_t(pos / page_size_)];
  if (refs_[size_t(page)] > 1) throw std::logic_error("LatentPool::write_index: page is shared with another sequence");
  uint8_t* out = index_ptr(layer, page, pos % page_size_);
  if (dtype_ != KvDType::FP8) {
    encode_values(dtype_, k, index_dim_, out);
    return;
  }
  // FP8: e4m3 codes, then one scale per 128 values, by DeepSeek-V3.2's act_quant of the key.
  for (int64_t b = 0; b * 128 < index_dim_; ++b) {
    const int64_t i0 = b * 128, i1 = std::min(index_dim_, i0 + 128);
    const float scale = quant::fp8_act_scale(k + i0, i1 - i0, index_pow2_scales_);
    std::memcpy(out + index_dim_ + b * 4, &scale, 4);
    for (int64_t i = i0; i < i1; ++i) out[i] = f32_to_fp8e4m3(k[i] / scale);
  }
}

void LatentPool::gather_index(int64_t layer, const PageTable& seq, int64_t s0, int64_t n, float* out) const {
  if (index_dim_ == 0) throw std::logic_error("LatentPool::gather_index: the pool holds no indexer keys");
  if (n <= 0) return;
  check_position(seq, s0, "gather_index");
  check_position(seq, s0 + n - 1, "gather_index");
  for (int64_t s = s0; s < s0 + n; ++s)
    decode_values(dtype_, index_ptr(layer, seq.pages[size_t(s / page_size_)], s % page_size_), index_dim_,
                  out + (s - s0) * index_dim_);
}

}  // namespace mla
