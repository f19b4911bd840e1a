// RoPE in either config form: the older top-level rope_theta / rope_scaling, and transformers 5's
// rope_parameters object (rope_theta, rope_type and the scaling fields in one place). Every
// fixture with its config rewritten to the new form gives the same ModelConfig and the same
// logits; unknown or contradictory rope settings are errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "format/error.h"
#include "model/config.h"
#include "model/model.h"
#include "tools/run_modes.h"
#include "test_util.h"

namespace mla {
namespace {

using nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream f(path);
  return json::parse(f);
}

// The transformers 5 form of a config: rope_theta and rope_scaling folded into rope_parameters.
json to_rope_parameters(json c) {
  json& j = c.contains("text_config") ? c["text_config"] : c;
  json rp = json::object();
  rp["rope_theta"] = j.value("rope_theta", 10000.0);
  rp["rope_type"] = "default";
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    for (auto& [k, v] : j["rope_scaling"].items())
      if (k != "type") rp[k] = v;
    rp["rope_type"] = j["rope_scaling"].value("type", j["rope_scaling"].value("rope_type", "default"));
  }
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = rp;
  return c;
}

// A copy of the fixture folder whose config.json is `config` (weights linked, not copied).
void write_fixture(const std::string& name, const json& config, const test::TempDir& dir) {
  for (auto& e : std::filesystem::directory_iterator(test::fixture(name)))
    if (e.path().filename() != "config.json")
      std::filesystem::create_symlink(e.path(), dir.path / e.path().filename());
  std::ofstream(dir / "config.json") << config.dump(2);
}

json minimal() {
  return json::parse(R"({"model_type": "deepseek_v3", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
    "num_hidden_layers": 1, "num_attention_heads": 2, "kv_lora_rank": 8, "qk_nope_head_dim": 4,
    "qk_rope_head_dim": 4, "v_head_dim": 4})");
}

TEST(RopeParameters, EveryFixtureLoadsTheSameConfigAndLogits) {
  for (const std::string& name : test::model_fixtures()) {
    const json old_form = read_json(test::fixture(name) + "/config.json");
    const json new_form = to_rope_parameters(old_form);
    const ModelConfig a = ModelConfig::from_json(old_form), b = ModelConfig::from_json(new_form);
    EXPECT_EQ(a.rope_theta, b.rope_theta) << name;
    EXPECT_EQ(a.rope_scaling.yarn, b.rope_scaling.yarn) << name;
    EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor) << name;
    EXPECT_EQ(a.rope_scaling.original_max_position_embeddings, b.rope_scaling.original_max_position_embeddings) << name;
    EXPECT_EQ(a.rope_scaling.mscale, b.rope_scaling.mscale) << name;
    EXPECT_EQ(a.rope_scaling.mscale_all_dim, b.rope_scaling.mscale_all_dim) << name;
    EXPECT_EQ(a.softmax_scale(), b.softmax_scale()) << name;

    test::TempDir dir("rope-params");
    write_fixture(name, new_form, dir);
    auto m_old = Model::load(test::fixture(name));
    auto m_new = Model::load(dir.str());
    SafetensorsFile golden(test::fixture(name) + "/golden.safetensors");
    auto ids = test::read_ids(*golden.find("seq3_ids"));  // 108 tokens: past YaRN's original context
    RunOptions opt;
    opt.mode = RunMode::parse("prefill");
    auto want = run_logits(*m_old, ids, opt);
    auto got = run_logits(*m_new, ids, opt);
    EXPECT_EQ(test::max_abs_diff(got, want), 0.0f) << name;
  }
}

TEST(RopeParameters, RopeThetaIsReadFromTheNewForm) {
  json j = minimal();
  j["rope_parameters"] = {{"rope_theta", 1e6}, {"rope_type", "default"}};
  EXPECT_EQ(ModelConfig::from_json(j).rope_theta, 1e6);
  EXPECT_FALSE(ModelConfig::from_json(j).rope_scaling.yarn);
  j["rope_parameters"] = {{"rope_theta", 5e4},       {"rope_type", "yarn"}, {"factor", 40.0},
                          {"beta_fast", 32},         {"beta_slow", 1},      {"mscale", 0.9},
                          {"mscale_all_dim", 0.707}, {"original_max_position_embeddings", 4096}};
  const ModelConfig c = ModelConfig::from_json(j);
  EXPECT_EQ(c.rope_theta, 5e4);
  EXPECT_TRUE(c.rope_scaling.yarn);
  EXPECT_EQ(c.rope_scaling.factor, 40.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(c.rope_scaling.mscale, 0.9);
  EXPECT_EQ(c.rope_scaling.mscale_all_dim, 0.707);
}

void expect_error(const json& j, const std::string& needle) {
  try {
    ModelConfig::from_json(j);
    ADD_FAILURE() << "accepted: " << j.dump();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(RopeParameters, UnknownOrContradictoryRopeIsAnError) {
  json j = minimal();
  j["rope_parameters"] = {{"rope_theta", 1e4}, {"rope_type", "linear"}, {"factor", 2.0}};
  expect_error(j, "'linear'");
  j["rope_parameters"] = {{"rope_theta", 1e4}, {"rope_type", "llama3"}};
  expect_error(j, "'llama3'");
  j["rope_parameters"] = {{"rope_type", "default"}};
  expect_error(j, "no rope_theta");
  j["rope_parameters"] = {{"rope_theta", 1e4}, {"factor", 4.0}};
  expect_error(j, "no rope_type");
  j["rope_parameters"] = {{"full_attention", {{"rope_theta", 1e4}, {"rope_type", "default"}}}};
  expect_error(j, "per-layer-type");
  j["rope_parameters"] = {{"rope_theta", 1e4}, {"rope_type", "default"}};
  j["rope_theta"] = 5e4;
  expect_error(j, "disagree");
  j = minimal();
  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  expect_error(j, "'dynamic'");
  j["rope_scaling"] = {{"factor", 2.0}};
  expect_error(j, "no rope_type");
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 2.0}, {"original_max_position_embeddings", 64}};
  j["rope_parameters"] = {{"rope_theta", 1e4}, {"rope_type", "default"}};
  expect_error(j, "disagree");
}

}  // namespace
}  // namespace mla
