// Bad checkpoints end with an error naming the file, the tensor and what is wrong: never a
// crash, never a silent wrong answer.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "format/error.h"
#include "tools/checkpoint_writer.h"
#include "model/model.h"
#include "test_util.h"

namespace mla {
namespace {

using nlohmann::json;

void write_raw(const std::string& path, const std::string& header, size_t data_bytes, uint64_t hlen_override = 0) {
  std::ofstream f(path, std::ios::binary);
  uint64_t n = hlen_override ? hlen_override : header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header;
  f << std::string(data_bytes, '\0');
}

// Runs fn, expects a FormatError whose message contains every fragment.
template <class F>
void expect_error(F fn, std::vector<std::string> fragments) {
  try {
    fn();
    ADD_FAILURE() << "no error raised; expected one mentioning " << fragments[0];
  } catch (const FormatError& e) {
    std::string msg = e.what();
    for (auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "message: " << msg << "\nlacks: " << f;
  }
}

TEST(BadSafetensors, TooShortForHeaderLength) {
  test::TempDir d("bad");
  std::ofstream(d / "a.safetensors") << "abc";
  expect_error([&] { SafetensorsFile f(d / "a.safetensors"); }, {"a.safetensors", "truncated"});
}

TEST(BadSafetensors, HeaderLengthPastEnd) {
  test::TempDir d("bad");
  write_raw(d / "a.safetensors", "{}", 0, 1000);
  expect_error([&] { SafetensorsFile f(d / "a.safetensors"); }, {"a.safetensors", "header length 1000", "past the end"});
}

TEST(BadSafetensors, HeaderNotJson) {
  test::TempDir d("bad");
  write_raw(d / "a.safetensors", "{not json", 0);
  expect_error([&] { SafetensorsFile f(d / "a.safetensors"); }, {"a.safetensors", "not valid JSON"});
}

TEST(BadSafetensors, OffsetsOutOfRange) {
  test::TempDir d("bad");
  write_raw(d / "a.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  expect_error([&] { SafetensorsFile f(d / "a.safetensors"); }, {"a.safetensors", "'w'", "past the end"});
}

TEST(BadSafetensors, TruncatedData) {
  // A valid file cut short: the last tensor's bytes are missing.
  test::TempDir d("bad");
  std::vector<float> v(64, 1.0f);
  write_safetensors(d / "a.safetensors", {{"x", tensor_f32({64}, v.data())}});
  std::filesystem::resize_file(d / "a.safetensors", std::filesystem::file_size(d / "a.safetensors") - 10);
  expect_error([&] { SafetensorsFile f(d / "a.safetensors"); }, {"a.safetensors", "'x'", "truncated"});
}

TEST(BadSafetensors, OffsetsReversed) {
  test::TempDir d("bad");
  write_raw(d / "a.safetensors", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8);
  expect_error([&] { SafetensorsFile f(d / "a.safetensors"); }, {"'w'", "begin after they end"});
}

TEST(BadSafetensors, Overlapping) {
  test::TempDir d("bad");
  write_raw(d / "a.safetensors",
            R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
            24);
  expect_error([&] { SafetensorsFile f(d / "a.safetensors"); }, {"a.safetensors", "overlaps"});
}

TEST(BadSafetensors, ByteSizeMismatch) {
  test::TempDir d("bad");
  write_raw(d / "a.safetensors", R"({"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,16]}})", 16);
  expect_error([&] { SafetensorsFile f(d / "a.safetensors"); }, {"'w'", "16 bytes", "BF16 [4] needs 8"});
}

TEST(BadSafetensors, UnknownDtype) {
  test::TempDir d("bad");
  write_raw(d / "a.safetensors", R"({"w":{"dtype":"Q7","shape":[4],"data_offsets":[0,4]}})", 4);
  expect_error([&] { SafetensorsFile f(d / "a.safetensors"); }, {"'w'", "unsupported dtype"});
}

// A copy of a fixture with one change applied to the config or the tensors.
struct Mutated {
  test::TempDir dir{"ckpt"};
  std::vector<TensorSpec> specs;
  json config;
  std::unique_ptr<SafetensorsFile> src;
  explicit Mutated(const std::string& fixture) {
    std::ifstream f(test::fixture(fixture) + "/config.json");
    config = json::parse(f);
    src = std::make_unique<SafetensorsFile>(test::fixture(fixture) + "/model.safetensors");
    for (auto& [name, t] : src->tensors()) {
      const TensorInfo* tp = &t;
      specs.push_back({name, t.dtype, t.shape, [tp](uint8_t* out) { std::memcpy(out, tp->data, tp->nbytes); }});
    }
  }
  TensorSpec* find(const std::string& name) {
    for (auto& s : specs)
      if (s.name == name) return &s;
    return nullptr;
  }
  std::string write(int shards = 1) {
    write_checkpoint(dir.str(), config, specs, shards);
    return dir.str();
  }
};

TEST(BadCheckpoint, MissingTensor) {
  Mutated m("deepseek-v3-tiny");
  std::erase_if(m.specs, [](auto& s) { return s.name == "model.layers.1.self_attn.kv_b_proj.weight"; });
  auto dir = m.write();
  expect_error([&] { Model::load(dir); }, {"model.layers.1.self_attn.kv_b_proj.weight", "missing"});
}

TEST(BadCheckpoint, WrongShapeForConfig) {
  Mutated m("deepseek-v3-tiny");
  m.config["kv_lora_rank"] = 32;  // the tensors are for 64
  auto dir = m.write();
  expect_error([&] { Model::load(dir); }, {"model.safetensors", "kv_a_proj_with_mqa.weight", "has shape", "config needs"});
}

TEST(BadCheckpoint, WrongDtypeForWeight) {
  Mutated m("deepseek-v3-tiny");
  auto* s = m.find("model.layers.0.self_attn.o_proj.weight");
  ASSERT_TRUE(s);
  s->dtype = DType::I16;  // same bytes, a dtype no weight may have
  auto dir = m.write();
  expect_error([&] { Model::load(dir); }, {"model.safetensors", "o_proj.weight", "I16", "not supported"});
}

TEST(BadCheckpoint, Fp8WithoutScale) {
  Mutated m("deepseek-v3-fp8-tiny");
  std::erase_if(m.specs, [](auto& s) { return s.name == "model.layers.0.mlp.up_proj.weight_scale_inv"; });
  auto dir = m.write();
  expect_error([&] { Model::load(dir); }, {"model.layers.0.mlp.up_proj.weight_scale_inv", "missing"});
}

TEST(BadCheckpoint, Fp8ScaleWrongShape) {
  Mutated m("deepseek-v3-fp8-tiny");
  auto* s = m.find("model.layers.0.mlp.up_proj.weight_scale_inv");
  ASSERT_TRUE(s);
  auto* t = m.src->find(s->name);
  s->shape = {t->shape[1], t->shape[0]};  // transposed: same bytes, wrong shape
  if (s->shape == t->shape) GTEST_SKIP() << "square scale grid";
  auto dir = m.write();
  expect_error([&] { Model::load(dir); }, {"up_proj.weight_scale_inv", "has shape"});
}

TEST(BadCheckpoint, UnknownModelType) {
  Mutated m("deepseek-v3-tiny");
  m.config["model_type"] = "llama";
  auto dir = m.write();
  expect_error([&] { Model::load(dir); }, {"config.json", "unknown model_type 'llama'"});
}

TEST(BadCheckpoint, UnsupportedOptions) {
  for (auto [key, value, fragment] : std::vector<std::tuple<std::string, json, std::string>>{
           {"hidden_act", "gelu", "hidden_act 'gelu'"},
           {"topk_method", "random", "topk_method 'random'"},
           {"scoring_func", "tanh", "scoring_func 'tanh'"},
           {"rope_scaling", json{{"type", "dynamic"}, {"factor", 2.0}}, "rope_scaling type 'dynamic'"},
           {"moe_layer_freq", 2, "moe_layer_freq"},
           {"n_group", 3, "multiple of n_group"},
           {"quantization_config", json{{"quant_method", "awq"}}, "quant_method 'awq'"},
       }) {
    Mutated m("deepseek-v3-tiny");
    m.config[key] = value;
    auto dir = m.write();
    expect_error([&] { Model::load(dir); }, {"config.json", fragment});
  }
}

// Values out of range end at config.json with the key named, before any weight is read (they
// gave NaN logits or overflowing sizes before).
TEST(BadCheckpoint, ConfigValuesOutOfRange) {
  for (auto [key, value, fragment] : std::vector<std::tuple<std::string, json, std::string>>{
           {"rms_norm_eps", -1e-6, "'rms_norm_eps'"},
           {"rms_norm_eps", 0.0, "'rms_norm_eps'"},
           {"routed_scaling_factor", 1e308, "'routed_scaling_factor'"},
           {"routed_scaling_factor", -2.5, "'routed_scaling_factor'"},
           {"rope_theta", 0.0, "'rope_theta'"},
           {"rope_theta", -10000.0, "'rope_theta'"},
           {"hidden_size", int64_t(1) << 40, "'hidden_size'"},
           {"num_hidden_layers", 100000, "'num_hidden_layers'"},
           {"vocab_size", int64_t(1) << 40, "'vocab_size'"},
           {"max_position_embeddings", -5, "'max_position_embeddings'"},
           {"q_lora_rank", -3, "'q_lora_rank'"},
           {"n_shared_experts", -1, "'n_shared_experts'"},
           {"first_k_dense_replace", 99, "'first_k_dense_replace'"},
           {"eos_token_id", json::array({1, "two"}), "'eos_token_id'"},
           {"rope_scaling", json{{"type", "yarn"}, {"factor", -4.0}, {"original_max_position_embeddings", 64}},
            "'rope_scaling.factor'"},
       }) {
    SCOPED_TRACE(key + " = " + value.dump());
    Mutated m("deepseek-v3-tiny");
    m.config[key] = value;
    auto dir = m.write();
    expect_error([&] { Model::load(dir); }, {"config.json", fragment});
  }
}

// A checkpoint with more decoder layers than config.json names is an error, not a model
// silently run without its last layers.
TEST(BadCheckpoint, MoreLayersThanNumHiddenLayers) {
  Mutated m("deepseek-v3-tiny");
  const int64_t layers = m.config["num_hidden_layers"].get<int64_t>();
  ASSERT_GE(layers, 2);
  m.config["num_hidden_layers"] = layers - 1;
  auto dir = m.write();
  expect_error([&] { Model::load(dir); },
               {"model.layers." + std::to_string(layers - 1), "num_hidden_layers is " + std::to_string(layers - 1)});
}

TEST(BadCheckpoint, ConfigMissingKey) {
  Mutated m("deepseek-v3-tiny");
  m.config.erase("kv_lora_rank");
  auto dir = m.write();
  expect_error([&] { Model::load(dir); }, {"config.json", "missing required key 'kv_lora_rank'"});
}

TEST(BadCheckpoint, ShardMissing) {
  Mutated m("deepseek-v3-tiny");
  auto dir = m.write(3);
  std::filesystem::remove(dir + "/model-00002-of-00003.safetensors");
  expect_error([&] { Model::load(dir); }, {"model-00002-of-00003.safetensors", "missing"});
}

TEST(BadCheckpoint, IndexNamesWrongShard) {
  Mutated m("deepseek-v3-tiny");
  auto dir = m.write(2);
  std::ifstream f(dir + "/model.safetensors.index.json");
  json idx = json::parse(f);
  f.close();
  idx["weight_map"]["model.norm.weight"] =
      idx["weight_map"]["model.norm.weight"] == "model-00001-of-00002.safetensors" ? "model-00002-of-00002.safetensors"
                                                                                    : "model-00001-of-00002.safetensors";
  std::ofstream(dir + "/model.safetensors.index.json") << idx.dump();
  expect_error([&] { Model::load(dir); }, {"model.norm.weight", "not in that shard"});
}

// Kimi K2.5's INT4 experts: the quantization config and the tensors must agree.
void edit_quant(json& cfg, const std::function<void(json&)>& f) {
  f(cfg["quantization_config"]);
  f(cfg["text_config"]["quantization_config"]);
}

TEST(BadCheckpoint, Int4IgnoreListDisagreesWithTensors) {
  {
    Mutated m("kimi-k2.5-int4-tiny");  // attention no longer ignored: it should be packed, and is not
    edit_quant(m.config, [](json& q) {
      json keep = json::array();
      for (auto& e : q["ignore"])
        if (e != "re:.*self_attn.*") keep.push_back(e);
      q["ignore"] = keep;
    });
    auto dir = m.write();
    expect_error([&] { Model::load(dir); }, {"self_attn", "weight_packed", "quantizes this layer"});
  }
  {
    Mutated m("kimi-k2.5-int4-tiny");  // experts ignored, yet packed
    edit_quant(m.config, [](json& q) { q["ignore"].push_back("re:.*experts.*"); });
    auto dir = m.write();
    expect_error([&] { Model::load(dir); }, {"experts", "weight_packed", "ignore list keeps this layer unquantized"});
  }
}

TEST(BadCheckpoint, Int4UnsupportedSchemes) {
  for (auto [key, value, fragment] : std::vector<std::tuple<std::string, json, std::string>>{
           {"num_bits", 6, "num_bits = 6"},  // 8 is an INT8 group (int-quantized)
           {"symmetric", false, "symmetric = false"},
           {"strategy", "channel", "strategy = \"channel\""},
           {"type", "float", "type = \"float\""},
           {"group_size", 0, "group_size"},
       }) {
    Mutated m("kimi-k2.5-int4-tiny");
    edit_quant(m.config, [&, key = key, value = value](json& q) { q["config_groups"]["group_0"]["weights"][key] = value; });
    auto dir = m.write();
    expect_error([&] { Model::load(dir); }, {"config.json", "quantization_config", fragment, "not supported"});
  }
}

TEST(BadCheckpoint, Int4ShapeDisagreesWithConfig) {
  Mutated m("kimi-k2.5-int4-tiny");
  auto* s = m.find("language_model.model.layers.1.mlp.experts.3.up_proj.weight_shape");
  ASSERT_TRUE(s);
  s->fill = [](uint8_t* out) {
    int32_t v[2] = {33, 128};
    std::memcpy(out, v, 8);
  };
  auto dir = m.write();
  expect_error([&] { Model::load(dir); }, {"experts.3.up_proj.weight_shape", "says [33, 128]", "config needs"});
}

TEST(BadInput, TokenOutsideVocabulary) {
  auto model = Model::load(test::fixture("deepseek-v3-tiny"));
  LatentPool pool = model->make_pool(4);
  PageTable seq;
  std::vector<int32_t> ids = {1, 2, 100000};
  SeqSlice s{&seq, ids};
  std::vector<float> logits;
  EXPECT_THROW(model->forward(std::span<SeqSlice>(&s, 1), pool, {}, logits), std::invalid_argument);
  EXPECT_EQ(seq.length, 0);
  EXPECT_TRUE(seq.pages.empty());
  EXPECT_EQ(pool.free_pages(), 4);
}

}  // namespace
}  // namespace mla
