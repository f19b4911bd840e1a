// KV-cache size arithmetic (kv/cache_size.h) over released shapes from the preset table, against
// figures worked out by hand, and the pool's own sizes agreeing with it.
#include <gtest/gtest.h>

#include "kv/cache_size.h"
#include "kv/latent_pool.h"
#include "model/presets.h"

namespace mla {
namespace {

TEST(CacheSize, DeepSeekV3ByHand) {
  const CacheShape s = CacheShape::of(preset_config("deepseek-v3"));
  EXPECT_EQ(latent_row_elems(s.kv_lora_rank, s.qk_rope_head_dim), 576);
  EXPECT_EQ(latent_row_bytes(512, 64, KvDType::F32), 2304);
  EXPECT_EQ(latent_row_bytes(512, 64, KvDType::BF16), 1152);
  EXPECT_EQ(latent_row_bytes(512, 64, KvDType::FP8), 512 + 4 * 4 + 128);  // e4m3, 4 scales, bf16 k_pe
  EXPECT_EQ(latent_bytes_per_token(s, KvDType::BF16), 1152 * 61);
  EXPECT_EQ(latent_bytes_per_page(s, KvDType::FP8, 64), 656 * 61 * 64);
  // 128 heads x (128 + 64) keys + 128 x 128 values = 40,960 values a layer.
  EXPECT_EQ(expanded_elems_per_layer(s), 40960);
  EXPECT_EQ(expanded_bytes_per_token(s, expanded_elem_bytes(KvDType::BF16)), 40960 * 2 * 61);
  EXPECT_EQ(expanded_elem_bytes(KvDType::F32), 4);
  EXPECT_EQ(mha_elems_per_layer(s), 2 * 128 * 128);
  EXPECT_EQ(gqa_elems_per_layer(s, 8), 2 * 8 * 128);
  EXPECT_EQ(mqa_elems_per_layer(s), 2 * 128);
  static_assert(latent_row_bytes(512, 64, KvDType::BF16) == 1152, "usable in constant expressions");
  EXPECT_EQ(pages_for_tokens(0, 64), 0);
  EXPECT_EQ(pages_for_tokens(64, 64), 1);
  EXPECT_EQ(pages_for_tokens(65, 64), 2);
}

TEST(CacheSize, GlmExpandsWiderValuesThanKeys) {
  // GLM-4.7-Flash: 20 heads, keys 192 + 64, values 256.
  const CacheShape s = CacheShape::of(preset_config("glm-4.7-flash"));
  EXPECT_EQ(expanded_elems_per_layer(s), 20 * 256 + 20 * 256);
  EXPECT_EQ(latent_bytes_per_token(s, KvDType::BF16), 1152 * 47);
}

TEST(CacheSize, PoolSizesAreTheHeadersFigures) {
  for (KvDType dtype : {KvDType::F32, KvDType::BF16, KvDType::FP8}) {
    const CacheShape s{3, 4, 256, 32, 64, 32};
    LatentPool pool(s.layers, s.kv_lora_rank, s.qk_rope_head_dim, 2, 16, dtype);
    EXPECT_EQ(pool.bytes_per_token(), latent_bytes_per_token(s, dtype));
    EXPECT_EQ(pool.bytes_per_page(), latent_bytes_per_page(s, dtype, 16));
  }
}

}  // namespace
}  // namespace mla
