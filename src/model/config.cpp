#include "model/config.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "format/error.h"

namespace mla {

using nlohmann::json;

double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

double ModelConfig::softmax_scale() const {
  double s = 1.0 / std::sqrt(double(qk_head_dim()));
  if (rope_scaling.yarn && rope_scaling.mscale_all_dim != 0) {
    double m = yarn_mscale(rope_scaling.factor, rope_scaling.mscale_all_dim);
    s *= m * m;
  }
  return s;
}

namespace {

struct Reader {
  const json& j;
  const std::string& src;
  bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
  int64_t i(const char* k, std::optional<int64_t> def = std::nullopt) const {
    if (!has(k)) {
      if (def) return *def;
      format_error(src, "", std::string("missing required key '") + k + "'");
    }
    if (!j[k].is_number_integer()) format_error(src, "", std::string("key '") + k + "' must be an integer, got " + j[k].dump());
    return j[k].get<int64_t>();
  }
  double d(const char* k, double def) const {
    if (!has(k)) return def;
    if (!j[k].is_number()) format_error(src, "", std::string("key '") + k + "' must be a number, got " + j[k].dump());
    return j[k].get<double>();
  }
  bool b(const char* k, bool def) const {
    if (!has(k)) return def;
    if (!j[k].is_boolean()) format_error(src, "", std::string("key '") + k + "' must be true or false");
    return j[k].get<bool>();
  }
  std::string s(const char* k, const std::string& def) const {
    if (!has(k)) return def;
    if (!j[k].is_string()) format_error(src, "", std::string("key '") + k + "' must be a string");
    return j[k].get<std::string>();
  }
};

void parse_quantization(const json& q, const std::string& src, ModelConfig& c) {
  std::string method = q.value("quant_method", "");
  if (method == "fp8") {
    std::string fmt = q.value("fmt", "e4m3");
    if (fmt != "e4m3") format_error(src, "", "quantization_config.fmt '" + fmt + "' is not supported (only e4m3)");
    if (q.contains("weight_block_size") && q["weight_block_size"] != json::array({128, 128}))
      format_error(src, "", "quantization_config.weight_block_size " + q["weight_block_size"].dump() +
                                " is not supported (only [128, 128])");
    c.fp8_block_weights = true;
  } else if (method == "compressed-tensors") {
    std::string format = q.value("format", "");
    if (format != "pack-quantized" && format != "float-quantized" && format != "mixed-precision")
      format_error(src, "", "quantization_config.format '" + format +
                                "' is not supported (only pack-quantized, float-quantized, mixed-precision)");
    if (!q.contains("config_groups") || !q["config_groups"].is_object() || q["config_groups"].empty())
      format_error(src, "", "quantization_config.config_groups is missing");
    for (auto& [gname, g] : q["config_groups"].items()) {
      auto where = "quantization_config.config_groups." + gname + ".weights.";
      if (!g.contains("weights") || !g["weights"].is_object()) format_error(src, "", where + " is missing");
      auto& w = g["weights"];
      auto bad = [&](const char* key, const std::string& want) {
        format_error(src, "", where + key + " = " + (w.contains(key) ? w[key].dump() : "absent") +
                                  " is not supported (only " + want + ")");
      };
      // A block-FP8 group (float-quantized: F8_E4M3 weights, float32 weight_scale per 128 x 128
      // block): the loader tells those tensors by their dtype.
      if (w.value("type", "") == "float") {
        if (w.value("num_bits", 0) != 8) bad("type", "\"int\" with num_bits 4, or \"float\" with num_bits 8");
        if (w.value("strategy", "") != "block") bad("strategy", "\"block\" for type float");
        if (!w.contains("block_structure") || w["block_structure"] != json::array({128, 128}))
          bad("block_structure", "[128, 128]");
        if (!w.value("symmetric", false)) bad("symmetric", "true");
        if (w.value("dynamic", false)) bad("dynamic", "false");
        if (g.contains("input_activations") && !g["input_activations"].is_null())
          format_error(src, "", "quantization_config.config_groups." + gname + ".input_activations is not supported");
        c.fp8_block_weights = true;
        continue;
      }
      if (w.value("num_bits", 0) != 4) bad("num_bits", "4");
      if (w.value("type", "") != "int") bad("type", "\"int\"");
      if (!w.value("symmetric", false)) bad("symmetric", "true");
      if (w.value("strategy", "") != "group") bad("strategy", "\"group\"");
      if (!w.contains("group_size") || !w["group_size"].is_number_integer() || w["group_size"].get<int>() <= 0)
        bad("group_size", "a positive integer");
      if (w.value("dynamic", false)) bad("dynamic", "false");
      if (w.contains("actorder") && !w["actorder"].is_null()) bad("actorder", "null");
      if (g.contains("input_activations") && !g["input_activations"].is_null())
        format_error(src, "", "quantization_config.config_groups." + gname + ".input_activations is not supported");
      c.int4.enabled = true;
      c.int4.group_size = w["group_size"].get<int>();
      if (g.contains("targets"))
        for (auto& t : g["targets"]) c.int4.targets.push_back(t.get<std::string>());
    }
    if (q.contains("ignore"))
      for (auto& s : q["ignore"]) c.int4.ignore.push_back(s.get<std::string>());
  } else if (!method.empty()) {
    format_error(src, "", "quantization_config.quant_method '" + method + "' is not supported");
  }
}

// Ranges of the values from_json read: a config that passes runs without NaN from its
// constants and without sizes that overflow the arithmetic of the cache and the weights.
// Every message names the key.
void validate(const ModelConfig& c, const std::string& src) {
  auto fail = [&](const std::string& key, const std::string& what) {
    format_error(src, "", "key '" + key + "' " + what);
  };
  auto size = [&](const char* key, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
      fail(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(v));
  };
  auto real = [&](const char* key, double v, double lo, double hi, bool lo_open) {
    if (!std::isfinite(v) || v < lo || v > hi || (lo_open && v == lo)) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "must be finite and in %s%g, %g], got %g", lo_open ? "(" : "[", lo, hi, v);
      fail(key, buf);
    }
  };
  size("vocab_size", c.vocab_size, 1, int64_t(1) << 24);
  size("hidden_size", c.hidden_size, 1, int64_t(1) << 16);
  size("intermediate_size", c.intermediate_size, 0, int64_t(1) << 20);
  size("num_hidden_layers", c.num_hidden_layers, 1, 1024);
  size("num_attention_heads", c.num_attention_heads, 1, 1024);
  size("q_lora_rank", c.q_lora_rank, 0, int64_t(1) << 16);
  size("kv_lora_rank", c.kv_lora_rank, 1, int64_t(1) << 16);
  size("qk_nope_head_dim", c.qk_nope_head_dim, 1, 4096);
  size("qk_rope_head_dim", c.qk_rope_head_dim, 2, 4096);
  size("v_head_dim", c.v_head_dim, 1, 4096);
  size("n_routed_experts", c.n_routed_experts, 0, int64_t(1) << 16);
  size("moe_intermediate_size", c.moe_intermediate_size, 0, int64_t(1) << 20);
  size("n_shared_experts", c.n_shared_experts, 0, 1024);
  size("num_experts_per_tok", c.num_experts_per_tok, 0, std::max<int64_t>(c.n_routed_experts, 0));
  size("first_k_dense_replace", c.first_k_dense_replace, 0, c.num_hidden_layers);
  size("max_position_embeddings", c.max_position_embeddings, 1, int64_t(1) << 24);
  if (c.n_routed_experts == 0 || c.first_k_dense_replace > 0) size("intermediate_size", c.intermediate_size, 1, int64_t(1) << 20);
  real("rms_norm_eps", c.rms_norm_eps, 0, 1, true);
  real("routed_scaling_factor", c.routed_scaling_factor, 0, 1000, true);
  real("rope_theta", c.rope_theta, 0, 1e12, true);
  if (c.rope_scaling.yarn) {
    real("rope_scaling.factor", c.rope_scaling.factor, 0, 1e6, true);
    size("rope_scaling.original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings, 1,
         int64_t(1) << 24);
    real("rope_scaling.beta_fast", c.rope_scaling.beta_fast, -1e6, 1e6, false);
    real("rope_scaling.beta_slow", c.rope_scaling.beta_slow, -1e6, 1e6, false);
    real("rope_scaling.mscale", c.rope_scaling.mscale, -1e6, 1e6, false);
    real("rope_scaling.mscale_all_dim", c.rope_scaling.mscale_all_dim, -1e6, 1e6, false);
  }
}

}  // namespace

namespace {

ModelConfig parse_config(const json& root, const std::string& src) {
  if (!root.is_object()) format_error(src, "", "not a JSON object");
  ModelConfig c;
  c.model_type = Reader{root, src}.s("model_type", "");
  const json* jp = &root;
  if (c.model_type == "kimi_k25") {
    if (!root.contains("text_config") || !root["text_config"].is_object())
      format_error(src, "", "kimi_k25 config has no text_config object");
    jp = &root["text_config"];
    c.weight_prefix = "language_model.";
  }
  const json& j = *jp;
  std::string family = c.model_type == "kimi_k25" ? Reader{j, src}.s("model_type", "kimi_k2") : c.model_type;
  static const char* known[] = {"deepseek_v2", "deepseek_v3", "kimi_k2", "glm4_moe_lite"};
  if (std::find(std::begin(known), std::end(known), family) == std::end(known))
    format_error(src, "", "unknown model_type '" + family +
                              "' (supported: deepseek_v2, deepseek_v3, kimi_k2, kimi_k25, glm4_moe_lite)");
  Reader r{j, src};
  c.vocab_size = r.i("vocab_size");
  c.hidden_size = r.i("hidden_size");
  c.intermediate_size = r.i("intermediate_size");
  c.num_hidden_layers = r.i("num_hidden_layers");
  c.num_attention_heads = r.i("num_attention_heads");
  c.q_lora_rank = r.i("q_lora_rank", 0);
  c.kv_lora_rank = r.i("kv_lora_rank");
  c.qk_nope_head_dim = r.i("qk_nope_head_dim");
  c.qk_rope_head_dim = r.i("qk_rope_head_dim");
  c.v_head_dim = r.i("v_head_dim");
  c.n_routed_experts = r.i("n_routed_experts", 0);
  c.moe_intermediate_size = r.i("moe_intermediate_size", c.n_routed_experts ? std::nullopt : std::optional<int64_t>(0));
  c.n_shared_experts = r.i("n_shared_experts", 0);
  c.num_experts_per_tok = r.i("num_experts_per_tok", c.n_routed_experts ? std::nullopt : std::optional<int64_t>(0));
  c.n_group = r.i("n_group", 1);
  c.topk_group = r.i("topk_group", 1);
  c.first_k_dense_replace = r.i("first_k_dense_replace", 0);
  c.moe_layer_freq = r.i("moe_layer_freq", 1);
  c.norm_topk_prob = r.b("norm_topk_prob", false);
  c.routed_scaling_factor = r.d("routed_scaling_factor", 1.0);
  c.rms_norm_eps = r.d("rms_norm_eps", 1e-6);
  c.rope_theta = r.d("rope_theta", 10000.0);
  c.tie_word_embeddings = r.b("tie_word_embeddings", false);
  c.max_position_embeddings = r.i("max_position_embeddings", 4096);
  c.bos_token_id = r.i("bos_token_id", -1);
  if (j.contains("eos_token_id")) {
    auto& e = j["eos_token_id"];
    if (e.is_number_integer()) c.eos_token_ids.push_back(e.get<int64_t>());
    else if (e.is_array())
      for (auto& x : e) {
        if (!x.is_number_integer()) format_error(src, "", "key 'eos_token_id' must be an integer or a list of integers");
        c.eos_token_ids.push_back(x.get<int64_t>());
      }
  }

  // Routing: V2 scores with softmax and picks greedily; V3, Kimi and GLM use sigmoid with
  // e_score_correction_bias and noaux_tc, unless the config says otherwise.
  bool v2 = family == "deepseek_v2";
  std::string scoring = r.s("scoring_func", v2 ? "softmax" : "sigmoid");
  if (scoring == "softmax") c.scoring_func = ScoringFunc::Softmax;
  else if (scoring == "sigmoid") c.scoring_func = ScoringFunc::Sigmoid;
  else format_error(src, "", "scoring_func '" + scoring + "' is not supported (softmax, sigmoid)");
  std::string method = r.s("topk_method", v2 ? "greedy" : "noaux_tc");
  if (method == "greedy" || method == "gready") c.topk_method = TopkMethod::Greedy;
  else if (method == "group_limited_greedy") c.topk_method = TopkMethod::GroupLimitedGreedy;
  else if (method == "noaux_tc") c.topk_method = TopkMethod::NoauxTc;
  else format_error(src, "", "topk_method '" + method + "' is not supported (greedy, group_limited_greedy, noaux_tc)");

  std::string act = r.s("hidden_act", "silu");
  if (act != "silu") format_error(src, "", "hidden_act '" + act + "' is not supported (only silu)");
  if (r.b("attention_bias", false)) format_error(src, "", "attention_bias true is not supported");
  if (r.d("partial_rotary_factor", 1.0) != 1.0) format_error(src, "", "partial_rotary_factor != 1 is not supported");
  if (c.moe_layer_freq != 1) format_error(src, "", "moe_layer_freq " + std::to_string(c.moe_layer_freq) + " is not supported (only 1)");

  if (r.has("rope_scaling")) {
    auto& rs = j["rope_scaling"];
    std::string type = rs.value("type", rs.value("rope_type", ""));
    if (type == "yarn") {
      Reader y{rs, src};
      c.rope_scaling.yarn = true;
      c.rope_scaling.factor = y.d("factor", 1.0);
      c.rope_scaling.original_max_position_embeddings = y.i("original_max_position_embeddings");
      c.rope_scaling.beta_fast = y.d("beta_fast", 32);
      c.rope_scaling.beta_slow = y.d("beta_slow", 1);
      c.rope_scaling.mscale = y.d("mscale", 1);
      c.rope_scaling.mscale_all_dim = y.d("mscale_all_dim", 0);
    } else if (type != "default" && !type.empty()) {
      format_error(src, "", "rope_scaling type '" + type + "' is not supported (yarn)");
    }
  }

  auto positive = [&](const char* name, int64_t v) {
    if (v <= 0) format_error(src, "", std::string(name) + " must be positive, got " + std::to_string(v));
  };
  positive("vocab_size", c.vocab_size);
  positive("hidden_size", c.hidden_size);
  positive("num_hidden_layers", c.num_hidden_layers);
  positive("num_attention_heads", c.num_attention_heads);
  positive("kv_lora_rank", c.kv_lora_rank);
  positive("qk_nope_head_dim", c.qk_nope_head_dim);
  positive("v_head_dim", c.v_head_dim);
  if (c.qk_rope_head_dim <= 0 || c.qk_rope_head_dim % 2) format_error(src, "", "qk_rope_head_dim must be positive and even");
  if (c.n_routed_experts > 0) {
    positive("num_experts_per_tok", c.num_experts_per_tok);
    positive("moe_intermediate_size", c.moe_intermediate_size);
    if (c.num_experts_per_tok > c.n_routed_experts) format_error(src, "", "num_experts_per_tok exceeds n_routed_experts");
    if (c.n_group <= 0 || c.n_routed_experts % c.n_group)
      format_error(src, "", "n_routed_experts must be a multiple of n_group");
    if (c.topk_group <= 0 || c.topk_group > c.n_group) format_error(src, "", "topk_group must be in 1..n_group");
  }

  for (const json* q : {&root, jp})
    if (q->contains("quantization_config") && (*q)["quantization_config"].is_object())
      parse_quantization((*q)["quantization_config"], src, c);
  validate(c, src);
  return c;
}

}  // namespace

ModelConfig ModelConfig::from_json(const json& root, const std::string& src) {
  try {
    return parse_config(root, src);
  } catch (const json::exception& e) {  // a nested value of the wrong type (quantization_config ...)
    format_error(src, "", std::string("a value has the wrong type: ") + e.what());
  }
}

ModelConfig ModelConfig::load(const std::string& dir) {
  auto path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream f(path);
  if (!f) format_error(path, "", "cannot open");
  json j;
  try {
    j = json::parse(f);
  } catch (const json::exception& e) {
    format_error(path, "", std::string("not valid JSON: ") + e.what());
  }
  return from_json(j, path);
}

}  // namespace mla
