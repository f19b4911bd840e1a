#include "model/config.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "format/error.h"
#include "format/gguf.h"
#include "model/gguf_model.h"

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

// RoPE as either form of config.json: the older top-level `rope_theta` with an optional
// `rope_scaling` object ({"type" or "rope_type": "yarn", factor, ...}), or transformers 5's
// `rope_parameters` object holding rope_theta, rope_type and the scaling fields together. Where
// both forms are present they must agree. A rope type other than default / yarn is an error,
// and so is a non-empty scaling object that names no type.
void parse_rope(const json& j, const std::string& src, ModelConfig& c) {
  Reader r{j, src};
  const bool has_params = r.has("rope_parameters"), has_scaling = r.has("rope_scaling");
  if (has_params && !j["rope_parameters"].is_object())
    format_error(src, "", "key 'rope_parameters' must be an object, got " + j["rope_parameters"].dump());
  if (has_scaling && !j["rope_scaling"].is_object())
    format_error(src, "", "key 'rope_scaling' must be an object, got " + j["rope_scaling"].dump());
  auto read_scaling = [&](const json& rs, const std::string& key, RopeScaling& out) {
    std::string type;
    for (const char* k : {"rope_type", "type"})
      if (rs.contains(k) && !rs[k].is_null()) {
        if (!rs[k].is_string()) format_error(src, "", "key '" + key + "." + k + "' must be a string");
        if (!type.empty() && type != rs[k].get<std::string>())
          format_error(src, "", "key '" + key + "' names two rope types, '" + type + "' and '" +
                                    rs[k].get<std::string>() + "'");
        type = rs[k].get<std::string>();
      }
    bool fields = false;
    for (auto& [k, v] : rs.items())
      if (k != "rope_theta" && k != "rope_type" && k != "type" && k != "partial_rotary_factor" && !v.is_null()) fields = true;
    if (type.empty() && fields)
      format_error(src, "", "key '" + key + "' has scaling fields but no rope_type");
    if (type == "yarn") {
      Reader y{rs, src};
      out.yarn = true;
      out.factor = y.d("factor", 1.0);
      out.original_max_position_embeddings = y.i("original_max_position_embeddings");
      out.beta_fast = y.d("beta_fast", 32);
      out.beta_slow = y.d("beta_slow", 1);
      out.mscale = y.d("mscale", 1);
      out.mscale_all_dim = y.d("mscale_all_dim", 0);
    } else if (type != "default" && !type.empty()) {
      format_error(src, "", key + " type '" + type + "' is not supported (default, yarn)");
    }
  };
  RopeScaling legacy;
  if (has_scaling) read_scaling(j["rope_scaling"], "rope_scaling", legacy);
  if (!has_params) {
    c.rope_theta = r.d("rope_theta", 10000.0);
    c.rope_scaling = legacy;
    return;
  }
  const json& rp = j["rope_parameters"];
  for (auto& [k, v] : rp.items())
    if (v.is_object())
      format_error(src, "", "key 'rope_parameters." + k + "' is a per-layer-type rope table, which is not supported");
  Reader pr{rp, src};
  if (!pr.has("rope_theta")) format_error(src, "", "key 'rope_parameters' has no rope_theta");
  c.rope_theta = pr.d("rope_theta", 10000.0);
  read_scaling(rp, "rope_parameters", c.rope_scaling);
  if (pr.has("partial_rotary_factor") && pr.d("partial_rotary_factor", 1.0) != 1.0)
    format_error(src, "", "rope_parameters.partial_rotary_factor != 1 is not supported");
  if (r.has("rope_theta") && r.d("rope_theta", 0) != c.rope_theta)
    format_error(src, "", "keys 'rope_theta' and 'rope_parameters.rope_theta' disagree");
  if (has_scaling) {
    const RopeScaling& a = legacy;
    const RopeScaling& b = c.rope_scaling;
    if (a.yarn != b.yarn || a.factor != b.factor || a.original_max_position_embeddings != b.original_max_position_embeddings ||
        a.beta_fast != b.beta_fast || a.beta_slow != b.beta_slow || a.mscale != b.mscale || a.mscale_all_dim != b.mscale_all_dim)
      format_error(src, "", "keys 'rope_scaling' and 'rope_parameters' disagree");
  }
}

// The lightning indexer of DeepSeek Sparse Attention. Which layers run it: indexer_types
// ("full" / "shared") as transformers writes it, else index_topk_pattern ("F"/"S" per layer), else
// transformers' schedule from index_topk_freq and index_skip_topk_offset (every layer by default).
void parse_indexer(const json& j, const std::string& src, ModelConfig& c) {
  Reader r{j, src};
  c.index_n_heads = r.i("index_n_heads");
  c.index_head_dim = r.i("index_head_dim");
  c.index_topk = r.i("index_topk");
  c.indexer_rope_interleave = r.b("indexer_rope_interleave", false);
  const int64_t L = c.num_hidden_layers;
  std::vector<std::string> types;
  if (r.has("indexer_types")) {
    if (!j["indexer_types"].is_array()) format_error(src, "", "key 'indexer_types' must be a list");
    for (auto& t : j["indexer_types"]) {
      if (!t.is_string()) format_error(src, "", "key 'indexer_types' must be a list of strings");
      types.push_back(t.get<std::string>());
    }
  } else if (r.has("index_topk_pattern")) {
    for (char ch : r.s("index_topk_pattern", "")) {
      if (ch != 'F' && ch != 'S') format_error(src, "", "key 'index_topk_pattern' may hold only F and S");
      types.push_back(ch == 'F' ? "full" : "shared");
    }
  } else {
    const int64_t freq = std::max<int64_t>(r.i("index_topk_freq", 1), 1), offset = r.i("index_skip_topk_offset", 2);
    for (int64_t l = 0; l < L; ++l) types.push_back(std::max<int64_t>(l - offset + 1, 0) % freq == 0 ? "full" : "shared");
  }
  if (int64_t(types.size()) < L)
    format_error(src, "", "the indexer types list " + std::to_string(types.size()) + " layers, num_hidden_layers is " +
                              std::to_string(L));
  c.indexer_shared.clear();
  for (int64_t l = 0; l < L; ++l) {
    const std::string& t = types[size_t(l)];
    if (t != "full" && t != "shared") format_error(src, "", "indexer type '" + t + "' is not supported (full, shared)");
    if (l == 0 && t == "shared") format_error(src, "", "layer 0's indexer type is 'shared': no layer before it to share with");
    c.indexer_shared.push_back(t == "shared");
  }
  auto bad = [&](const char* key, const std::string& want) {
    format_error(src, "", std::string("key '") + key + "' must be " + want);
  };
  if (c.index_n_heads < 1 || c.index_n_heads > 1024) bad("index_n_heads", "in [1, 1024]");
  const int64_t d = c.index_head_dim;
  if (d < 2 || d > 4096 || (d & (d - 1))) bad("index_head_dim", "a power of two in [2, 4096] (the Hadamard rotation)");
  if (d <= c.qk_rope_head_dim) bad("index_head_dim", "larger than qk_rope_head_dim (RoPE covers its first values)");
  if (c.index_topk < 1 || c.index_topk > (int64_t(1) << 24)) bad("index_topk", "in [1, 2^24]");
  if (c.q_lora_rank <= 0) bad("q_lora_rank", "positive: the indexer's queries come from the q LoRA");
}

void parse_quantization(const json& q, const std::string& src, ModelConfig& c) {
  std::string method = q.value("quant_method", "");
  if (method == "fp8") {
    std::string fmt = q.value("fmt", "e4m3");
    if (fmt != "e4m3") format_error(src, "", "quantization_config.fmt '" + fmt + "' is not supported (only e4m3)");
    if (q.contains("weight_block_size") && q["weight_block_size"] != json::array({128, 128}))
      format_error(src, "", "quantization_config.weight_block_size " + q["weight_block_size"].dump() +
                                " is not supported (only [128, 128])");
    c.fp8_block_weights = true;
    if (q.contains("scale_fmt") && !q["scale_fmt"].is_null()) {
      std::string sf = q["scale_fmt"].is_string() ? q["scale_fmt"].get<std::string>() : q["scale_fmt"].dump();
      if (sf != "ue8m0") format_error(src, "", "quantization_config.scale_fmt '" + sf + "' is not supported (only ue8m0)");
      c.ue8m0_scales = true;
    }
  } else if (method == "compressed-tensors") {
    std::string format = q.value("format", "");
    if (format != "pack-quantized" && format != "float-quantized" && format != "int-quantized" &&
        format != "mixed-precision")
      format_error(src, "", "quantization_config.format '" + format +
                                "' is not supported (only pack-quantized, float-quantized, int-quantized, mixed-precision)");
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
      const int bits = w.value("num_bits", 0);
      if (bits != 4 && bits != 8) bad("num_bits", "4 or 8");
      if (w.value("type", "") != "int") bad("type", "\"int\"");
      if (!w.value("symmetric", false)) bad("symmetric", "true");
      if (w.value("strategy", "") != "group") bad("strategy", "\"group\"");
      if (!w.contains("group_size") || !w["group_size"].is_number_integer() || w["group_size"].get<int>() <= 0)
        bad("group_size", "a positive integer");
      if (w.value("dynamic", false)) bad("dynamic", "false");
      if (w.contains("actorder") && !w["actorder"].is_null()) bad("actorder", "null");
      if (g.contains("input_activations") && !g["input_activations"].is_null())
        format_error(src, "", "quantization_config.config_groups." + gname + ".input_activations is not supported");
      if (bits == 8) {  // INT8 (int-quantized): I8 weights, told by their dtype as FP8's are
        const int gs = w["group_size"].get<int>();
        if (c.int8_group_size && c.int8_group_size != gs) bad("group_size", "the same in every INT8 group");
        c.int8_group_size = gs;
        continue;
      }
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
  static const char* known[] = {"deepseek_v2", "deepseek_v3", "kimi_k2", "glm4_moe_lite", "deepseek_v32", "glm_moe_dsa"};
  if (std::find(std::begin(known), std::end(known), family) == std::end(known))
    format_error(src, "", "unknown model_type '" + family +
                              "' (supported: deepseek_v2, deepseek_v3, kimi_k2, kimi_k25, glm4_moe_lite, deepseek_v32, "
                              "glm_moe_dsa)");
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
  c.tie_word_embeddings = r.b("tie_word_embeddings", false);
  c.max_position_embeddings = r.i("max_position_embeddings", 4096);
  c.bos_token_id = r.i("bos_token_id", -1);
  c.num_nextn_predict_layers = r.i("num_nextn_predict_layers", 0);
  if (c.num_nextn_predict_layers < 0 || c.num_nextn_predict_layers > 16)
    format_error(src, "", "key 'num_nextn_predict_layers' must be in [0, 16], got " + std::to_string(c.num_nextn_predict_layers));
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

  parse_rope(j, src, c);
  if (r.has("rope_interleave") && !r.b("rope_interleave", true))
    format_error(src, "", "rope_interleave false (halves pairing in MLA) is not supported");
  if (family == "deepseek_v32" || family == "glm_moe_dsa") parse_indexer(j, src, c);

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
  if (const auto gguf = gguf_path(dir)) {
    const GgufFile f(*gguf);
    return from_json(gguf_config_json(f), f.path());
  }
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
