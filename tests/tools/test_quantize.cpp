// Tests of `mla quantize` (tools/quantize.h) and quantize-at-load (model/weights.h): the copy is
// a checkpoint the loader reads, its config says what was quantized, its logits stay within a
// measured distance of the input's, a bf16 copy is exact, quantizing at load gives exactly the
// quantized checkpoint's logits, and peak memory while quantizing at load is the quantized
// size plus a bounded working set, not the input's size.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "format/progress.h"
#include "tools/checkpoint_writer.h"
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

QuantizeReport quantize(const std::string& in, const std::string& out, QuantFormat experts, QuantFormat others,
                        quant::ScaleRule rule = quant::ScaleRule::Search, QuantFormat embed = QuantFormat::BF16) {
  QuantizeOptions o;
  o.in = in;
  o.out = out;
  o.formats.experts = experts;
  o.formats.others = others;
  o.formats.embed_head = embed;
  o.formats.rule = rule;
  o.threads = 1;
  o.progress = false;
  return quantize_checkpoint(o);
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  return json::parse(f);
}

// The quantization_config `mla quantize` wrote into dir's config.json (compressed-tensors).
json written_quantization_config(const std::filesystem::path& dir) {
  const json q = read_json((dir / "config.json").string())["quantization_config"];
  EXPECT_EQ(q["quant_method"], "compressed-tensors");
  return q;
}

TEST(Quantize, Int4ExpertsFp8OthersReloadWithinMeasuredBound) {
  test::TempDir out("quantize");
  const std::string in = test::fixture("deepseek-v3-tiny");
  const auto rep = quantize(in, out.str(), QuantFormat::INT4, QuantFormat::FP8);
  // The config says exactly this: an INT4 group over the routed experts, an FP8 group over the rest.
  const json q = written_quantization_config(out.path);
  EXPECT_EQ(q["format"], "mixed-precision");
  EXPECT_EQ(q["config_groups"]["group_0"]["weights"]["num_bits"], 4);
  EXPECT_EQ(q["config_groups"]["group_0"]["targets"].size(), 1u);
  EXPECT_EQ(q["config_groups"]["group_1"]["weights"]["type"], "float");
  EXPECT_EQ(q["config_groups"]["group_1"]["targets"].size(), 3u);  // attention, shared, dense
  EXPECT_TRUE(std::filesystem::exists(out / "quantize_report.json"));

  // Every weight of the copy is in the format asked for.
  auto qm = Model::load(out.str(), one_thread());
  const auto& w = qm->weights();
  for (const auto& L : w.layers) {
    EXPECT_EQ(L.kv_b.format, WeightFormat::FP8_BLOCK128);
    EXPECT_EQ(L.o.format, WeightFormat::FP8_BLOCK128);
    if (L.moe) {
      EXPECT_EQ(L.experts[0].gate.format, WeightFormat::INT4_GROUP);
      EXPECT_EQ(L.shared.down.format, WeightFormat::FP8_BLOCK128);
      EXPECT_EQ(L.router.format, WeightFormat::BF16);
    } else {
      EXPECT_EQ(L.dense.up.format, WeightFormat::FP8_BLOCK128);
    }
  }
  EXPECT_EQ(w.lm_head.format, WeightFormat::BF16);

  // Relative RMS error per class, measured 0.081 (INT4 experts) and 0.026 (FP8).
  EXPECT_NEAR(rep.classes.at("routed experts").rel_rms(), 0.081, 0.01);
  EXPECT_NEAR(rep.classes.at("attention").rel_rms(), 0.026, 0.004);
  EXPECT_EQ(rep.classes.at("embeddings/lm_head").rel_rms(), 0.0);
  EXPECT_LT(rep.bytes_out, rep.bytes_in * 6 / 10);

  // Logits: measured mean KL 0.020, mean |d| 0.136, max |d| 1.89 over the 173 golden positions
  // (random tiny weights: the logits of this fixture move more than a trained model's would);
  // the bounds leave 1.5x room.
  auto ref = Model::load(in, one_thread());
  const auto d = logits_distance(*ref, *qm, comparison_sequences(in, ref->config().vocab_size));
  EXPECT_EQ(d.positions, 173);
  EXPECT_GT(d.mean_kl, 0.0);
  EXPECT_LT(d.mean_kl, 0.03);
  EXPECT_LT(d.mean_abs, 0.2);
  EXPECT_LT(d.max_abs, 3.0);

  // The scale search beats plain absmax RTN on the experts' error (it is never worse per group).
  test::TempDir out2("quantize-absmax");
  const auto rep2 = quantize(in, out2.str(), QuantFormat::INT4, QuantFormat::FP8, quant::ScaleRule::Absmax);
  EXPECT_LT(rep.classes.at("routed experts").err2, 0.8 * rep2.classes.at("routed experts").err2);
  EXPECT_LE(rep.classes.at("attention").err2, rep2.classes.at("attention").err2);
}

TEST(Quantize, Bf16CopyIsExact) {
  test::TempDir out("quantize-bf16");
  const std::string in = test::fixture("deepseek-v2-lite-tiny");
  const auto rep = quantize(in, out.str(), QuantFormat::BF16, QuantFormat::BF16);
  EXPECT_FALSE(read_json(out / "config.json").contains("quantization_config"));
  for (auto& [name, s] : rep.classes) EXPECT_EQ(s.err2, 0.0) << name;
  auto a = Model::load(in, one_thread()), b = Model::load(out.str(), one_thread());
  const auto d = logits_distance(*a, *b, {{1, 2, 3, 4, 5, 6, 7, 8}});
  EXPECT_EQ(d.max_abs, 0.0);
  EXPECT_EQ(d.argmax_agree, 8);
}

TEST(Quantize, Int4ExpertsOfTheKimiLayoutPassThrough) {
  // Already INT4 (group 32): the experts' bytes are copied, the rest becomes FP8; the wrapper
  // config keeps its text_config and loses the old quantization_config there.
  test::TempDir out("quantize-kimi");
  const std::string in = test::fixture("kimi-k2.5-int4-tiny");
  const auto rep = quantize(in, out.str(), QuantFormat::INT4, QuantFormat::FP8);
  EXPECT_EQ(rep.classes.at("routed experts").converted, 0);
  EXPECT_EQ(rep.classes.at("routed experts").err2, 0.0);
  EXPECT_GT(rep.classes.at("attention").converted, 0);
  Checkpoint a(in), b(out.str());
  const std::string name = "language_model.model.layers.1.mlp.experts.3.down_proj.weight_packed";
  ASSERT_NE(b.find(name), nullptr);
  EXPECT_EQ(std::memcmp(a.get(name).data, b.get(name).data, a.get(name).nbytes), 0);
  // The vision tower's tensors go through as they are (the loader never reads them).
  for (const char* t : {"vision_tower.patch_embed.proj.weight", "mm_projector.proj.0.weight"}) {
    ASSERT_NE(b.find(t), nullptr) << t;
    EXPECT_EQ(b.get(t).dtype, a.get(t).dtype);
  }
  auto m = Model::load(out.str(), one_thread());
  EXPECT_EQ(m->weights().layers[1].q_a.format, WeightFormat::FP8_BLOCK128);
  EXPECT_EQ(m->weights().layers[1].experts[0].up.format, WeightFormat::INT4_GROUP);
}

TEST(Quantize, AtLoadEqualsTheQuantizedCheckpoint) {
  test::TempDir out("quantize-load");
  const std::string in = test::fixture("deepseek-v3-tiny");
  quantize(in, out.str(), QuantFormat::INT4, QuantFormat::FP8);
  LoadQuantization lq = LoadQuantization::parse("experts=int4,others=fp8");
  auto at_load = Model::load(in, one_thread(), false, lq);
  auto written = Model::load(out.str(), one_thread());
  const std::vector<int32_t> ids = {5, 9, 100, 3, 77, 200, 41, 8, 19};
  const auto a = run_logits(*at_load, ids, {}), b = run_logits(*written, ids, {});
  EXPECT_EQ(test::max_abs_diff(a, b), 0.0f);
  // 2 MoE layers x 16 experts x 3 (the checkpoint's MTP layer, which the loader skips, has 48 more).
  EXPECT_EQ(at_load->weights().quantized.at("routed experts").tensors, 96);
  EXPECT_GT(at_load->weights().bytes_by_format.count("int4-group (quantized at load)"), 0u);
}

TEST(Quantize, SpecParsing) {
  auto q = LoadQuantization::parse("experts=int4,others=fp8,embed=bf16");
  EXPECT_EQ(q.experts, QuantFormat::INT4);
  EXPECT_EQ(q.others, QuantFormat::FP8);
  EXPECT_EQ(q.embed_head, QuantFormat::BF16);
  EXPECT_EQ(q.str(), "experts=int4,others=fp8,embed=bf16");
  EXPECT_FALSE(LoadQuantization::parse("").any());
  EXPECT_THROW(LoadQuantization::parse("experts=int3"), std::invalid_argument);
  EXPECT_THROW(LoadQuantization::parse("others=int4"), std::invalid_argument);
  EXPECT_THROW(LoadQuantization::parse("attention=fp8"), std::invalid_argument);
  EXPECT_THROW(LoadQuantization::parse("experts"), std::invalid_argument);
  EXPECT_EQ(weight_class("model.layers.3.mlp.experts.7.up_proj"), WeightClass::RoutedExperts);
  EXPECT_EQ(weight_class("language_model.model.layers.0.self_attn.kv_b_proj"), WeightClass::Attention);
  EXPECT_EQ(weight_class("model.layers.0.mlp.down_proj"), WeightClass::DenseMlp);
  EXPECT_EQ(weight_class("model.layers.2.mlp.gate"), WeightClass::None);
  EXPECT_EQ(weight_class("lm_head"), WeightClass::EmbedHead);
}

TEST(Quantize, ProgressLine) {
  EXPECT_EQ(Progress::line("writing", 1'200'000'000, 4'800'000'000, 3, 12, 3.0),
            "writing: 1.20 / 4.80 GB (25%), 3 / 12 tensors, 0.40 GB/s, 9 s left");
  EXPECT_EQ(Progress::line("loading", 2'000'000'000, 2'000'000'000, 0, 0, 4.0), "loading: 2.00 / 2.00 GB (100%), 0.50 GB/s, 4.0 s");
  EXPECT_EQ(Progress::line("x", 0, 10, 0, 0, 0.0), "x: 0.00 / 0.00 GB (0%)");
}

size_t status_kb(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(std::string(field) + ":", 0) == 0) return std::stoull(line.substr(std::strlen(field) + 1));
  return 0;
}

TEST(Quantize, AtLoadPeakMemoryIsTheQuantizedSize) {
  // A bf16 checkpoint of ~0.6 GB, 95% routed experts, quantized at load to INT4 experts and FP8
  // projections (~0.17 GB). The peak resident set (VmHWM, reset before the load) may grow by the
  // quantized bytes plus a working set (a tensor's mapped pages while it is read, band buffers),
  // far below the checkpoint's bytes.
  test::TempDir dir("quantize-rss");
  json c = demo_config(4096);
  c["hidden_size"] = 1024;
  c["moe_intermediate_size"] = 512;
  c["n_routed_experts"] = 64;
  RandomCheckpointOptions ro;
  write_random_checkpoint(dir.str(), c, ro);
  const size_t ckpt_bytes = Checkpoint(dir.str()).total_bytes();
  ASSERT_GT(ckpt_bytes, size_t(550) << 20);
  {
    std::ofstream clear("/proc/self/clear_refs");
    if (!clear) GTEST_SKIP() << "cannot reset VmHWM (/proc/self/clear_refs)";
    clear << "5";
  }
  const size_t before = status_kb("VmRSS") * 1024;
  ASSERT_LE(status_kb("VmHWM") * 1024, before + (size_t(8) << 20));
  LoadQuantization lq = LoadQuantization::parse("experts=int4,others=fp8");
  lq.rule = quant::ScaleRule::Absmax;  // the memory does not depend on the rule; this is faster
  cpu::Context ctx = one_thread();
  ctx.threads = 2;
  auto m = Model::load(dir.str(), ctx, false, lq);
  size_t resident = 0;
  for (auto& [fmt, n] : m->weights().bytes_by_format) resident += n;
  const size_t peak = status_kb("VmHWM") * 1024 - before;
  std::printf("checkpoint %.3f GB, quantized resident %.3f GB, peak growth while quantizing at load %.3f GB\n",
              double(ckpt_bytes) / 1e9, double(resident) / 1e9, double(peak) / 1e9);
  EXPECT_LT(resident, ckpt_bytes / 3);
  EXPECT_LT(peak, resident + (size_t(96) << 20));
  EXPECT_LT(peak, ckpt_bytes / 2);
}

}  // namespace
}  // namespace mla

namespace mla {
namespace {

// Writes the benchmark's random checkpoint of layout w (demo config) into dir, loads it, checks
// the formats of the routed experts and of the other projections (router, embeddings and lm_head
// bf16) and that its logits are finite.
std::unique_ptr<Model> check_random_layout(const test::TempDir& dir, RandomWeights w, WeightFormat experts,
                                           WeightFormat others) {
  RandomCheckpointOptions ro;
  ro.weights = w;
  write_random_checkpoint(dir.str(), demo_config(512), ro);
  auto m = Model::load(dir.str(), one_thread());
  const auto& L = m->weights().layers[1];
  EXPECT_EQ(L.experts[5].down.format, experts);
  EXPECT_EQ(L.q_b.format, others);
  EXPECT_EQ(L.shared.gate.format, others);
  EXPECT_EQ(m->weights().layers[0].dense.gate.format, others);
  EXPECT_EQ(L.router.format, WeightFormat::BF16);
  EXPECT_EQ(m->weights().lm_head.format, WeightFormat::BF16);
  const auto logits = run_logits(*m, {1, 2, 3}, {});
  for (float v : logits) EXPECT_TRUE(std::isfinite(v));
  return m;
}

TEST(Quantize, RandomInt4Fp8CheckpointLoads) {
  // The benchmark's int4-fp8 layout, written directly: INT4 experts, FP8 projections with
  // compressed-tensors' weight_scale, bf16 router, embeddings and lm_head.
  test::TempDir dir("random-int4-fp8");
  check_random_layout(dir, RandomWeights::INT4_FP8, WeightFormat::INT4_GROUP, WeightFormat::FP8_BLOCK128);
  Checkpoint ck(dir.str());
  EXPECT_NE(ck.find("model.layers.1.self_attn.o_proj.weight_scale"), nullptr);
  EXPECT_EQ(ck.find("model.layers.1.self_attn.o_proj.weight_scale_inv"), nullptr);
}

TEST(Quantize, UnsupportedFp8GroupIsRefused) {
  test::TempDir out("quantize-bad");
  quantize(test::fixture("deepseek-v2-lite-tiny"), out.str(), QuantFormat::INT4, QuantFormat::FP8);
  json c = read_json(out / "config.json");
  c["quantization_config"]["config_groups"]["group_1"]["weights"]["block_structure"] = {64, 64};
  std::ofstream(out / "config.json") << c.dump();
  try {
    Model::load(out.str());
    FAIL() << "loaded a 64x64 block FP8 config";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("block_structure"), std::string::npos) << e.what();
  }
}

// INT8 groups: the copy is a compressed-tensors int-quantized checkpoint (I8 `weight`, BF16
// `weight_scale` per group of 32) that the loader reads back as INT8_GROUP, its config names the
// group, its error sits within measured bounds and below block FP8's on the same weights,
// quantizing at load gives exactly the written checkpoint's logits, and malformed INT8
// checkpoints are refused with the tensor named.
TEST(QuantizeInt8, OthersReloadWithinMeasuredBoundAndBeatFp8) {
  test::TempDir out("quantize-int8");
  const std::string in = test::fixture("deepseek-v3-tiny");
  const auto rep = quantize(in, out.str(), QuantFormat::BF16, QuantFormat::INT8);
  // One int-quantized group over attention, shared experts and dense MLPs.
  const json q = written_quantization_config(out.path);
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
  quantize(in, out8.str(), QuantFormat::BF16, QuantFormat::FP8);
  auto fm = Model::load(out8.str(), one_thread());
  const auto df = logits_distance(*ref, *fm, seqs);
  EXPECT_LT(d.mean_kl, df.mean_kl);
  EXPECT_LT(d.mean_abs, df.mean_abs);
}

TEST(QuantizeInt8, WithInt4ExpertsIsMixedPrecisionAndAtLoadEqualsTheCheckpoint) {
  test::TempDir out("quantize-int4-int8");
  const std::string in = test::fixture("deepseek-v3-tiny");
  quantize(in, out.str(), QuantFormat::INT4, QuantFormat::INT8, quant::ScaleRule::Search, QuantFormat::INT8);
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
  const auto rep = quantize(out.str(), again.str(), QuantFormat::INT4, QuantFormat::INT8, quant::ScaleRule::Search, QuantFormat::INT8);
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
  quantize(test::fixture("deepseek-v2-lite-tiny"), out.str(), QuantFormat::BF16, QuantFormat::INT8);
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

TEST(QuantizeInt8, RandomInt8CheckpointLoads) {
  // The benchmark's int8 layout, written directly: every decoder projection INT8 (group 32),
  // bf16 router, embeddings and lm_head; the codes and scales give weights of about the std asked.
  test::TempDir dir("random-int8");
  auto m = check_random_layout(dir, RandomWeights::INT8, WeightFormat::INT8_GROUP, WeightFormat::INT8_GROUP);
  Checkpoint ck(dir.str());
  EXPECT_EQ(ck.get("model.layers.1.self_attn.o_proj.weight").dtype, DType::I8);
  EXPECT_EQ(ck.get("model.layers.1.self_attn.o_proj.weight_scale").dtype, DType::BF16);
  const MatrixView& o = m->weights().layers[1].o;
  std::vector<float> row(size_t(o.cols));
  double sq = 0;
  for (int64_t r = 0; r < o.rows; ++r) {
    o.dequant_row(r, row.data());
    for (float v : row) sq += double(v) * v;
  }
  // std 0.02 asked; the scales are uniform within +-17% of their mean: within 10% of 0.02.
  EXPECT_NEAR(std::sqrt(sq / double(o.rows * o.cols)), 0.02, 0.002);
}

}  // namespace
}  // namespace mla
