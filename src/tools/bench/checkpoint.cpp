// The checkpoint `mla bench` measures: the user's, or a random one of the benchmark's config
// written on first use, with an MTP module beside it (see tools/bench.h).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>

#include "format/gguf.h"
#include "model/presets.h"
#include "tensor/dtype.h"
#include "tools/bench/sections.h"

namespace mla::bench {

namespace {

// The MTP module beside the benchmark's checkpoint: the decoder layer `layers` of the same
// config one layer longer (random, seed 2), eh_proj (random) and enorm / hnorm /
// shared_head.norm (ones), written to mtp.safetensors and added to the index and to config.json
// (num_nextn_predict_layers 1). The main layers' files are not touched. Every weight format: the
// int4 checkpoint is a kimi_k25 wrapper, so there the names carry its "language_model." prefix,
// the count goes into text_config, and eh_proj (bf16 here) joins the INT4 ignore list, which
// would otherwise ask for it packed as an nn.Linear outside the listed exceptions.
// `cfg`: the main checkpoint's config with num_hidden_layers layers + 1.
void add_mtp_module(const std::string& dir, int64_t layers, const nlohmann::json& cfg, RandomWeights kind) {
  RandomCheckpointOptions ro;
  ro.weights = kind;
  ro.seed = 2;
  const std::string pre = std::string(kind == RandomWeights::INT4_EXPERTS ? "language_model." : "") + "model.layers." +
                          std::to_string(layers) + ".";
  std::vector<TensorSpec> mine;
  for (auto& t : random_tensors(cfg, ro))
    if (t.name.compare(0, pre.size(), pre) == 0) mine.push_back(std::move(t));
  const int64_t D = cfg["hidden_size"].get<int64_t>();
  auto ones = [](std::string name, int64_t n) {
    return TensorSpec{std::move(name), DType::BF16, {n}, [n](uint8_t* out) {
                        for (int64_t i = 0; i < n; ++i) {
                          const uint16_t one = f32_to_bf16(1.0f);
                          std::memcpy(out + 2 * i, &one, 2);
                        }
                      }};
  };
  for (const char* norm : {"enorm.weight", "hnorm.weight", "shared_head.norm.weight"}) mine.push_back(ones(pre + norm, D));
  mine.push_back(TensorSpec{pre + "eh_proj.weight", DType::BF16, {D, 2 * D}, [D](uint8_t* out) {
                              std::mt19937 rng(3);
                              std::normal_distribution<float> nd(0.0f, 0.02f);
                              for (int64_t i = 0; i < D * 2 * D; ++i) {
                                const uint16_t v = f32_to_bf16(nd(rng));
                                std::memcpy(out + 2 * i, &v, 2);
                              }
                            }});
  std::sort(mine.begin(), mine.end(), [](const TensorSpec& a, const TensorSpec& b) { return a.name < b.name; });
  std::vector<const TensorSpec*> ptrs;
  for (auto& t : mine) ptrs.push_back(&t);
  write_safetensors(dir + "/mtp.safetensors", ptrs);
  const std::string index = dir + "/model.safetensors.index.json";
  if (std::filesystem::exists(index)) {
    nlohmann::json idx;
    std::ifstream(index) >> idx;
    for (auto& t : mine) idx["weight_map"][t.name] = "mtp.safetensors";
    std::ofstream(index) << idx.dump(2) << "\n";
  }
  nlohmann::json c;
  std::ifstream(dir + "/config.json") >> c;
  if (c.contains("text_config")) {  // the kimi_k25 wrapper of the int4 checkpoint
    c["text_config"]["num_nextn_predict_layers"] = 1;
    if (c.contains("quantization_config") && c["quantization_config"].contains("ignore"))
      c["quantization_config"]["ignore"].push_back("re:.*eh_proj.*");
  } else {
    c["num_nextn_predict_layers"] = 1;
  }
  std::ofstream(dir + "/config.json") << c.dump(2) << "\n";
}

// The random checkpoint in rep.dir, written when missing: rank 0 writes it and its MTP module,
// the others wait for it at the barrier (the ranks' collectives wait without a timeout until the
// model is loaded) and find it there.
void random_checkpoint(const Options& opt, Ranks& ranks, const Say& say, Report& rep) {
  const RandomWeights kind = random_weights(opt.weights);
  rep.dir = opt.dir.empty() ? (std::filesystem::temp_directory_path() /
                               ("mla-bench-v2lite-" + std::to_string(opt.layers) + "L-" + opt.weights))
                                  .string()
                            : opt.dir;
  // The checkpoint's config at n layers: the benchmark's own unless the caller gave one.
  auto checkpoint_config = [&](int64_t n) {
    if (opt.checkpoint_config.is_null()) return bench_checkpoint_config(n);
    nlohmann::json c = opt.checkpoint_config;
    c["num_hidden_layers"] = n;
    return c;
  };
  const nlohmann::json want = {{"config", opt.checkpoint_config.is_null() ? nlohmann::json("v2_lite") : opt.checkpoint_config},
                               {"layers", opt.layers}, {"weights", opt.weights}, {"seed", 1}};
  if (!opt.checkpoint_config.is_null()) {
    const ModelConfig given = ModelConfig::from_json(checkpoint_config(opt.layers), "the benchmark's checkpoint config");
    char buf[160];
    std::snprintf(buf, sizeof buf, "the given config's shape (hidden %lld, %lld routed experts, top-%lld)",
                  (long long)given.hidden_size, (long long)given.n_routed_experts, (long long)given.num_experts_per_tok);
    rep.shape = buf;
  }
  const std::string mtp = rep.dir + "/mtp.safetensors";
  if (ranks.lead()) {
    if (holds_checkpoint(rep.dir, want, "the benchmark's")) {
      say("reusing the checkpoint in " + rep.dir);
    } else {
      say("writing a random " + opt.weights + " checkpoint of " + rep.shape + " with " + std::to_string(opt.layers) +
          " layers to " + rep.dir + " ...");
      auto t0 = Clock::now();
      RandomCheckpointOptions ro;
      ro.weights = kind;
      ro.seed = 1;
      ro.shards = 4;
      ro.progress = !say.quiet;
      write_random_checkpoint(rep.dir, checkpoint_config(opt.layers), ro);
      stamp_checkpoint(rep.dir, want);
      rep.write_seconds = seconds_since(t0);
    }
    if (!std::filesystem::exists(mtp)) {
      say("adding an MTP module (mtp.safetensors) ...");
      add_mtp_module(rep.dir, opt.layers, checkpoint_config(opt.layers + 1), kind);
    }
  }
  ranks.sync();
  if (!ranks.lead() && (!holds_checkpoint(rep.dir, want, "the benchmark's") || !std::filesystem::exists(mtp)))
    throw std::runtime_error("no benchmark checkpoint in " + rep.dir + " on this rank's host: rank 0 writes it on its own; "
                             "give --dir a folder every host shares, or write it on each host first (mla bench --dir "
                             "... without mpirun)");
}

}  // namespace

RandomWeights random_weights(const std::string& weights) {
  if (weights == "bf16") return RandomWeights::BF16;
  if (weights == "fp8") return RandomWeights::FP8;
  if (weights == "int4") return RandomWeights::INT4_EXPERTS;
  if (weights == "int4-fp8") return RandomWeights::INT4_FP8;
  if (weights == "int8") return RandomWeights::INT8;
  throw std::invalid_argument("--weights: unknown '" + weights + "' (bf16, fp8, int4, int4-fp8, int8)");
}

bool holds_checkpoint(const std::string& dir, const nlohmann::json& want, const std::string& what) {
  if (!std::filesystem::exists(dir + "/config.json")) return false;
  nlohmann::json have;
  if (std::ifstream f(dir + "/mla-bench.json"); f) f >> have;
  if (have != want)
    throw std::runtime_error(dir + " holds a checkpoint that is not " + what + " " + want.dump() +
                             " (mla-bench.json says " + have.dump() + "); choose another --dir");
  return true;
}

void stamp_checkpoint(const std::string& dir, const nlohmann::json& want) {
  std::ofstream(dir + "/mla-bench.json") << want.dump() << "\n";
}

std::unique_ptr<Model> load_checkpoint(const Options& opt, const cpu::Context& ctx, Ranks& ranks, const Say& say,
                                       Report& rep) {
  rep.own_model = !opt.model.empty();
  if (rep.own_model) {
    if (!opt.dir.empty() || !opt.checkpoint_config.is_null())
      throw std::invalid_argument("--model measures a checkpoint as it is: --dir and --config describe the random one");
    if (!gguf_path(opt.model) && !std::filesystem::exists(opt.model + "/config.json"))
      throw std::invalid_argument("--model " + opt.model + ": no config.json there, and not a GGUF file");
    rep.dir = opt.model;
    rep.shape = "the checkpoint's own shape";
  } else {
    random_checkpoint(opt, ranks, say, rep);
  }
  auto t0 = Clock::now();
  auto model = Model::load(rep.dir, LoadOptions{ctx, false, opt.quantize, /*with_mtp=*/true, &parallel::world()});
  volatile uint64_t sink = touch_all(model->weights());
  (void)sink;
  rep.load_seconds = seconds_since(t0);
  if (rep.own_model) {
    const ModelConfig& c = model->config();
    char buf[200];
    std::snprintf(buf, sizeof buf, "%s (%lld layers, hidden %lld, %lld routed experts, top-%lld)", c.model_type.c_str(),
                  (long long)c.num_hidden_layers, (long long)c.hidden_size, (long long)c.n_routed_experts,
                  (long long)c.num_experts_per_tok);
    rep.shape = buf;
  }
  return model;
}

bool int_experts(const Options& opt, const Report& rep, const Model& model) {
  if (opt.quantize.experts)
    return *opt.quantize.experts == quant::QuantFormat::INT4 || *opt.quantize.experts == quant::QuantFormat::INT8;
  if (rep.own_model) return held_int_experts(model.weights());
  const RandomWeights kind = random_weights(opt.weights);
  return kind == RandomWeights::INT4_EXPERTS || kind == RandomWeights::INT4_FP8 || kind == RandomWeights::INT8;
}

}  // namespace mla::bench
