// Grammar mask time per decode step on the real DeepSeek-V3 tokenizer (vocab 129,280), for a few
// schemas, over random walks of about 200 steps (each step: fill_mask over the vocabulary, apply
// it to a row of logits, accept a random allowed token). Prints median and p99 ms per step of a
// warm grammar (its per-position token sets already computed by an earlier walk), the cold
// walk's total (the one-time precomputation included), and beside them the reference: the
// per-token decode time of a checkpoint given with --model (single-token forward passes, as the
// engine's decode), with the ratio. The project's target: masked decode at most 10% slower than
// unmasked on the 6-layer V2-Lite-shaped bench checkpoint.
//
// Columns: steps (warm walks, all together), median / p99 / mean ms of a step (fill_mask +
// apply_mask) in the warm walks, the cold walk's total ms (its positions computed as they are
// met: a first request with a new schema), the grammar's compile ms, its terminal positions /
// the distinct token sets they hold, and the ms to precompute them all.
//
// usage: grammar_mask [--tokenizer DIR] [--model DIR] [--steps N] [--walks N] [--seed S]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5));
  return v[i];
}

struct Schema {
  const char* name;
  const char* json;  // empty: json_object mode
};

const Schema kSchemas[] = {
    {"json_object", ""},
    {"tool-call arguments",
     R"({"type":"object","properties":{"location":{"type":"string","description":"City and country"},
         "unit":{"type":"string","enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":14},
         "include_hourly":{"type":"boolean"}},"required":["location","unit"],"additionalProperties":false})"},
    {"nested",
     R"({"type":"object","properties":{"id":{"type":"integer","minimum":0},"title":{"type":"string","maxLength":80},
         "authors":{"type":"array","items":{"$ref":"#/$defs/person"},"minItems":1,"maxItems":5},
         "tags":{"type":"array","items":{"type":"string"}},"score":{"type":"number","minimum":0,"maximum":10},
         "meta":{"anyOf":[{"type":"null"},{"type":"object","properties":{"source":{"type":"string"},
         "year":{"type":"integer","minimum":1900,"maximum":2100}},"required":["source"]}]}},
         "required":["id","title","authors"],"$defs":{"person":{"type":"object","properties":{
         "name":{"type":"string"},"email":{"type":"string"},"affiliations":{"type":"array","items":{"type":"string"}}},
         "required":["name"]}}})"},
};

struct WalkStats {
  std::vector<double> step_ms;
  double total_ms = 0;
  int steps = 0;
  bool ended = false;
};

// A random walk: fill the mask, apply it to logits, pick a random allowed token. After
// `patience` steps the walk prefers the stop id and tokens that close strings and containers.
WalkStats walk(const std::shared_ptr<const mla::grammar::CompiledGrammar>& g, const mla::grammar::TokenTable& t,
               std::mt19937& rng, int steps, const std::vector<int32_t>& closers) {
  mla::grammar::Matcher m(g);
  std::vector<uint32_t> mask(t.mask_words());
  std::vector<float> logits(t.vocab_size(), 0.0f);
  std::vector<int32_t> allowed;
  WalkStats s;
  const auto start = Clock::now();
  const int patience = steps * 3 / 4;
  for (; s.steps < steps * 2; ++s.steps) {
    const auto t0 = Clock::now();
    m.fill_mask(mask);
    mla::grammar::apply_mask(logits, mask);
    s.step_ms.push_back(ms_since(t0));
    std::fill(logits.begin(), logits.end(), 0.0f);
    allowed.clear();
    for (size_t w = 0; w < mask.size(); ++w)
      for (uint32_t bits = mask[w]; bits; bits &= bits - 1) allowed.push_back(int32_t(w * 32 + size_t(__builtin_ctz(bits))));
    if (allowed.empty()) {
      std::fprintf(stderr, "error: empty mask\n");
      std::exit(1);
    }
    int32_t pick = allowed[rng() % allowed.size()];
    if (s.steps >= patience) {
      bool found = false;
      for (int32_t id : t.stop_ids())
        if ((mask[size_t(id) >> 5] >> (id & 31)) & 1) pick = id, found = true;
      for (size_t k = 0; k < closers.size() && !found; ++k)
        if ((mask[size_t(closers[k]) >> 5] >> (closers[k] & 31)) & 1) pick = closers[k], found = true;
    }
    if (!m.accept_token(pick)) {
      std::fprintf(stderr, "error: allowed token %d rejected\n", pick);
      std::exit(1);
    }
    if (m.is_done()) {
      s.ended = true;
      ++s.steps;
      break;
    }
  }
  s.total_ms = ms_since(start);
  return s;
}

std::string default_tokenizer() {
#ifdef MLA_SHARED_DIR
  return std::string(MLA_SHARED_DIR) + "/fixtures/tokenizer/deepseek-v3";
#else
  return "../shared/fixtures/tokenizer/deepseek-v3";
#endif
}

// Median ms of a single-token forward pass (batch 1, a short context), or 0 without a model.
double decode_ms(const std::string& dir, int passes) {
  if (dir.empty()) return 0;
  std::fprintf(stderr, "loading %s ...\n", dir.c_str());
  auto model = mla::Model::load(dir);
  const int64_t vocab = model->config().vocab_size;
  mla::LatentPool pool = model->make_pool((16 + passes + 63) / 64 + 2, 64);
  mla::PageTable seq;
  mla::ForwardOptions fo;
  fo.last_logits_only = true;
  std::vector<float> logits;
  std::vector<int32_t> prompt(8);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 7919) % size_t(vocab));
  mla::SeqSlice s{&seq, prompt};
  model->forward(std::span<mla::SeqSlice>(&s, 1), pool, fo, logits);
  std::vector<double> ms;
  for (int i = 0; i < passes + 2; ++i) {
    const int32_t id = int32_t((i * 104729) % vocab);
    mla::SeqSlice d{&seq, std::span<const int32_t>(&id, 1)};
    const auto t0 = Clock::now();
    model->forward(std::span<mla::SeqSlice>(&d, 1), pool, fo, logits);
    if (i >= 2) ms.push_back(ms_since(t0));  // two warm-up passes
  }
  std::printf("reference: %s, vocab %lld, %d single-token decode passes: median %.2f ms, p99 %.2f ms\n", dir.c_str(),
              (long long)vocab, passes, percentile(ms, 0.5), percentile(ms, 0.99));
  return percentile(ms, 0.5);
}

}  // namespace

int main(int argc, char** argv) {
  std::string tok_dir = default_tokenizer(), model_dir;
  int steps = 200, walks = 3, passes = 16;
  unsigned seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--tokenizer") tok_dir = next();
    else if (a == "--model") model_dir = next();
    else if (a == "--steps") steps = std::atoi(next().c_str());
    else if (a == "--walks") walks = std::atoi(next().c_str());
    else if (a == "--passes") passes = std::atoi(next().c_str());
    else if (a == "--seed") seed = unsigned(std::atoi(next().c_str()));
    else {
      std::fprintf(stderr, "usage: grammar_mask [--tokenizer DIR] [--model DIR] [--steps N] [--walks N] [--passes N] [--seed S]\n");
      return 2;
    }
  }
  try {
    auto t0 = Clock::now();
    const mla::Tokenizer tok = mla::Tokenizer::load(tok_dir);
    const double load_ms = ms_since(t0);
    t0 = Clock::now();
    auto table = mla::grammar::TokenTable::from_tokenizer(tok, 129280);
    std::printf("tokenizer %s: %zu ids (mask over %zu), %zu allowed in grammars; load %.0f ms, token table %.0f ms\n",
                tok_dir.c_str(), tok.vocab_size(), table->vocab_size(), table->sorted_ids().size(), load_ms,
                ms_since(t0));
    std::vector<int32_t> closers;
    for (const char* s : {"\"}", "\"]", "\"", "}", "]", "\":", ":", "0", "1", "true", "null", "a"}) {
      const auto ids = tok.encode(s, false);
      if (ids.size() == 1) closers.push_back(ids[0]);
    }
    const double ref = decode_ms(model_dir, passes);
    std::mt19937 rng(seed);
    std::printf("%-22s %8s %8s %8s %8s %10s %8s %11s %10s", "schema", "steps", "median", "p99", "mean", "cold walk",
                "compile", "posns/sets", "precompute");
    if (ref > 0) std::printf(" %10s", "med/decode");
    std::printf("\n");
    for (const Schema& sc : kSchemas) {
      t0 = Clock::now();
      mla::grammar::Grammar gr = sc.json[0] ? mla::grammar::json_schema_grammar(nlohmann::ordered_json::parse(sc.json))
                                            : mla::grammar::json_object_grammar();
      auto g = std::make_shared<const mla::grammar::CompiledGrammar>(std::move(gr), table);
      const double compile_ms = ms_since(t0);
      // Cold: the first walk computes the per-position token sets it meets.
      const WalkStats cold = walk(g, *table, rng, steps, closers);
      // Warm: every position's token sets computed (as for a grammar cached across requests).
      t0 = Clock::now();
      const size_t positions = g->precompute_all();
      const double precompute_ms = ms_since(t0);
      std::vector<double> all;
      int total_steps = 0;
      for (int w = 0; w < walks; ++w) {
        const WalkStats s = walk(g, *table, rng, steps, closers);
        all.insert(all.end(), s.step_ms.begin(), s.step_ms.end());
        total_steps += s.steps;
      }
      double mean = 0;
      for (double x : all) mean += x;
      mean /= double(std::max<size_t>(all.size(), 1));
      const double med = percentile(all, 0.5);
      const std::string posns = std::to_string(positions) + "/" + std::to_string(g->distinct_position_sets());
      std::printf("%-22s %8d %8.3f %8.3f %8.3f %8.0fms %6.0fms %11s %8.0fms", sc.name, total_steps, med,
                  percentile(all, 0.99), mean, cold.total_ms, compile_ms, posns.c_str(), precompute_ms);
      if (ref > 0) std::printf(" %9.2f%%", 100.0 * med / ref);
      std::printf("\n");
    }
    if (ref > 0) std::printf("target: mask time per step <= 10%% of the decode step (%.2f ms here)\n", 0.1 * ref);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
