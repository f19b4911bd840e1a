#include "tools/checkpoint_writer.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "format/error.h"
#include "format/progress.h"
#include "format/safetensors.h"
#include "tensor/quantize.h"
#include "tools/quantize.h"

namespace mla {

using nlohmann::json;
namespace fs = std::filesystem;

// As torch's save_file writes it (transformers reads "format": "pt").
static const std::map<std::string, std::string> kPtMetadata = {{"format", "pt"}};

void write_checkpoint(const std::string& dir, const json& config, std::vector<TensorSpec> tensors, int shards) {
  fs::create_directories(dir);
  std::sort(tensors.begin(), tensors.end(), [](auto& a, auto& b) { return a.name < b.name; });
  {
    std::ofstream f(fs::path(dir) / "config.json");
    f << config.dump(2) << "\n";
  }
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors" || e.path().filename() == "model.safetensors.index.json")
      fs::remove(e.path());
  if (shards <= 1) {
    std::vector<const TensorSpec*> all;
    for (auto& t : tensors) all.push_back(&t);
    write_safetensors((fs::path(dir) / "model.safetensors").string(), all, kPtMetadata);
    return;
  }
  size_t total = 0;
  for (auto& t : tensors) total += t.nbytes();
  json weight_map = json::object();
  size_t next = 0, acc = 0;
  for (int s = 0; s < shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, shards);
    std::vector<const TensorSpec*> part;
    size_t limit = total * size_t(s + 1) / size_t(shards);
    while (next < tensors.size() && (acc < limit || s == shards - 1)) {
      acc += tensors[next].nbytes();
      weight_map[tensors[next].name] = name;
      part.push_back(&tensors[next++]);
    }
    write_safetensors((fs::path(dir) / name).string(), part, kPtMetadata);
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  std::ofstream f(fs::path(dir) / "model.safetensors.index.json");
  f << index.dump(2) << "\n";
}

void track_progress(std::vector<TensorSpec>& tensors, const std::shared_ptr<Progress>& bar) {
  size_t total = 0;
  for (auto& t : tensors) total += t.nbytes();
  auto done = std::make_shared<size_t>(0);
  auto items = std::make_shared<int64_t>(0);
  const int64_t n_items = int64_t(tensors.size());
  for (auto& t : tensors) {
    auto fill = std::move(t.fill);
    const size_t n = t.nbytes();
    t.fill = [fill = std::move(fill), n, bar, done, items, total, n_items](uint8_t* out) {
      fill(out);
      *done += n;
      bar->update(*done, total, ++*items, n_items);
    };
  }
}

namespace {

// splitmix64: a counter-based generator, so any block of a tensor can be filled independently.
inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
inline float uniform(uint64_t seed, uint64_t i) {  // in [-1, 1)
  return float(int64_t(mix(seed ^ mix(i)) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}
uint64_t name_seed(uint64_t seed, const std::string& name) {
  uint64_t h = seed;
  for (char ch : name) h = mix(h ^ uint8_t(ch));
  return h;
}

struct Builder {
  const RandomCheckpointOptions& opt;
  std::string prefix;
  std::vector<TensorSpec> out;

  // Uniform with the given std (a = std * sqrt(3)).
  void f_uniform(const std::string& name, DType dt, std::vector<int64_t> shape, double std, double mean = 0) {
    uint64_t s = name_seed(opt.seed, name);
    float a = float(std * std::sqrt(3.0)), m = float(mean);
    out.push_back({prefix + name, dt, std::move(shape), nullptr});
    TensorSpec& t = out.back();
    size_t n = t.nbytes() / dtype_size(dt);
    t.fill = [s, a, m, dt, n](uint8_t* p) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < int64_t(n); ++i) {
        float v = m + a * uniform(s, uint64_t(i));
        if (dt == DType::BF16) {
          uint16_t h = f32_to_bf16(v);
          std::memcpy(p + 2 * i, &h, 2);
        } else {
          std::memcpy(p + 4 * i, &v, 4);
        }
      }
    };
  }

  void linear(const std::string& base, int64_t rows, int64_t cols, bool quantizable, bool expert) {
    const double std = opt.init_std;
    const bool fp8 = opt.weights == RandomWeights::FP8 || (opt.weights == RandomWeights::INT4_FP8 && !expert);
    if (fp8 && quantizable) {
      uint64_t s = name_seed(opt.seed, base);
      out.push_back({prefix + base + ".weight", DType::F8_E4M3, {rows, cols}, [s, rows, cols](uint8_t* p) {
#pragma omp parallel for schedule(static)
                       for (int64_t i = 0; i < rows * cols; ++i)
                         p[i] = quant::f32_to_fp8e4m3_fast(448.0f * uniform(s, uint64_t(i)));
                     }});
      // Values up to 448 times scale: the block scale brings them to about the std asked for.
      f_uniform(base + ".weight_scale_inv", DType::F32, {(rows + 127) / 128, (cols + 127) / 128}, std * 0.05,
                std * std::sqrt(3.0) / 448.0);
      return;
    }
    if (opt.weights == RandomWeights::INT8 && quantizable) {
      uint64_t s = name_seed(opt.seed, base);
      out.push_back({prefix + base + ".weight", DType::I8, {rows, cols}, [s, rows, cols](uint8_t* p) {
#pragma omp parallel for schedule(static)
                       for (int64_t i = 0; i < rows * cols / 8; ++i) {
                         const uint64_t w = mix(s ^ mix(uint64_t(i)));
                         std::memcpy(p + 8 * i, &w, 8);
                       }
                       for (int64_t i = rows * cols / 8 * 8; i < rows * cols; ++i) p[i] = uint8_t(mix(s ^ uint64_t(i)));
                     }});
      // Codes -128..127 have std about 73.9: scales of std / 73.9 give the std asked for.
      f_uniform(base + ".weight_scale", DType::BF16, {rows, cols / 32}, std / 73.9 * 0.1, std / 73.9);
      return;
    }
    if ((opt.weights == RandomWeights::INT4_EXPERTS || opt.weights == RandomWeights::INT4_FP8) && expert) {
      uint64_t s = name_seed(opt.seed, base);
      const int64_t g = 32;
      out.push_back({prefix + base + ".weight_packed", DType::I32, {rows, cols / 8}, [s, rows, cols](uint8_t* p) {
#pragma omp parallel for schedule(static)
                       for (int64_t i = 0; i < rows * cols / 8; ++i) {
                         uint32_t w = uint32_t(mix(s ^ mix(uint64_t(i))));
                         std::memcpy(p + 4 * i, &w, 4);
                       }
                     }});
      // Codes -8..7 have std about 4.6: scales of std / 4.6 give the std asked for.
      f_uniform(base + ".weight_scale", DType::BF16, {rows, cols / g}, std / 4.6 * 0.1, std / 4.6);
      out.push_back({prefix + base + ".weight_shape", DType::I32, {2}, [rows, cols](uint8_t* p) {
                       int32_t v[2] = {int32_t(rows), int32_t(cols)};
                       std::memcpy(p, v, 8);
                     }});
      return;
    }
    f_uniform(base + ".weight", DType::BF16, {rows, cols}, std);
  }
  void norm(const std::string& name, int64_t n) { f_uniform(name, DType::BF16, {n}, 0.02, 1.0); }
  void mlp(const std::string& p, int64_t hidden, int64_t inter, bool expert) {
    linear(p + "gate_proj", inter, hidden, true, expert);
    linear(p + "up_proj", inter, hidden, true, expert);
    linear(p + "down_proj", hidden, inter, true, expert);
  }
};

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

int64_t geti(const json& c, const char* k, int64_t def = 0) {
  return c.contains(k) && c[k].is_number_integer() ? c[k].get<int64_t>() : def;
}

}  // namespace

std::vector<TensorSpec> random_tensors(const json& c, const RandomCheckpointOptions& opt) {
  Builder b{opt, opt.weights == RandomWeights::INT4_EXPERTS ? "language_model." : "", {}};
  // INT4 experts beside FP8 projections: compressed-tensors names FP8 block scales weight_scale.
  const bool ct_fp8 = opt.weights == RandomWeights::INT4_FP8;
  const int64_t V = geti(c, "vocab_size"), D = geti(c, "hidden_size"), L = geti(c, "num_hidden_layers"),
                H = geti(c, "num_attention_heads"), qlr = geti(c, "q_lora_rank"), kvr = geti(c, "kv_lora_rank"),
                nope = geti(c, "qk_nope_head_dim"), rope = geti(c, "qk_rope_head_dim"), vd = geti(c, "v_head_dim"),
                E = geti(c, "n_routed_experts"), shared = geti(c, "n_shared_experts"),
                moe_i = geti(c, "moe_intermediate_size"), inter = geti(c, "intermediate_size"),
                dense = geti(c, "first_k_dense_replace"), Hi = geti(c, "index_n_heads"),
                Di = geti(c, "index_head_dim");
  const bool bias = c.value("scoring_func", "sigmoid") == "sigmoid";
  b.f_uniform("model.embed_tokens.weight", DType::BF16, {V, D}, 1.0);
  b.norm("model.norm.weight", D);
  b.f_uniform("lm_head.weight", DType::BF16, {V, D}, opt.init_std);
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".", a = p + "self_attn.";
    b.norm(p + "input_layernorm.weight", D);
    b.norm(p + "post_attention_layernorm.weight", D);
    if (qlr > 0) {
      b.linear(a + "q_a_proj", qlr, D, true, false);
      b.norm(a + "q_a_layernorm.weight", qlr);
      b.linear(a + "q_b_proj", H * (nope + rope), qlr, true, false);
    } else {
      b.linear(a + "q_proj", H * (nope + rope), D, true, false);
    }
    b.linear(a + "kv_a_proj_with_mqa", kvr + rope, D, true, false);
    b.norm(a + "kv_a_layernorm.weight", kvr);
    b.linear(a + "kv_b_proj", H * (nope + vd), kvr, true, false);
    b.linear(a + "o_proj", D, H * vd, true, false);
    // DeepSeek Sparse Attention's indexer (model/indexer.h), in every layer but GLM-5's "shared" ones.
    const bool shared_indexer = c.contains("indexer_types") && c["indexer_types"].is_array() &&
                                size_t(l) < c["indexer_types"].size() && c["indexer_types"][size_t(l)] == "shared";
    if (Hi > 0 && !shared_indexer) {
      const std::string ip = a + "indexer.";
      b.linear(ip + "wq_b", Hi * Di, qlr, true, false);
      b.linear(ip + "wk", Di, D, true, false);
      b.f_uniform(ip + "weights_proj.weight", DType::BF16, {Hi, D}, opt.init_std);
      b.f_uniform(ip + "k_norm.weight", DType::F32, {Di}, 0.02, 1.0);
      b.f_uniform(ip + "k_norm.bias", DType::F32, {Di}, 0.02);
    }
    if (E > 0 && l >= dense) {
      b.f_uniform(p + "mlp.gate.weight", DType::BF16, {E, D}, opt.init_std);
      if (bias) b.f_uniform(p + "mlp.gate.e_score_correction_bias", DType::F32, {E}, 0.01);
      for (int64_t e = 0; e < E; ++e) b.mlp(p + "mlp.experts." + std::to_string(e) + ".", D, moe_i, true);
      if (shared > 0) b.mlp(p + "mlp.shared_experts.", D, shared * moe_i, false);
    } else {
      b.mlp(p + "mlp.", D, inter, false);
    }
  }
  if (ct_fp8)
    for (auto& t : b.out)
      if (ends_with(t.name, ".weight_scale_inv")) t.name.resize(t.name.size() - 4);
  return std::move(b.out);
}

void write_random_checkpoint(const std::string& dir, json config, const RandomCheckpointOptions& opt) {
  auto tensors = random_tensors(config, opt);
  if (opt.weights == RandomWeights::INT4_FP8 || opt.weights == RandomWeights::INT8) {
    LoadQuantization f;
    f.experts = opt.weights == RandomWeights::INT8 ? quant::QuantFormat::INT8 : quant::QuantFormat::INT4;
    f.others = opt.weights == RandomWeights::INT8 ? quant::QuantFormat::INT8 : quant::QuantFormat::FP8;
    config["quantization_config"] = quantization_config(f);
  }
  std::shared_ptr<Progress> bar;
  if (opt.progress) {
    bar = std::make_shared<Progress>("writing " + dir);
    track_progress(tensors, bar);
  }
  if (opt.weights == RandomWeights::FP8)
    config["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                     {"weight_block_size", {128, 128}}};
  if (opt.weights == RandomWeights::INT4_EXPERTS) {
    json q = {{"quant_method", "compressed-tensors"},
              {"format", "pack-quantized"},
              {"config_groups",
               {{"group_0",
                 {{"targets", {"Linear"}},
                  {"weights",
                   {{"num_bits", 4}, {"type", "int"}, {"symmetric", true}, {"strategy", "group"}, {"group_size", 32},
                    {"dynamic", false}, {"actorder", nullptr}}},
                  {"input_activations", nullptr}}}}},
              {"ignore", {"lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"}}};
    config["model_type"] = "kimi_k2";
    config = {{"model_type", "kimi_k25"}, {"architectures", {"KimiK25ForConditionalGeneration"}}, {"text_config", config},
              {"quantization_config", q}};
  }
  write_checkpoint(dir, config, std::move(tensors), opt.shards);
  if (bar) bar->finish();
}

json demo_config(int64_t vocab_size) {
  return {{"architectures", {"DeepseekV3ForCausalLM"}},
          {"model_type", "deepseek_v3"},
          {"vocab_size", vocab_size},
          {"hidden_size", 512},
          {"intermediate_size", 1408},
          {"moe_intermediate_size", 256},
          {"num_hidden_layers", 4},
          {"num_attention_heads", 16},
          {"num_key_value_heads", 16},
          {"n_shared_experts", 1},
          {"n_routed_experts", 32},
          {"routed_scaling_factor", 2.5},
          {"kv_lora_rank", 256},
          {"q_lora_rank", 384},
          {"qk_rope_head_dim", 64},
          {"v_head_dim", 64},
          {"qk_nope_head_dim", 64},
          {"topk_method", "noaux_tc"},
          {"scoring_func", "sigmoid"},
          {"n_group", 4},
          {"topk_group", 2},
          {"num_experts_per_tok", 4},
          {"first_k_dense_replace", 1},
          {"moe_layer_freq", 1},
          {"norm_topk_prob", true},
          {"hidden_act", "silu"},
          {"max_position_embeddings", 16384},
          {"rms_norm_eps", 1e-6},
          {"bos_token_id", 0},
          {"eos_token_id", 1},
          {"tie_word_embeddings", false},
          {"rope_theta", 10000.0},
          {"rope_scaling",
           {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 4096}, {"beta_fast", 32},
            {"beta_slow", 1}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}}},
          {"num_nextn_predict_layers", 0},
          {"torch_dtype", "bfloat16"}};
}

}  // namespace mla
