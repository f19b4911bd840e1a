// The GGUF model as a hub checkpoint (see gguf_model.h): llama.cpp's deepseek2 metadata keys
// mapped to config.json's, its tensor names to the hub's.
#include "model/gguf_model.h"

#include <cmath>
#include <regex>

#include "format/error.h"

namespace mla {

using nlohmann::json;

namespace {

// ---- metadata ------------------------------------------------------------------------------

// Reads "<arch>.<key>" of one file, naming the file and key in every error.
struct Meta {
  const GgufFile& f;
  std::string arch;

  std::string key(const std::string& k) const { return arch + "." + k; }
  int64_t i(const std::string& k) const { return f.require_int(key(k)); }
  std::optional<int64_t> oi(const std::string& k) const { return f.get_int(key(k)); }
  std::optional<double> od(const std::string& k) const { return f.get_float(key(k)); }
  std::optional<bool> ob(const std::string& k) const { return f.get_bool(key(k)); }
  [[noreturn]] void fail(const std::string& k, const std::string& what) const { format_error(f.path(), key(k), what); }

  // A per-layer key may be one value or an array of one value per layer: every layer of an MLA
  // model has the same, so an array must hold one value (zeros, for dense layers, aside).
  int64_t uniform(const std::string& k) const {
    const GgufValue* v = f.find(key(k));
    if (!v) fail(k, "missing");
    if (v->kind != GgufValue::Kind::Array) return i(k);
    int64_t out = 0;
    for (int64_t x : v->ints) {
      if (x != 0 && out != 0 && x != out) fail(k, "differs between layers (not supported)");
      if (x != 0) out = x;
    }
    return out;
  }
};

// llama.cpp's expert gating functions (llama-hparams.h: LLAMA_EXPERT_GATING_FUNC_TYPE_*).
constexpr int64_t kGatingSoftmax = 1, kGatingSigmoid = 2;

void rope_keys(const Meta& m, json& c) {
  c["rope_theta"] = m.od("rope.freq_base").value_or(10000.0);
  const auto type = m.f.get_string(m.key("rope.scaling.type"));
  if (!type || *type == "none") return;
  if (*type != "yarn") m.fail("rope.scaling.type", "'" + *type + "' is not supported (yarn, none)");
  const double factor = m.od("rope.scaling.factor").value_or(1.0);
  json rs = {{"type", "yarn"},
             {"factor", factor},
             {"original_max_position_embeddings", m.i("rope.scaling.original_context_length")},
             {"beta_fast", m.od("rope.scaling.yarn_beta_fast").value_or(32.0)},
             {"beta_slow", m.od("rope.scaling.yarn_beta_slow").value_or(1.0)}};
  // llama.cpp's converter writes yarn_log_multiplier = 0.1 mscale_all_dim and takes
  // mscale == mscale_all_dim (every released DeepSeek and Kimi model): the softmax scale is
  // (attn_factor (1 + yarn_log_multiplier ln s))^2 / sqrt(d) and the rotation's cos and sin are
  // scaled by attn_factor. Both are HF's when mscale(s, mscale_all_dim) = attn_factor (1 +
  // yarn_log_multiplier ln s) and mscale(s, mscale) = attn_factor mscale(s, mscale_all_dim).
  const double log_mul = m.od("rope.scaling.yarn_log_multiplier").value_or(0.0);
  const double attn_factor = m.od("rope.scaling.attn_factor").value_or(1.0);
  if (factor > 1) {
    const double all = attn_factor * (1.0 + log_mul * std::log(factor));
    const double mscale_all_dim = (all - 1.0) / (0.1 * std::log(factor));
    const double mscale = (attn_factor * all - 1.0) / (0.1 * std::log(factor));
    rs["mscale_all_dim"] = mscale_all_dim;
    rs["mscale"] = mscale;
  } else {
    rs["mscale_all_dim"] = log_mul / 0.1;
    rs["mscale"] = log_mul / 0.1;
  }
  c["rope_scaling"] = rs;
}

}  // namespace

json gguf_config_json(const GgufFile& f) {
  const std::string arch = f.require_string("general.architecture");
  std::string model_type;
  if (arch == "deepseek2") model_type = "deepseek_v3";  // V2's routing is told from its gating below
  else if (arch == "deepseek32") model_type = "deepseek_v32";
  else if (arch == "glm-dsa") model_type = "glm_moe_dsa";
  else
    format_error(f.path(), "general.architecture",
                 "'" + arch + "' is not an MLA architecture this engine runs (deepseek2, deepseek32, glm-dsa)");
  const Meta m{f, arch};
  json c;
  const int64_t blocks = m.i("block_count");
  const int64_t nextn = m.oi("nextn_predict_layers").value_or(0);
  if (nextn < 0 || nextn >= blocks) m.fail("nextn_predict_layers", "must be in [0, block_count)");
  c["num_hidden_layers"] = blocks - nextn;
  c["num_nextn_predict_layers"] = nextn;
  c["hidden_size"] = m.i("embedding_length");
  c["intermediate_size"] = m.uniform("feed_forward_length");
  c["num_attention_heads"] = m.uniform("attention.head_count");
  c["max_position_embeddings"] = m.oi("context_length").value_or(4096);
  c["rms_norm_eps"] = m.od("attention.layer_norm_rms_epsilon").value_or(1e-6);
  const int64_t rope = m.i("rope.dimension_count");
  c["qk_rope_head_dim"] = rope;
  c["q_lora_rank"] = m.oi("attention.q_lora_rank").value_or(0);
  const int64_t kv_lora = m.i("attention.kv_lora_rank");
  c["kv_lora_rank"] = kv_lora;
  // Since 2025 llama.cpp writes the MLA view (key_length = kv_lora + rope, value_length =
  // kv_lora) and the heads' sizes as key_length_mla / value_length_mla; older files have only
  // the heads' sizes, as key_length / value_length.
  if (const auto kmla = m.oi("attention.key_length_mla")) {
    c["qk_nope_head_dim"] = *kmla - rope;
    c["v_head_dim"] = m.i("attention.value_length_mla");
  } else {
    c["qk_nope_head_dim"] = m.uniform("attention.key_length") - rope;
    c["v_head_dim"] = m.uniform("attention.value_length");
  }
  const int64_t vocab = m.oi("vocab_size").value_or(0);
  if (vocab > 0) c["vocab_size"] = vocab;
  else if (const GgufValue* toks = f.find("tokenizer.ggml.tokens")) c["vocab_size"] = int64_t(toks->size());
  else m.fail("vocab_size", "missing, and the file has no tokenizer.ggml.tokens to count");

  const int64_t experts = m.oi("expert_count").value_or(0);
  c["n_routed_experts"] = experts;
  if (experts > 0) {
    c["num_experts_per_tok"] = m.i("expert_used_count");
    c["moe_intermediate_size"] = m.uniform("expert_feed_forward_length");
    c["n_shared_experts"] = m.oi("expert_shared_count").value_or(0);
    c["first_k_dense_replace"] = m.oi("leading_dense_block_count").value_or(0);
    c["n_group"] = m.oi("expert_group_count").value_or(1);
    c["topk_group"] = m.oi("expert_group_used_count").value_or(1);
    c["routed_scaling_factor"] = m.od("expert_weights_scale").value_or(1.0);
    c["norm_topk_prob"] = m.ob("expert_weights_norm").value_or(false);
    // llama.cpp reads a missing gating function as softmax (DeepSeek-V2 and V2.5 files).
    const int64_t gating = m.oi("expert_gating_func").value_or(kGatingSoftmax);
    if (gating == kGatingSigmoid) {
      c["scoring_func"] = "sigmoid";
      c["topk_method"] = "noaux_tc";
    } else if (gating == kGatingSoftmax) {
      // DeepSeek-V2: softmax scores; groups (V2 full) are scored by their best expert.
      c["model_type"] = "deepseek_v2";
      c["scoring_func"] = "softmax";
      c["topk_method"] = c["n_group"].get<int64_t>() > 1 ? "group_limited_greedy" : "greedy";
    } else {
      m.fail("expert_gating_func", "value " + std::to_string(gating) + " is not supported (1 softmax, 2 sigmoid)");
    }
  }
  if (!c.contains("model_type")) c["model_type"] = model_type;
  rope_keys(m, c);
  if (const auto bos = f.get_int("tokenizer.ggml.bos_token_id")) c["bos_token_id"] = *bos;
  if (const auto eos = f.get_int("tokenizer.ggml.eos_token_id")) c["eos_token_id"] = *eos;
  // llama.cpp ties the output head to the embeddings when the file has no output.weight.
  c["tie_word_embeddings"] = f.find_tensor("output.weight") == nullptr && f.find_tensor("token_embd.weight") != nullptr;

  if (arch != "deepseek2") {  // the lightning indexer of DeepSeek Sparse Attention
    c["index_n_heads"] = m.i("attention.indexer.head_count");
    c["index_head_dim"] = m.i("attention.indexer.key_length");
    c["index_topk"] = m.i("attention.indexer.top_k");
    // Layers without indexer tensors share the previous layer's selection (GLM-5's pattern).
    json types = json::array();
    for (int64_t l = 0; l < blocks - nextn; ++l)
      types.push_back(f.find_tensor("blk." + std::to_string(l) + ".indexer.attn_k.weight") ? "full" : "shared");
    c["indexer_types"] = types;
  }
  return c;
}

// ---- tensors -------------------------------------------------------------------------------

namespace {

// GGUF name suffix -> hub name suffix within a layer (blk.L.<gguf> -> model.layers.L.<hub>).
const std::map<std::string, std::string>& layer_names() {
  static const std::map<std::string, std::string> m = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q_a.weight", "self_attn.q_a_proj.weight"},
      {"attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight"},
      {"attn_q_b.weight", "self_attn.q_b_proj.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight"},
      {"attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"},
      {"attn_kv_b.weight", "self_attn.kv_b_proj.weight"},
      {"attn_k_b.weight", "self_attn.k_b_proj.weight"},
      {"attn_v_b.weight", "self_attn.v_b_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
      {"ffn_gate_inp.weight", "mlp.gate.weight"},
      {"exp_probs_b.bias", "mlp.gate.e_score_correction_bias"},
      {"ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight"},
      {"ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"},
      {"ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight"},
      {"nextn.eh_proj.weight", "eh_proj.weight"},
      {"nextn.enorm.weight", "enorm.weight"},
      {"nextn.hnorm.weight", "hnorm.weight"},
      {"nextn.shared_head_norm.weight", "shared_head.norm.weight"},
      {"nextn.shared_head_head.weight", "shared_head.head.weight"},
      {"nextn.embed_tokens.weight", "embed_tokens.weight"},
      {"indexer.attn_q_b.weight", "self_attn.indexer.wq_b.weight"},
      {"indexer.attn_k.weight", "self_attn.indexer.wk.weight"},
      {"indexer.proj.weight", "self_attn.indexer.weights_proj.weight"},
      {"indexer.k_norm.weight", "self_attn.indexer.k_norm.weight"},
      {"indexer.k_norm.bias", "self_attn.indexer.k_norm.bias"},
  };
  return m;
}

// Stacked routed experts: GGUF suffix -> the hub's projection name.
const std::map<std::string, std::string>& expert_names() {
  static const std::map<std::string, std::string> m = {
      {"ffn_gate_exps.weight", "gate_proj"}, {"ffn_up_exps.weight", "up_proj"}, {"ffn_down_exps.weight", "down_proj"}};
  return m;
}

const std::map<std::string, std::string>& global_names() {
  static const std::map<std::string, std::string> m = {{"token_embd.weight", "model.embed_tokens.weight"},
                                                       {"output_norm.weight", "model.norm.weight"},
                                                       {"output.weight", "lm_head.weight"}};
  return m;
}

// The engine's format for a ggml type; nullopt for a type it does not compute on.
std::optional<WeightFormat> ggml_weight_format(uint32_t type, DType& dtype) {
  dtype = DType::U8;
  switch (GgmlType(type)) {
    case GgmlType::F32: dtype = DType::F32; return std::nullopt;
    case GgmlType::F16: dtype = DType::F16; return std::nullopt;
    case GgmlType::BF16: dtype = DType::BF16; return std::nullopt;
    case GgmlType::Q4_0: return WeightFormat::Q4_0;
    case GgmlType::Q4_1: return WeightFormat::Q4_1;
    case GgmlType::Q5_0: return WeightFormat::Q5_0;
    case GgmlType::Q5_1: return WeightFormat::Q5_1;
    case GgmlType::Q8_0: return WeightFormat::Q8_0;
    case GgmlType::Q2_K: return WeightFormat::Q2_K;
    case GgmlType::Q3_K: return WeightFormat::Q3_K;
    case GgmlType::Q4_K: return WeightFormat::Q4_K;
    case GgmlType::Q5_K: return WeightFormat::Q5_K;
    case GgmlType::Q6_K: return WeightFormat::Q6_K;
    default: return std::nullopt;
  }
}

bool supported_type(uint32_t type) {
  DType d;
  return ggml_weight_format(type, d) || d != DType::U8;
}

// A hub TensorInfo over (part of) a GGUF tensor: `shape` in the hub's order (outermost first).
TensorInfo hub_tensor(const GgufTensor& g, const std::string& name, std::vector<int64_t> shape, const uint8_t* data,
                      size_t nbytes) {
  TensorInfo t;
  t.name = name;
  t.file = g.file;
  t.ggml = ggml_weight_format(g.type, t.dtype);
  t.shape = std::move(shape);
  t.data = data;
  t.nbytes = nbytes;
  return t;
}

}  // namespace

std::unique_ptr<Checkpoint> gguf_checkpoint(std::shared_ptr<const GgufFile> f) {
  static const std::regex layer_re(R"(blk\.(\d+)\.(.+))");
  std::map<std::string, TensorInfo> out;
  for (const auto& [name, g] : f->tensors()) {
    std::vector<int64_t> shape(g.ne.rbegin(), g.ne.rend());
    std::smatch mt;
    std::string hub;
    if (auto it = global_names().find(name); it != global_names().end()) {
      hub = it->second;
    } else if (std::regex_match(name, mt, layer_re)) {
      const std::string prefix = "model.layers." + mt[1].str() + ".", suffix = mt[2].str();
      if (auto proj = expert_names().find(suffix); proj != expert_names().end()) {
        if (!supported_type(g.type))
          format_error(g.file, name, std::string("type ") + ggml_type_info(g.type)->name + " is not supported");
        if (shape.size() != 3) format_error(g.file, name, "stacked experts need 3 dimensions, got " + g.shape_str());
        const size_t per = g.nbytes / size_t(shape[0]);
        for (int64_t e = 0; e < shape[0]; ++e) {
          const std::string hn = prefix + "mlp.experts." + std::to_string(e) + "." + proj->second + ".weight";
          out.emplace(hn, hub_tensor(g, name + " (expert " + std::to_string(e) + ")", {shape[1], shape[2]},
                                     g.data + size_t(e) * per, per));
        }
        continue;
      }
      if (auto it = layer_names().find(suffix); it != layer_names().end()) hub = prefix + it->second;
    }
    if (hub.empty()) continue;  // not part of the model (llama.cpp's extras): ignored, as llama.cpp does
    if (!supported_type(g.type))
      format_error(g.file, name,
                   std::string("type ") + ggml_type_info(g.type)->name +
                       " is not supported (f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K)");
    out.emplace(hub, hub_tensor(g, name, shape, g.data, g.nbytes));
  }
  return std::make_unique<Checkpoint>(std::move(f), std::move(out), gguf_tensor_name);
}

std::string gguf_tensor_name(const std::string& hub) {
  for (const auto& [g, h] : global_names())
    if (h == hub) return g;
  static const std::regex layer_re(R"(model\.layers\.(\d+)\.(.+))");
  static const std::regex expert_re(R"(mlp\.experts\.(\d+)\.(\w+)\.weight)");
  std::smatch m;
  if (!std::regex_match(hub, m, layer_re)) return "";
  const std::string blk = "blk." + m[1].str() + ".", suffix = m[2].str();
  std::smatch e;
  if (std::regex_match(suffix, e, expert_re))
    for (const auto& [g, proj] : expert_names())
      if (proj == e[2].str()) return blk + g;
  for (const auto& [g, h] : layer_names())
    if (h == suffix) return blk + g;
  return "";
}

std::unique_ptr<Checkpoint> open_checkpoint(const std::string& path) {
  if (const auto g = gguf_path(path)) return gguf_checkpoint(std::make_shared<const GgufFile>(*g));
  return std::make_unique<Checkpoint>(path);
}

}  // namespace mla
