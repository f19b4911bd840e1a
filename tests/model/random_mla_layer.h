// A random MLA attention layer for the unit tests of model/mla.h: float32 kv_b_proj and its
// absorbed W_UK^T (as the loader makes them for float32 checkpoints), unit RMSNorm weights, and
// helpers to fill a latent pool with random rows through random page tables.
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kv/latent_pool.h"
#include "model/config.h"
#include "model/weights.h"

namespace mla::test {

struct RandomMlaLayer {
  ModelConfig cfg;
  std::vector<float> kv_b;  // [H (nope + v), kv_lora]
  std::vector<float> uk_t;  // per head W_UK[h]^T [kv_lora, nope]
  LayerWeights W;

  RandomMlaLayer(int64_t H, int64_t kvr, int64_t rope, int64_t nope, int64_t v, uint32_t seed, float w_scale = 0.05f) {
    cfg.num_attention_heads = H;
    cfg.kv_lora_rank = kvr;
    cfg.qk_rope_head_dim = rope;
    cfg.qk_nope_head_dim = nope;
    cfg.v_head_dim = v;
    cfg.hidden_size = 64;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    kv_b.resize(size_t(H * (nope + v) * kvr));
    for (auto& x : kv_b) x = nd(rng) * w_scale;
    W.kv_b = MatrixView{WeightFormat::F32, H * (nope + v), kvr, kv_b.data()};
    uk_t.resize(size_t(H * kvr * nope));
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < nope; ++d)
        for (int64_t k = 0; k < kvr; ++k)
          uk_t[size_t((h * kvr + k) * nope + d)] = kv_b[size_t((h * (nope + v) + d) * kvr + k)];
    for (int64_t h = 0; h < H; ++h) {
      W.w_uk_t.push_back(MatrixView{WeightFormat::F32, kvr, nope, uk_t.data() + h * kvr * nope});
      W.w_uv.push_back(W.kv_b.slice_rows(h * (nope + v) + nope, v));
    }
  }
  int64_t qk() const { return cfg.qk_head_dim(); }
  int64_t dim() const { return cfg.latent_dim(); }
};

// Every slot of every page of every layer holds NaN (FlashMLA's habit): a kernel that reads a
// row it should not turns its output into NaN.
inline void poison_pool(LatentPool& pool) {
  PageTable all;
  all.pages.resize(size_t(pool.num_pages()));
  std::iota(all.pages.begin(), all.pages.end(), 0);
  std::vector<float> nan(static_cast<size_t>(pool.row_dim()), std::numeric_limits<float>::quiet_NaN());
  for (int64_t l = 0; l < pool.num_layers(); ++l)
    for (int64_t s = 0; s < pool.num_pages() * pool.page_size(); ++s) pool.write(l, all, s, nan.data(), nan.data());
}

// Page tables over disjoint random pages of the pool for sequences of the given lengths (their
// last pages partly used), without the free list: the pages of a table are in no order.
inline std::vector<PageTable> random_page_tables(const LatentPool& pool, const std::vector<int64_t>& lengths,
                                                 std::mt19937& rng) {
  std::vector<int32_t> pages(size_t(pool.num_pages()));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  std::vector<PageTable> tables;
  size_t next = 0;
  for (int64_t len : lengths) {
    PageTable t;
    for (int64_t p = 0; p < (len + pool.page_size() - 1) / pool.page_size(); ++p) t.pages.push_back(pages.at(next++));
    tables.push_back(std::move(t));
  }
  return tables;
}

// Random latent rows (unit Gaussian c_KV and k_pe) at positions [0, len) of seq in layer l.
inline void fill_rows(LatentPool& pool, int64_t layer, const PageTable& seq, int64_t len, int64_t kvr,
                      std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(pool.row_dim()));
  for (int64_t s = 0; s < len; ++s) {
    for (auto& x : row) x = nd(rng);
    pool.write(layer, seq, s, row.data(), row.data() + kvr);
  }
}

}  // namespace mla::test
