// Masked against unmasked decode through the engine, per generated token, on the `mla bench`
// checkpoint (a random DeepSeek-V2-Lite-shaped model, vocab 129,280) with the real DeepSeek-V3
// tokenizer: the same request decoded greedily without a grammar and with one (the grammar's
// matcher as the request's logits processor, exactly as the server runs response_format and
// forced tool calls: fill_mask over the vocabulary, apply_mask, accept_token, each step). Runs
// alternate (unmasked, masked, ...) so that the machine's drift hits both alike; a first masked
// run warms the grammar's per-position token sets (its time is printed as the cold run).
// Prints the median ms per token of each and the ratio masked / unmasked (target <= 1.10).
// bench/grammar_mask.cpp measures the mask step alone; this is the whole decode step with it.
//
// usage: masked_decode [--model DIR] [--tokenizer DIR] [--tokens N] [--runs N] [--schema json_object|tool]
//   --model: default the checkpoint `mla bench` writes (/tmp/mla-bench-v2lite-6L-bf16)
//   --tokenizer: default ../shared/fixtures/tokenizer/deepseek-v3 beside the checkout
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/grammar_processor.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir = (std::filesystem::temp_directory_path() / "mla-bench-v2lite-6L-bf16").string();
  // The fixture beside the checkout: <checkout>/build/masked_decode -> <checkout>/../shared.
  std::string tok_dir =
      (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "../../shared/fixtures/tokenizer/deepseek-v3")
          .lexically_normal()
          .string();
  std::string schema = "tool";
  int tokens = 32, runs = 5;
  for (int i = 1; i < argc; ++i) {
    auto next = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", flag);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--model")) model_dir = next("--model");
    else if (!std::strcmp(argv[i], "--tokenizer")) tok_dir = next("--tokenizer");
    else if (!std::strcmp(argv[i], "--tokens")) tokens = std::stoi(next("--tokens"));
    else if (!std::strcmp(argv[i], "--runs")) runs = std::stoi(next("--runs"));
    else if (!std::strcmp(argv[i], "--schema")) schema = next("--schema");
    else {
      std::fprintf(stderr, "usage: masked_decode [--model DIR] [--tokenizer DIR] [--tokens N] [--runs N] "
                           "[--schema json_object|tool]\n");
      return 2;
    }
  }
  if (!std::filesystem::exists(model_dir + "/config.json")) {
    std::fprintf(stderr, "no checkpoint in %s: run `mla bench` once (it writes it) or pass --model\n", model_dir.c_str());
    return 1;
  }
  auto model = mla::Model::load(model_dir);
  mla::Tokenizer tok = mla::Tokenizer::load(tok_dir);
  const int64_t vocab = model->config().vocab_size;

  const std::string gbnf =
      schema == "json_object"
          ? mla::grammar::json_object_gbnf()
          : mla::grammar::json_schema_to_gbnf(nlohmann::ordered_json::parse(
                R"({"type":"object","properties":{"location":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]},
                    "days":{"type":"integer","minimum":1,"maximum":14}},"required":["location","unit","days"]})"));
  const int32_t eos = tok.eos_id();
  auto table = mla::grammar::TokenTable::from_tokenizer(tok, size_t(vocab), {eos});
  auto compiled = std::make_shared<const mla::grammar::CompiledGrammar>(mla::grammar::Grammar::parse(gbnf), table);

  mla::EngineOptions eo;
  eo.kv_pages = 8;
  eo.page_size = 64;
  mla::Engine engine(*model, &tok, eo);
  const std::vector<int32_t> prompt = tok.encode("Answer in JSON: the weather in Paris for three days.", true);

  // Per token after the first (the prompt's pass excluded); ignore_eos-like: the masked run may
  // end when its grammar does, so per-token time is what is compared.
  auto run = [&](bool masked, int64_t* steps) {
    mla::Request r;
    r.prompt = prompt;
    r.sampling.temperature = 0;
    r.max_new_tokens = tokens;
    r.eos_token_ids = {eos};
    if (masked) r.logits_processor = mla::grammar_processor(compiled, prompt.size(), &tok);
    mla::RequestResult res = engine.generate(r);
    if (steps) *steps = res.decode_steps();
    return res.decode_steps() > 0 ? 1e3 * res.decode_seconds / double(res.decode_steps()) : 0.0;
  };
  int64_t cold_steps = 0;
  const double cold = run(true, &cold_steps);
  std::vector<double> plain, masked;
  int64_t masked_steps = 0;
  for (int i = 0; i < runs; ++i) {
    plain.push_back(run(false, nullptr));
    masked.push_back(run(true, &masked_steps));
  }
  const double p = median(plain), m = median(masked);
  std::printf("masked decode (%s grammar, vocab %lld, %d runs of up to %d tokens, %lld decode steps masked)\n",
              schema.c_str(), (long long)vocab, runs, tokens, (long long)masked_steps);
  std::printf("  unmasked %.2f ms/token   masked %.2f ms/token   (cold masked run %.2f ms/token over %lld steps)\n", p,
              m, cold, (long long)cold_steps);
  std::printf("  ratio masked / unmasked: %.3f (target <= 1.10)\n", p > 0 ? m / p : 0.0);
  return 0;
}
