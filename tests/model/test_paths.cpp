// The two MLA algorithms agree, and the same weights give the same logits however they are
// packaged: sharded, or wrapped as kimi_k25 (text_config, language_model. prefix).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cpu/common/amx.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/context.h"
#include "tools/run_modes.h"
#include "tools/checkpoint_writer.h"
#include "model/mla.h"
#include "model/random_mla_layer.h"
#include "test_util.h"

namespace mla {
namespace {

using nlohmann::json;

// One attention layer at DeepSeek-V3's real sizes (H heads, 128 by default) through the model's
// attention unit (model/mla.h), both forms over the same random latents in a float32 pool
// (random page tables, unused slots NaN), queries and kv_b_proj. Returns the max
// |expand - absorb| relative to max |out|.
double expand_vs_absorb(int64_t T, int64_t S, int64_t H = 128, const cpu::Context& ctx = {}) {
  const int64_t kvr = 512, rope = 64, nope = 128, vd = 128, qk = nope + rope;
  test::RandomMlaLayer layer(H, kvr, rope, nope, vd, 7);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  LatentPool pool(1, kvr, rope, (S + 15) / 16 + 1, 16, KvDType::F32);
  test::poison_pool(pool);
  auto tables = test::random_page_tables(pool, {S}, rng);
  test::fill_rows(pool, 0, tables[0], S, kvr, rng);
  std::vector<float> q(size_t(T * H * qk));
  for (auto& v : q) v = nd(rng);
  MlaAttention mla(layer.cfg);
  const SeqKeys keys{&pool, 0, &tables[0], S - T, T};
  std::vector<float> out_e(size_t(T * H * vd)), out_a(out_e.size());
  mla.expand(ctx, layer.W, keys, q.data(), out_e.data());
  mla.absorb(ctx, layer.W, keys, q.data(), out_a.data());
  double maxdiff = 0, maxabs = 0;
  for (size_t i = 0; i < out_e.size(); ++i) {
    maxdiff = std::max(maxdiff, double(std::fabs(out_e[i] - out_a[i])));
    maxabs = std::max(maxabs, double(std::fabs(out_e[i])));
  }
  return maxdiff / maxabs;
}

// float32 rounding over sums of ~512 terms: relative error a few 1e-6; 1e-5 leaves room for
// the different summation orders of the two algorithms and nothing more.
TEST(MlaPaths, ExpandEqualsAbsorbAtDeepSeekV3SizesPrefill) { EXPECT_LT(expand_vs_absorb(48, 48), 1e-5); }
TEST(MlaPaths, ExpandEqualsAbsorbAtDeepSeekV3SizesDecode) { EXPECT_LT(expand_vs_absorb(1, 300), 1e-5); }
// 150 new tokens after 50 cached: the expand path's query blocks (64 rows) each see a
// different number of keys.
TEST(MlaPaths, ExpandEqualsAbsorbOverSeveralQueryBlocks) { EXPECT_LT(expand_vs_absorb(150, 200), 1e-5); }
// A long cache: the absorb path splits its 2600 keys over two threads (blocks of 256, online
// softmax, partial results merged by log-sum-exp); three new tokens see different key counts.
TEST(MlaPaths, ExpandEqualsAbsorbWithTheKeysSplitAcrossThreads) {
  cpu::Context two;
  two.threads = 2;
  EXPECT_LT(expand_vs_absorb(3, 2600, 16, two), 1e-5);
}

// The fast precision's expand path (bf16 products on AMX tiles, or on VDPBF16PS without AMX)
// against the float32 one: 150 queries after 50 cached tokens (query blocks that see 114...200
// keys, not multiples of 32). Queries, keys, probabilities and values are rounded to bf16
// (relative 2^-9 each): scores of unit size move by about 1e-3, the outputs by well under 1% of
// their largest value (measured: 0.36%).
TEST(MlaPaths, FastExpandOnBf16ProductsFollowsTheFloat32Path) {
  const int64_t T = 150, S = 200, H = 16, nope = 128, rope = 64, vd = 128, qk = nope + rope;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> kvx(size_t(S * H * (nope + vd))), kpe(size_t(S * rope)), q(size_t(T * H * qk));
  for (auto* v : {&kvx, &kpe, &q})
    for (auto& x : *v) x = nd(rng);
  const cpu::ExpandArgs args{q.data(), kvx.data(), kpe.data(), rope, T, S, H, nope, rope, vd, S - T, 0,
                             1.0f / std::sqrt(float(qk))};
  std::vector<float> out_p(size_t(T * H * vd)), lse_p(size_t(T * H)), out_f(out_p.size(), -7.0f), lse_f(lse_p.size());
  cpu::Context precise, fast;
  fast.precision = cpu::Precision::Fast;
  fast.vector_gemm = cpu::Context::VectorGemm::Vdpbf16ps;  // where float32 FMAs would win, still bf16
  EXPECT_EQ(cpu::expand_kernel(precise, args), cpu::ExpandKernel::F32);
  cpu::attention_expand(precise, args, out_p.data(), lse_p.data());
  EXPECT_EQ(cpu::expand_kernel(fast, args), cpu::amx_available() ? cpu::ExpandKernel::Amx : cpu::ExpandKernel::Dpbf16);
  cpu::attention_expand(fast, args, out_f.data(), lse_f.data());
  double maxdiff = 0, maxabs = 0;
  for (size_t i = 0; i < out_p.size(); ++i) {
    maxdiff = std::max(maxdiff, double(std::fabs(out_f[i] - out_p[i])));
    maxabs = std::max(maxabs, double(std::fabs(out_p[i])));
  }
  EXPECT_LT(maxdiff / maxabs, 1e-2);
  EXPECT_GT(maxdiff, 0.0) << "the fast precision should have taken the bf16 path";
  // lse is the softmax-weighted mean of the score errors, so |d lse| <= max_j |d s_j|. q scale
  // and k rounded to bf16 (relative error uniform within +-2^-9 each) give a score of qk = 192
  // unit Gaussian products an error of rms 2^-9 sqrt(2/3) scale sqrt(qk) = 1.6e-3: 5e-3 is 3 rms
  // of a single key's score, and the weighted mean over a row's >= 114 visible keys lies well
  // inside it.
  for (size_t i = 0; i < lse_p.size(); ++i) ASSERT_NEAR(lse_f[i], lse_p[i], 5e-3) << "row " << i;
}

// Rewrites a fixture's tensors under another layout.
std::string repackage(const std::string& fixture, const std::string& dir, int shards, bool as_kimi_k25) {
  std::ifstream f(test::fixture(fixture) + "/config.json");
  json cfg = json::parse(f);
  static std::vector<std::unique_ptr<SafetensorsFile>> keep;
  keep.push_back(std::make_unique<SafetensorsFile>(test::fixture(fixture) + "/model.safetensors"));
  std::vector<TensorSpec> specs;
  for (auto& [name, t] : keep.back()->tensors()) {
    const TensorInfo* tp = &t;
    specs.push_back({(as_kimi_k25 ? "language_model." : "") + name, t.dtype, t.shape,
                     [tp](uint8_t* out) { std::memcpy(out, tp->data, tp->nbytes); }});
  }
  if (as_kimi_k25) {
    // Stray vision tensors, as the K2.5 release has: ignored by the language model.
    specs.push_back({"vision_tower.patch_embed.weight", DType::F32, {4, 4}, [](uint8_t* out) { std::memset(out, 0, 64); }});
    specs.push_back({"mm_projector.proj.weight", DType::F32, {2}, [](uint8_t* out) { std::memset(out, 0, 8); }});
    cfg = {{"model_type", "kimi_k25"}, {"architectures", {"KimiK25ForConditionalGeneration"}}, {"text_config", cfg},
           {"vision_config", {{"model_type", "moonvit"}}}};
  }
  write_checkpoint(dir, cfg, specs, shards);
  return dir;
}

std::vector<float> logits_of(const std::string& dir, const std::vector<int32_t>& ids) {
  auto model = Model::load(dir);
  RunOptions opt;
  return run_logits(*model, ids, opt);
}

TEST(Packaging, ShardedAndKimiK25WrappedGiveTheSameLogits) {
  auto golden = SafetensorsFile(test::fixture("kimi-k2-tiny") + "/golden.safetensors");
  auto ids = test::read_ids(*golden.find("seq2_ids"));
  auto want = logits_of(test::fixture("kimi-k2-tiny"), ids);
  test::TempDir a("sharded"), b("k25"), c("k25sharded");
  EXPECT_EQ(logits_of(repackage("kimi-k2-tiny", a.str(), 3, false), ids), want);
  EXPECT_EQ(logits_of(repackage("kimi-k2-tiny", b.str(), 1, true), ids), want);
  EXPECT_EQ(logits_of(repackage("kimi-k2-tiny", c.str(), 4, true), ids), want);
  EXPECT_TRUE(std::filesystem::exists(c / "model.safetensors.index.json"));
  EXPECT_TRUE(std::filesystem::exists(c / "model-00004-of-00004.safetensors"));
}

TEST(Packaging, MtpLayerIsSkipped) {
  // deepseek-v3-tiny holds an MTP layer (index == num_hidden_layers); it is not part of the forward pass.
  auto model = Model::load(test::fixture("deepseek-v3-tiny"));
  EXPECT_EQ(int64_t(model->weights().layers.size()), model->config().num_hidden_layers);
  Checkpoint ck(test::fixture("deepseek-v3-tiny"));
  EXPECT_NE(ck.find("model.layers.3.self_attn.kv_b_proj.weight"), nullptr);
}

// Block-FP8 kv_b_proj whose heads start on scale blocks ((nope + v) % 128 == 0, as in
// DeepSeek-V3): the absorbed W_UK^T is an FP8 copy, the same codes transposed with each block's
// scale. Its values equal kv_b's exactly, and the absorb path's logits follow the expand path's.
TEST(MlaPaths, Fp8KvBAbsorbsIntoAnFp8Copy) {
  std::ifstream f(test::fixture("deepseek-v3-fp8-tiny") + "/config.json");
  json cfg = json::parse(f);
  cfg["qk_nope_head_dim"] = 64;
  cfg["v_head_dim"] = 64;
  cfg["kv_lora_rank"] = 192;  // one whole and one partial block of 128
  test::TempDir dir("fp8-absorb");
  RandomCheckpointOptions ro;
  ro.weights = RandomWeights::FP8;
  write_random_checkpoint(dir.str(), cfg, ro);
  auto model = Model::load(dir.str());
  const ModelConfig& c = model->config();
  const int64_t nope = c.qk_nope_head_dim, vd = c.v_head_dim, kvr = c.kv_lora_rank;
  std::vector<float> uk_nope(static_cast<size_t>(nope * kvr)), uk_row(static_cast<size_t>(nope));
  for (const auto& L : model->weights().layers) {
    ASSERT_EQ(L.kv_b.format, WeightFormat::FP8_BLOCK128);
    ASSERT_EQ(int64_t(L.w_uk_t.size()), c.num_attention_heads);
    for (int64_t h = 0; h < c.num_attention_heads; ++h) {
      const MatrixView& uk = L.w_uk_t[size_t(h)];
      ASSERT_EQ(uk.format, WeightFormat::FP8_BLOCK128);
      ASSERT_EQ(uk.rows, kvr);
      ASSERT_EQ(uk.cols, nope);
      // W_UK[h]: kv_b's rows h (nope + v) .. + nope, [nope, kvr].
      for (int64_t d = 0; d < nope; ++d) L.kv_b.dequant_row(h * (nope + vd) + d, uk_nope.data() + d * kvr);
      for (int64_t k = 0; k < kvr; ++k) {
        uk.dequant_row(k, uk_row.data());
        for (int64_t d = 0; d < nope; ++d)
          ASSERT_EQ(uk_row[size_t(d)], uk_nope[size_t(d * kvr + k)]) << "head " << h << " k " << k << " d " << d;
      }
    }
  }
  const std::vector<int32_t> ids = {5, 17, 3, 99, 42, 8, 61, 7};
  RunOptions expand, absorb;
  expand.mode.kind = absorb.mode.kind = RunMode::Decode;
  expand.path = AttnPath::Expand;
  absorb.path = AttnPath::Absorb;
  const auto le = run_logits(*model, ids, expand), la = run_logits(*model, ids, absorb);
  ASSERT_EQ(le.size(), la.size());
  double maxdiff = 0, maxabs = 0;
  for (size_t i = 0; i < le.size(); ++i) {
    maxdiff = std::max(maxdiff, double(std::fabs(le[i] - la[i])));
    maxabs = std::max(maxabs, double(std::fabs(le[i])));
  }
  // float32 throughout (the default precise mode); the two algorithms sum in different orders.
  EXPECT_LT(maxdiff, 1e-4 * maxabs);
}

}  // namespace
}  // namespace mla
