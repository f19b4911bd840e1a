// INT8 groups through `mla quantize` and quantize-at-load (tools/quantize.h, model/weights.h):
// the copy is a compressed-tensors int-quantized checkpoint (I8 `weight`, BF16 `weight_scale`
// per group of 32) that the loader reads back as INT8_GROUP, its config names the group, its
// error sits within measured bounds and below block FP8's on the same weights, quantizing at
// load gives exactly the written checkpoint's logits, and malformed INT8 checkpoints are
// refused with the tensor named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <string>

#include "tools/quantize.h"
#include "tools/run_modes.h"
#include "test_util.h"

namespace mla {
namespace {

using nlohmann::json;
using quant::QuantFormat;

cpu::Context one_thread() {
  cpu::Context ctx;
  ctx.threads = 1;
  ctx.weights = cpu::WeightPlacement::Mapped;
  return ctx;
}

QuantizeReport quantize(const std::string& in, const std::string& out, const std::string& spec) {
  QuantizeOptions o;
  o.in = in;
  o.out = out;
  o.formats = LoadQuantization::parse(spec);
  o.threads = 1;
  o.progress = false;
  return quantize_checkpoint(o);
}

json read_json(const std::filesystem::path& path) {
  std::ifstream f(path);
  return json::parse(f);
}

TEST(QuantizeInt8, OthersReloadWithinMeasuredBoundAndBeatFp8) {
  test::TempDir out("quantize-int8");
  const std::string in = test::fixture("deepseek-v3-tiny");
  const auto rep = quantize(in, out.str(), "experts=bf16,others=int8,embed=bf16");
  // One int-quantized group over attention, shared experts and dense MLPs.
  const json q = read_json(out / "config.json")["quantization_config"];
  EXPECT_EQ(q["quant_method"], "compressed-tensors");
  EXPECT_EQ(q["format"], "int-quantized");
  ASSERT_EQ(q["config_groups"].size(), 1u);
  const json& g = q["config_groups"]["group_2"];
  EXPECT_EQ(g["format"], "int-quantized");
  EXPECT_EQ(g["weights"]["num_bits"], 8);
  EXPECT_EQ(g["weights"]["type"], "int");
  EXPECT_EQ(g["weights"]["strategy"], "group");
  EXPECT_EQ(g["weights"]["group_size"], 32);
  EXPECT_EQ(g["weights"]["symmetric"], true);
  EXPECT_EQ(g["targets"].size(), 3u);
  // The tensors as compressed-tensors names them: the codes in `weight` (I8), the scales beside.
  Checkpoint ck(out.str());
  const TensorInfo& w = ck.get("model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(w.dtype, DType::I8);
  EXPECT_EQ(w.shape, (std::vector<int64_t>{128, 256}));
  const TensorInfo& s = ck.get("model.layers.0.self_attn.o_proj.weight_scale");
  EXPECT_EQ(s.dtype, DType::BF16);
  EXPECT_EQ(s.shape, (std::vector<int64_t>{128, 256 / 32}));

  auto qm = Model::load(out.str(), one_thread());
  for (const auto& L : qm->weights().layers) {
    EXPECT_EQ(L.kv_b.format, WeightFormat::INT8_GROUP);
    EXPECT_EQ(L.q_a.format, WeightFormat::INT8_GROUP);
    EXPECT_EQ(L.o.group_size, 32);
    if (L.moe) {
      EXPECT_EQ(L.experts[0].gate.format, WeightFormat::BF16);
      EXPECT_EQ(L.shared.down.format, WeightFormat::INT8_GROUP);
      EXPECT_EQ(L.router.format, WeightFormat::BF16);
    } else {
      EXPECT_EQ(L.dense.up.format, WeightFormat::INT8_GROUP);
    }
  }
  EXPECT_GT(qm->weights().bytes_by_format.count("int8-group"), 0u);

  // Relative RMS error, measured 0.00498 on attention (FP8: 0.026; llama.cpp's Q8_0: 0.0054).
  EXPECT_NEAR(rep.classes.at("attention").rel_rms(), 0.00498, 0.0005);
  EXPECT_EQ(rep.classes.at("routed experts").rel_rms(), 0.0);
  // Logits over the 173 golden positions: measured mean KL 0.00364, mean |d| 0.0286 (FP8 others:
  // 0.0136 / 0.0957); the bounds leave 1.5x room.
  auto ref = Model::load(in, one_thread());
  const auto seqs = comparison_sequences(in, ref->config().vocab_size);
  const auto d = logits_distance(*ref, *qm, seqs);
  EXPECT_EQ(d.positions, 173);
  EXPECT_GT(d.mean_kl, 0.0);
  EXPECT_LT(d.mean_kl, 0.0055);
  EXPECT_LT(d.mean_abs, 0.043);
  // Block FP8 on the same classes moves the logits further.
  test::TempDir out8("quantize-fp8-others");
  quantize(in, out8.str(), "experts=bf16,others=fp8,embed=bf16");
  auto fm = Model::load(out8.str(), one_thread());
  const auto df = logits_distance(*ref, *fm, seqs);
  printf("KL %.5g abs %.5g max %.5g fp8 KL %.5g abs %.5g\n", d.mean_kl, d.mean_abs, d.max_abs, df.mean_kl, df.mean_abs);
  EXPECT_LT(d.mean_kl, df.mean_kl);
  EXPECT_LT(d.mean_abs, df.mean_abs);
}

TEST(QuantizeInt8, WithInt4ExpertsIsMixedPrecisionAndAtLoadEqualsTheCheckpoint) {
  test::TempDir out("quantize-int4-int8");
  const std::string in = test::fixture("deepseek-v3-tiny");
  quantize(in, out.str(), "experts=int4,others=int8,embed=int8");
  const json q = read_json(out / "config.json")["quantization_config"];
  EXPECT_EQ(q["format"], "mixed-precision");
  EXPECT_EQ(q["config_groups"]["group_0"]["format"], "pack-quantized");
  EXPECT_EQ(q["config_groups"]["group_2"]["format"], "int-quantized");
  EXPECT_EQ(q["config_groups"]["group_2"]["targets"].size(), 5u);  // attention, shared, dense, embed, lm_head
  auto written = Model::load(out.str(), one_thread());
  EXPECT_EQ(written->weights().layers[1].experts[2].up.format, WeightFormat::INT4_GROUP);
  EXPECT_EQ(written->weights().layers[1].q_b.format, WeightFormat::INT8_GROUP);
  EXPECT_EQ(written->weights().lm_head.format, WeightFormat::INT8_GROUP);
  EXPECT_EQ(written->weights().embed.format, WeightFormat::INT8_GROUP);
  auto at_load = Model::load(in, one_thread(), false, LoadQuantization::parse("experts=int4,others=int8,embed=int8"));
  EXPECT_GT(at_load->weights().bytes_by_format.count("int8-group (quantized at load)"), 0u);
  EXPECT_GT(at_load->weights().quantized.at("attention").tensors, 0);
  const std::vector<int32_t> ids = {5, 9, 100, 3, 77, 200, 41, 8, 19};
  const auto a = run_logits(*at_load, ids, {}), b = run_logits(*written, ids, {});
  EXPECT_EQ(test::max_abs_diff(a, b), 0.0f);
  // Requantizing the INT8 copy to INT8 copies its bytes (nothing converted, no error).
  test::TempDir again("quantize-int8-again");
  const auto rep = quantize(out.str(), again.str(), "experts=int4,others=int8,embed=int8");
  EXPECT_EQ(rep.classes.at("attention").converted, 0);
  EXPECT_EQ(rep.classes.at("attention").err2, 0.0);
}

TEST(QuantizeInt8, SpecParsing) {
  auto q = LoadQuantization::parse("experts=int8,others=int8,embed=int8");
  EXPECT_EQ(q.experts, QuantFormat::INT8);
  EXPECT_EQ(q.others, QuantFormat::INT8);
  EXPECT_EQ(q.embed_head, QuantFormat::INT8);
  EXPECT_EQ(q.str(), "experts=int8,others=int8,embed=int8");
  EXPECT_EQ(quant::weight_format(QuantFormat::INT8), WeightFormat::INT8_GROUP);
  EXPECT_THROW(LoadQuantization::parse("others=int16"), std::invalid_argument);
}

// The loader's error for the checkpoint at `dir`, or "" when it loads.
std::string load_error(const std::string& dir) {
  try {
    Model::load(dir, one_thread());
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(QuantizeInt8, MalformedCheckpointsAreRefused) {
  test::TempDir out("quantize-int8-bad");
  quantize(test::fixture("deepseek-v2-lite-tiny"), out.str(), "experts=bf16,others=int8");
  const json good = read_json(out / "config.json");
  ASSERT_EQ(load_error(out.str()), "");
  auto with = [&](const std::function<void(json&)>& edit) {
    json c = good;
    edit(c);
    std::ofstream(out / "config.json") << c.dump();
    return load_error(out.str());
  };
  // A group size that leaves a partial group in a row: an error at load, naming the tensor.
  std::string e = with([](json& c) { c["quantization_config"]["config_groups"]["group_2"]["weights"]["group_size"] = 96; });
  EXPECT_NE(e.find("not a multiple of the INT8 group size 96"), std::string::npos) << e;
  EXPECT_NE(e.find("proj.weight"), std::string::npos) << e;
  // I8 weights without an int-quantized group.
  e = with([](json& c) { c.erase("quantization_config"); });
  EXPECT_NE(e.find("no int-quantized group"), std::string::npos) << e;
  // Asymmetric or activation-quantized groups are not supported.
  e = with([](json& c) { c["quantization_config"]["config_groups"]["group_2"]["weights"]["symmetric"] = false; });
  EXPECT_NE(e.find("symmetric"), std::string::npos) << e;
  e = with([](json& c) { c["quantization_config"]["config_groups"]["group_2"]["weights"]["num_bits"] = 6; });
  EXPECT_NE(e.find("num_bits"), std::string::npos) << e;
}

}  // namespace
}  // namespace mla
