// Tests of the MLA arithmetic (`mla analyze`): figures of two presets against values worked
// out by hand below, the JSON key set, the presets' released sizes, and bad options.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <sys/wait.h>

#include "model/presets.h"
#include "tools/analyze.h"
#include "test_util.h"

namespace {

using nlohmann::json;

std::set<std::string> keys(const json& j) {
  std::set<std::string> k;
  for (auto& [name, v] : j.items()) k.insert(name);
  return k;
}

// Runs the mla binary; returns its exit status and stdout (stderr goes to stdout too).
int run_mla(const std::string& args, std::string* out) {
  auto r = mla::test::run_mla(args);
  *out = r.output;
  return r.status;
}

TEST(Analyze, DeepSeekV3ByHand) {
  auto c = mla::preset_config("deepseek-v3");
  json j = mla::analyze_json(c, {{1, 4096}, {1024, 1024}}, mla::Roofline{989, 3.35});
  // H 128, kv_lora 512, rope 64, nope 128, v 128, 61 layers.
  // latent: 512 + 64 = 576; expanded: 128*(128+64) + 128*128 = 24576 + 16384 = 40960.
  // MHA 2*128*128 = 32768, GQA-8 2*8*128 = 2048, MQA 2*128 = 256.
  EXPECT_EQ(j["kv"]["latent_elems_per_layer"], 576);
  EXPECT_EQ(j["kv"]["expanded_elems_per_layer"], 40960);
  EXPECT_EQ(j["kv"]["mha_elems_per_layer"], 32768);
  EXPECT_EQ(j["kv"]["gqa8_elems_per_layer"], 2048);
  EXPECT_EQ(j["kv"]["mqa_elems_per_layer"], 256);
  // bf16 row 576*2 = 1152 bytes, *61 = 70272; fp8 row 512 + 4 scales*4 + 64*2 = 656, *61 = 40016;
  // expanded 40960*2*61 = 4997120.
  EXPECT_EQ(j["kv"]["latent_bytes_per_token_bf16"], 70272);
  EXPECT_EQ(j["kv"]["latent_bytes_per_token_fp8"], 40016);
  EXPECT_EQ(j["kv"]["expanded_bytes_per_token_bf16"], 4997120);
  // pair_expand 2*128*192 + 2*128*128 = 49152 + 32768 = 81920;
  // pair_absorb 2*128*576 + 2*128*512 = 147456 + 131072 = 278528;
  // expand per cached token 2*512*128*(128+128) = 33554432; absorb per new token
  // 2*128*128*512 + 2*128*512*128 = 33554432; crossover 33554432 / (278528-81920) = 170.667.
  const json& f = j["flops"];
  EXPECT_DOUBLE_EQ(f["pair_expand"].get<double>(), 81920);
  EXPECT_DOUBLE_EQ(f["pair_absorb"].get<double>(), 278528);
  EXPECT_DOUBLE_EQ(f["expand_per_cached_token"].get<double>(), 33554432);
  EXPECT_DOUBLE_EQ(f["absorb_per_new_token"].get<double>(), 33554432);
  EXPECT_NEAR(f["crossover_new_tokens"].get<double>(), 170.6667, 1e-3);
  // Decode T=1, S=4096: pairs 4096; expand 4096*33554432 + 4096*81920 = 137438953472 + 335544320
  // = 137774497792;
  // absorb 33554432 + 4096*278528 = 1174405120.
  ASSERT_EQ(f["cases"].size(), 2u);
  EXPECT_EQ(f["cases"][0]["new_tokens"], 1);
  EXPECT_EQ(f["cases"][0]["total_tokens"], 4096);
  EXPECT_DOUBLE_EQ(f["cases"][0]["expand"].get<double>(), 137774497792.0);
  EXPECT_DOUBLE_EQ(f["cases"][0]["absorb"].get<double>(), 1174405120.0);
  EXPECT_EQ(f["cases"][0]["cheaper"], "absorb");
  // Prefill T=S=1024: pairs 1024*1024 - 1024*1023/2 = 524800;
  // expand 1024*33554432 + 524800*81920 = 34359738368 + 42991616000 = 77351354368;
  // absorb 1024*33554432 + 524800*278528 = 34359738368 + 146171494400 = 180531232768.
  EXPECT_DOUBLE_EQ(f["cases"][1]["expand"].get<double>(), 77351354368.0);
  EXPECT_DOUBLE_EQ(f["cases"][1]["absorb"].get<double>(), 180531232768.0);
  EXPECT_EQ(f["cases"][1]["cheaper"], "expand");
  // Decode intensity: 278528 / 1152 = 241.78 (bf16), 278528 / 656 = 424.59 (fp8);
  // ridge 989 / 3.35 = 295.22: bf16 below it (memory-bound), fp8 above (compute-bound).
  const json& d = j["decode_intensity"];
  EXPECT_NEAR(d["bf16"].get<double>(), 241.7778, 1e-3);
  EXPECT_NEAR(d["fp8"].get<double>(), 424.5854, 1e-3);
  EXPECT_NEAR(d["ridge"].get<double>(), 295.2239, 1e-3);
  EXPECT_EQ(d["bf16_bound"], "memory");
  EXPECT_EQ(d["fp8_bound"], "compute");
}

TEST(Analyze, GlmFlashByHand) {
  auto c = mla::preset_config("glm-4.7-flash");
  json j = mla::analyze_json(c, {{3, 7}}, std::nullopt);
  // H 20, kv_lora 512, rope 64, nope 192, v 256, 47 layers.
  // latent 576; expanded 20*(192+64) + 20*256 = 5120 + 5120 = 10240;
  // MHA 2*20*192 = 7680, GQA-8 2*8*192 = 3072, MQA 2*192 = 384.
  EXPECT_EQ(j["kv"]["latent_elems_per_layer"], 576);
  EXPECT_EQ(j["kv"]["expanded_elems_per_layer"], 10240);
  EXPECT_EQ(j["kv"]["mha_elems_per_layer"], 7680);
  EXPECT_EQ(j["kv"]["gqa8_elems_per_layer"], 3072);
  EXPECT_EQ(j["kv"]["mqa_elems_per_layer"], 384);
  // 1152*47 = 54144; 656*47 = 30832; 10240*2*47 = 962560.
  EXPECT_EQ(j["kv"]["latent_bytes_per_token_bf16"], 54144);
  EXPECT_EQ(j["kv"]["latent_bytes_per_token_fp8"], 30832);
  EXPECT_EQ(j["kv"]["expanded_bytes_per_token_bf16"], 962560);
  // pair_expand 2*20*256 + 2*20*256 = 20480; pair_absorb 2*20*576 + 2*20*512 = 23040 + 20480 = 43520;
  // expand per cached 2*512*20*(192+256) = 9175040; absorb per new 2*20*192*512 + 2*20*512*256
  // = 3932160 + 5242880 = 9175040; crossover 9175040 / (43520-20480) = 398.222.
  const json& f = j["flops"];
  EXPECT_DOUBLE_EQ(f["pair_expand"].get<double>(), 20480);
  EXPECT_DOUBLE_EQ(f["pair_absorb"].get<double>(), 43520);
  EXPECT_DOUBLE_EQ(f["expand_per_cached_token"].get<double>(), 9175040);
  EXPECT_DOUBLE_EQ(f["absorb_per_new_token"].get<double>(), 9175040);
  EXPECT_NEAR(f["crossover_new_tokens"].get<double>(), 398.2222, 1e-3);
  // T=3, S=7: pairs 21 - 3 = 18; expand 7*9175040 + 18*20480 = 64593920;
  // absorb 3*9175040 + 18*43520 = 28308480.
  EXPECT_DOUBLE_EQ(f["cases"][0]["expand"].get<double>(), 64593920.0);
  EXPECT_DOUBLE_EQ(f["cases"][0]["absorb"].get<double>(), 28308480.0);
  EXPECT_EQ(f["cases"][0]["cheaper"], "absorb");
  // 43520 / 1152 = 37.778; 43520 / 656 = 66.341.
  EXPECT_NEAR(j["decode_intensity"]["bf16"].get<double>(), 37.7778, 1e-3);
  EXPECT_NEAR(j["decode_intensity"]["fp8"].get<double>(), 66.3415, 1e-3);
}

TEST(Analyze, JsonKeysExactly) {
  auto c = mla::preset_config("deepseek-v2-lite");
  json j = mla::analyze_json(c, {{8, 64}}, mla::Roofline{100, 1});
  EXPECT_EQ(keys(j), (std::set<std::string>{"kv", "flops", "decode_intensity"}));
  EXPECT_EQ(keys(j["kv"]), (std::set<std::string>{"latent_elems_per_layer", "expanded_elems_per_layer",
                                                  "mha_elems_per_layer", "gqa8_elems_per_layer", "mqa_elems_per_layer",
                                                  "latent_bytes_per_token_bf16", "latent_bytes_per_token_fp8",
                                                  "expanded_bytes_per_token_bf16"}));
  EXPECT_EQ(keys(j["flops"]), (std::set<std::string>{"pair_expand", "pair_absorb", "expand_per_cached_token",
                                                     "absorb_per_new_token", "crossover_new_tokens", "cases"}));
  ASSERT_EQ(j["flops"]["cases"].size(), 1u);
  EXPECT_EQ(keys(j["flops"]["cases"][0]),
            (std::set<std::string>{"new_tokens", "total_tokens", "expand", "absorb", "cheaper"}));
  EXPECT_EQ(keys(j["decode_intensity"]), (std::set<std::string>{"bf16", "fp8", "ridge", "bf16_bound", "fp8_bound"}));
  json no_roof = mla::analyze_json(c, {}, std::nullopt);
  EXPECT_EQ(keys(no_roof["decode_intensity"]), (std::set<std::string>{"bf16", "fp8"}));
  EXPECT_TRUE(no_roof["flops"]["cases"].is_array());
  EXPECT_TRUE(no_roof["flops"]["cases"].empty());
}

// The sizes of each released config, and of the benchmark's entry.
TEST(Analyze, PresetsHoldTheReleasedSizes) {
  struct Want {
    const char* name;
    int64_t H, hidden, q_lora, nope, v, layers, vocab, experts, topk, shared, first_dense, moe_inter, inter;
  };
  const Want wants[] = {
      {"deepseek-v3", 128, 7168, 1536, 128, 128, 61, 129280, 256, 8, 1, 3, 2048, 18432},
      {"deepseek-v2", 128, 5120, 1536, 128, 128, 60, 102400, 160, 6, 2, 1, 1536, 12288},
      {"deepseek-v2-lite", 16, 2048, 0, 128, 128, 27, 102400, 64, 6, 2, 1, 1408, 10944},
      {"kimi-k2", 64, 7168, 1536, 128, 128, 61, 163840, 384, 8, 1, 1, 2048, 18432},
      {"kimi-k2.5", 64, 7168, 1536, 128, 128, 61, 163840, 384, 8, 1, 1, 2048, 18432},
      {"glm-4.7-flash", 20, 2048, 768, 192, 256, 47, 154880, 64, 4, 1, 1, 1536, 10240},
      // The benchmark's checkpoint: V2-Lite's layers with V3's vocabulary (its own entry).
      {"bench-v2-lite", 16, 2048, 0, 128, 128, 27, 129280, 64, 6, 2, 1, 1408, 10944},
  };
  ASSERT_EQ(mla::presets().size(), std::size(wants));
  for (auto& w : wants) {
    SCOPED_TRACE(w.name);
    auto c = mla::preset_config(w.name);
    EXPECT_EQ(c.num_attention_heads, w.H);
    EXPECT_EQ(c.hidden_size, w.hidden);
    EXPECT_EQ(c.kv_lora_rank, 512);
    EXPECT_EQ(c.q_lora_rank, w.q_lora);
    EXPECT_EQ(c.qk_rope_head_dim, 64);
    EXPECT_EQ(c.qk_nope_head_dim, w.nope);
    EXPECT_EQ(c.v_head_dim, w.v);
    EXPECT_EQ(c.num_hidden_layers, w.layers);
    EXPECT_EQ(c.vocab_size, w.vocab);
    EXPECT_EQ(c.n_routed_experts, w.experts);
    EXPECT_EQ(c.num_experts_per_tok, w.topk);
    EXPECT_EQ(c.n_shared_experts, w.shared);
    EXPECT_EQ(c.first_k_dense_replace, w.first_dense);
    EXPECT_EQ(c.moe_intermediate_size, w.moe_inter);
    EXPECT_EQ(c.intermediate_size, w.inter);
  }
  EXPECT_EQ(mla::preset_config("deepseek-v3").n_group, 8);
  EXPECT_EQ(mla::preset_config("deepseek-v3").topk_group, 4);
  EXPECT_EQ(mla::preset_config("deepseek-v2").topk_group, 3);
  EXPECT_EQ(mla::preset_config("kimi-k2").n_group, 1);
  EXPECT_EQ(mla::preset_config("kimi-k2.5").weight_prefix, "language_model.");
  // RoPE scaling as released: YaRN for the DeepSeek and Kimi models, none for GLM-4.7-Flash and
  // the benchmark's checkpoint.
  for (const char* yarn40 : {"deepseek-v3", "deepseek-v2", "deepseek-v2-lite"}) {
    EXPECT_TRUE(mla::preset_config(yarn40).rope_scaling.yarn) << yarn40;
    EXPECT_DOUBLE_EQ(mla::preset_config(yarn40).rope_scaling.factor, 40) << yarn40;
  }
  EXPECT_DOUBLE_EQ(mla::preset_config("kimi-k2").rope_scaling.factor, 32);
  EXPECT_DOUBLE_EQ(mla::preset_config("kimi-k2.5").rope_scaling.factor, 64);
  EXPECT_FALSE(mla::preset_config("glm-4.7-flash").rope_scaling.yarn);
  EXPECT_FALSE(mla::preset_config("bench-v2-lite").rope_scaling.yarn);
}

TEST(Analyze, ParseCase) {
  auto c = mla::parse_analyze_case("16,4096");
  EXPECT_EQ(c.new_tokens, 16);
  EXPECT_EQ(c.total_tokens, 4096);
  for (const char* bad : {"", "5", "0,10", "10,5", "a,5", "5,b", "5,10,15", "-1,5", "5, 10x"})
    EXPECT_THROW(mla::parse_analyze_case(bad), std::invalid_argument) << bad;
  EXPECT_THROW(mla::preset_config("deepseek-v4"), std::invalid_argument);
}

TEST(Analyze, CliJsonMatchesLibraryAndConfigFile) {
  std::string out;
  ASSERT_EQ(run_mla("analyze --preset deepseek-v3 --case 1,4096 --peak-tflops 989 --bandwidth-tbs 3.35 --json", &out), 0)
      << out;
  json j = json::parse(out);
  EXPECT_EQ(j, mla::analyze_json(mla::preset_config("deepseek-v3"), {{1, 4096}}, mla::Roofline{989, 3.35}));

  // A config.json file gives the same figures as its parsed config.
  const std::string cfg = std::string(MLA_SHARED_DIR) + "/fixtures/models/glm-4.7-flash-tiny/config.json";
  ASSERT_EQ(run_mla("analyze --config " + cfg + " --case 2,9 --case 1,1 --json", &out), 0) << out;
  std::ifstream f(cfg);
  auto c = mla::ModelConfig::from_json(json::parse(f));
  EXPECT_EQ(json::parse(out), mla::analyze_json(c, {{2, 9}, {1, 1}}, std::nullopt));

  ASSERT_EQ(run_mla("analyze --preset kimi-k2", &out), 0) << out;
  EXPECT_NE(out.find("crossover"), std::string::npos);
  EXPECT_NE(out.find("64 heads"), std::string::npos);
}

TEST(Analyze, CliRejectsBadOptions) {
  std::string out;
  const char* bad[] = {
      "analyze",                                                    // neither --config nor --preset
      "analyze --preset nope",                                      // unknown preset
      "analyze --preset deepseek-v3 --config /dev/null",            // both
      "analyze --config /nonexistent/config.json",                  // unreadable
      "analyze --config /dev/null",                                 // not JSON
      "analyze --preset deepseek-v3 --case 9,3",                    // S < T
      "analyze --preset deepseek-v3 --case 3",                      // no S
      "analyze --preset deepseek-v3 --peak-tflops 900",             // roofline half given
      "analyze --preset deepseek-v3 --bandwidth-tbs 3",             // roofline half given
      "analyze --preset deepseek-v3 --peak-tflops 0 --bandwidth-tbs 3",  // not positive
      "analyze --preset deepseek-v3 --frobnicate",                  // unknown option
  };
  for (const char* args : bad) {
    EXPECT_NE(run_mla(args, &out), 0) << args << "\n" << out;
    EXPECT_FALSE(out.empty()) << args;  // says why
  }
}

}  // namespace
