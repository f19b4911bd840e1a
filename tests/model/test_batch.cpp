// Ragged batches, the per-batch path choice, chunked-prefix attention and the FP8 latent cache,
// all held against the fixtures' golden logits.
#include <gtest/gtest.h>

#include <map>

#include "tools/run_modes.h"
#include "test_util.h"

namespace mla {
namespace {

struct Golden {
  std::unique_ptr<Model> model;
  std::unique_ptr<SafetensorsFile> file;
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<float>> logits;
};

Golden& golden(const std::string& name) {
  static std::map<std::string, Golden> cache;
  Golden& g = cache[name];
  if (!g.model) {
    g.model = Model::load(test::fixture(name));
    g.file = std::make_unique<SafetensorsFile>(test::fixture(name) + "/golden.safetensors");
    for (int j = 0; j < 4; ++j) {
      g.ids.push_back(test::read_ids(*g.file->find("seq" + std::to_string(j) + "_ids")));
      g.logits.push_back(test::read_f32(*g.file->find("seq" + std::to_string(j) + "_logits")));
    }
  }
  return g;
}

class Batch : public ::testing::TestWithParam<std::string> {};

// The four sequences run as mixed batches: in the middle batch seq0 prefills, seq1 decodes,
// seq2 extends and seq3 prefills a first part; each sequence's logits equal the golden ones.
TEST_P(Batch, MixedBatchEqualsAlone) {
  Golden& g = golden(GetParam());
  const int64_t V = g.model->config().vocab_size;
  for (AttnPath path : {AttnPath::Auto, AttnPath::Absorb, AttnPath::Expand, AttnPath::Chunked}) {
    LatentPool pool = g.model->make_pool(16, 16, KvDType::F32);
    std::vector<PageTable> seqs(4);
    std::vector<std::vector<float>> got(4);
    for (int j = 0; j < 4; ++j) got[size_t(j)].resize(g.ids[size_t(j)].size() * size_t(V));
    // Feeds [b, e) of each listed sequence in one forward pass and files the logits.
    auto step = [&](std::vector<std::tuple<int, int64_t, int64_t>> parts) {
      std::vector<SeqSlice> batch;
      for (auto [j, b, e] : parts) {
        EXPECT_EQ(seqs[size_t(j)].length, b);
        batch.push_back({&seqs[size_t(j)], std::span<const int32_t>(g.ids[size_t(j)].data() + b, size_t(e - b))});
      }
      ForwardOptions fo;
      fo.path = path;
      fo.policy.prefix_chunk = 8;
      std::vector<float> out;
      g.model->forward(batch, pool, fo, out);
      int64_t row = 0;
      for (auto [j, b, e] : parts)
        for (int64_t t = b; t < e; ++t, ++row)
          std::copy(out.begin() + row * V, out.begin() + (row + 1) * V, got[size_t(j)].begin() + t * V);
    };
    const int64_t n1 = int64_t(g.ids[1].size()), n2 = int64_t(g.ids[2].size()), n3 = int64_t(g.ids[3].size());
    step({{1, 0, n1 - 1}, {2, 0, 20}});
    step({{0, 0, int64_t(g.ids[0].size())}, {1, n1 - 1, n1}, {2, 20, n2}, {3, 0, 50}});
    step({{3, 50, 51}});
    step({{3, 51, n3}});
    for (int j = 0; j < 4; ++j)
      EXPECT_LE(test::max_abs_diff(got[size_t(j)], g.logits[size_t(j)]), 1e-3f)
          << GetParam() << " seq" << j << " path " << attn_path_name(path);
  }
}

// Chunked-prefix extend (prefix not a multiple of C) equals the unchunked expand.
TEST_P(Batch, ChunkedPrefixEqualsUnchunked) {
  Golden& g = golden(GetParam());
  const auto& ids = g.ids[3];
  RunOptions base;
  base.mode = RunMode::parse("extend:50");
  base.path = AttnPath::Expand;
  auto want = run_logits(*g.model, ids, base);
  for (int64_t C : {1, 7, 64}) {
    RunOptions opt = base;
    opt.path = AttnPath::Chunked;
    opt.policy.prefix_chunk = C;
    auto got = run_logits(*g.model, ids, opt);
    // Only the merge order differs from the one-range expand: float32 rounding.
    EXPECT_LE(test::max_abs_diff(got, want), 2e-5f) << "C=" << C;
    EXPECT_LE(test::max_abs_diff(got, g.logits[3]), 1e-3f) << "C=" << C;
  }
}

// Relative L2 distance ||a - b|| / ||b||.
double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += double(a[i] - b[i]) * (a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

// The FP8 latent cache (e4m3 with one float32 scale per 128 values, bf16 k_pe).
// The bound: e4m3 keeps 3 mantissa bits, so each cached latent value is off by at most half an
// ulp, 2^-4 of its magnitude (values far below their block's amax, in the subnormal range, are
// off by at most amax/448 * 2^-10, negligible in L2). Hence ||c_fp8 - c||_2 <= ||c||_2 / 16, and
// the first layer's attention output -- a convex combination of the cached latents mapped by
// W_UV, with scores perturbed by the same relative amount -- is asserted within 2^-4 relative L2
// of the f32 cache's; bf16 (8 significant bits, half an ulp 2^-9) within 2^-8.
// Logits are reported, not bounded per element: these random tiny models route their tokens on
// near-ties, and a perturbation that flips one expert choice moves a logit by its own scale
// (the bf16 cache shows the same). Their mean error is bounded loosely at 0.1, a tenth of the
// logits' own spread, which an outright wrong cache (a misplaced row, a wrong scale) exceeds.
TEST_P(Batch, Fp8CacheErrorIsBounded) {
  Golden& g = golden(GetParam());
  const auto& ids = g.ids[3];
  std::map<KvDType, ForwardCapture> capture;
  std::map<KvDType, double> worst, mean;
  for (KvDType dt : {KvDType::F32, KvDType::BF16, KvDType::FP8}) {
    RunOptions opt;
    opt.mode = RunMode::parse("extend:60");
    opt.path = AttnPath::Absorb;
    opt.kv_dtype = dt;
    opt.first_pass = &capture[dt];
    auto got = run_logits(*g.model, ids, opt);
    double sum = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      double d = std::fabs(got[i] - g.logits[3][i]);
      worst[dt] = std::max(worst[dt], d);
      sum += d;
    }
    mean[dt] = sum / double(got.size());
  }
  double l0_fp8 = rel_l2(capture[KvDType::FP8].attention_outputs[0], capture[KvDType::F32].attention_outputs[0]);
  double l0_bf16 = rel_l2(capture[KvDType::BF16].attention_outputs[0], capture[KvDType::F32].attention_outputs[0]);
  std::printf("[ kv cache ] %-22s logits vs golden: fp8 max %.2e mean %.2e | bf16 max %.2e mean %.2e | f32 max %.2e;"
              " layer-0 attention rel L2: fp8 %.2e bf16 %.2e\n",
              GetParam().c_str(), worst[KvDType::FP8], mean[KvDType::FP8], worst[KvDType::BF16], mean[KvDType::BF16],
              worst[KvDType::F32], l0_fp8, l0_bf16);
  EXPECT_LE(l0_fp8, 1.0 / 16);
  EXPECT_LE(l0_bf16, 1.0 / 256);
  EXPECT_GT(l0_fp8, l0_bf16);  // the fp8 path really ran
  EXPECT_LE(mean[KvDType::FP8], 0.1);
  EXPECT_LE(worst[KvDType::F32], 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Batch, ::testing::ValuesIn(test::model_fixtures()), [](const auto& info) {
  std::string s = info.param;
  for (auto& ch : s)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
});

TEST(PathPolicy, DecodeAbsorbsPrefillExpandsLongPrefixChunks) {
  ModelConfig c;
  c.num_attention_heads = 128;
  c.kv_lora_rank = 512;
  c.qk_rope_head_dim = 64;
  c.qk_nope_head_dim = 128;
  c.v_head_dim = 128;
  MlaCosts k = MlaCosts::of(c);
  PathPolicy p;
  p.prefix_chunk = 1024;
  EXPECT_EQ(choose_attn_path(k, {{1, 4000}}, p), AttnPath::Absorb);               // decode
  EXPECT_EQ(choose_attn_path(k, {{1, 10}, {1, 300}, {1, 9000}}, p), AttnPath::Absorb);  // batched decode
  EXPECT_EQ(choose_attn_path(k, {{4, 2000}}, p), AttnPath::Absorb);               // short extend
  EXPECT_EQ(choose_attn_path(k, {{2048, 0}}, p), AttnPath::Expand);               // prefill
  EXPECT_EQ(choose_attn_path(k, {{4096, 8192}}, p), AttnPath::Chunked);           // long extend on a long prefix
  EXPECT_EQ(choose_attn_path(k, {{4096, 512}}, p), AttnPath::Expand);             // long extend, short prefix
  // The crossover of the FLOP model: expand wins once new tokens exceed it (for prefill).
  double x = k.crossover_new_tokens();
  EXPECT_GT(x, 1.0);
  EXPECT_EQ(choose_attn_path(k, {{int64_t(x) + 2, 0}}, p), AttnPath::Expand);
}

TEST(PathPolicy, CountersAndChoiceAreVisible) {
  auto model = Model::load(test::fixture("deepseek-v3-tiny"));
  LatentPool pool = model->make_pool(8, 16);
  PageTable seq;
  std::vector<int32_t> prompt(40, 7), next = {9};
  std::vector<float> out;
  SeqSlice s{&seq, prompt};
  model->forward(std::span<SeqSlice>(&s, 1), pool, {}, out);
  EXPECT_EQ(model->last_path(), AttnPath::Expand);
  s = {&seq, next};
  model->forward(std::span<SeqSlice>(&s, 1), pool, {}, out);
  EXPECT_EQ(model->last_path(), AttnPath::Absorb);
  EXPECT_EQ(model->path_counters().expand, 1);
  EXPECT_EQ(model->path_counters().absorb, 1);
  EXPECT_EQ(model->path_counters().chunked, 0);
}

TEST(KvExhaustion, ForwardRefusesCleanlyAndLeavesTheCacheIntact) {
  auto model = Model::load(test::fixture("deepseek-v3-tiny"));
  LatentPool pool = model->make_pool(2, 16);  // 32 tokens
  PageTable a, b;
  std::vector<int32_t> ids(20, 3), more(20, 4);
  std::vector<float> out, out2;
  SeqSlice s{&a, ids};
  model->forward(std::span<SeqSlice>(&s, 1), pool, {}, out);
  SeqSlice t{&b, more};
  EXPECT_THROW(model->forward(std::span<SeqSlice>(&t, 1), pool, {}, out2), KvCacheExhausted);
  EXPECT_EQ(b.length, 0);
  EXPECT_TRUE(b.pages.empty());
  EXPECT_EQ(a.length, 20);
  pool.release(a);  // room again
  model->forward(std::span<SeqSlice>(&t, 1), pool, {}, out2);
  EXPECT_EQ(b.length, 20);
}

}  // namespace
}  // namespace mla
