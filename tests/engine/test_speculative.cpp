// Speculative decoding in the Engine (engine/speculative.h), on the fixtures with an MTP layer
// (deepseek-v3-tiny, glm-4.7-flash-tiny):
//  - greedy output is token for token the same with and without speculation: the MTP's own
//    drafts, k = 1..3, every KV cache format, both precisions, one sequence and several;
//  - injected drafts drive verify / accept / rollback independently of the random weights: the
//    true greedy continuation is accepted whole, a wrong token at position j cuts exactly
//    there, the cache keeps exactly the pages of the accepted tokens across page boundaries;
//  - stop conditions (EOS, max tokens, stop strings) cut inside a run of accepted tokens;
//  - rejection sampling leaves the distribution unchanged (chi-square test);
//  - the grammar processor rolls back the drafts it saw and the engine rejected;
//  - the adaptive gate switches speculation off when plain decoding is faster, and back on;
//  - the MTP drafts' head in a cheaper format (INT4, FP8) changes drafts only, never the output,
//    and on logits with a trained-like margin picks the same token as the head as stored;
//  - preempted sequences give their MTP cache back at once and keep their tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <random>

#include "engine/engine.h"
#include "engine/test_requests.h"
#include "engine/grammar_processor.h"
#include "engine/speculative.h"
#include "grammar/grammar.h"
#include "tensor/dtype.h"
#include "tensor/quantize.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace mla {
namespace {

Model& mtp_model(const std::string& name, cpu::Precision p = cpu::Precision::Precise) {
  static std::map<std::pair<std::string, int>, std::unique_ptr<Model>> cache;
  auto& m = cache[{name, int(p)}];
  if (!m) {
    cpu::Context ctx;
    ctx.precision = p;
    m = Model::load(test::fixture(name), ctx, false, /*with_mtp=*/true);
  }
  return *m;
}

using test::greedy;
using test::prompt_ids;

EngineOptions options(int64_t pages, int64_t page_size, KvDType dtype, int64_t k = 0,
                      std::shared_ptr<DraftSource> src = nullptr) {
  EngineOptions o = test::pool_of(pages, page_size, dtype);
  if (k > 0) {
    o.speculative.enabled = true;
    o.speculative.draft_tokens = k;
    o.speculative.adaptive = false;  // every step speculates: the tests see each verify
    o.draft_source = std::move(src);
  }
  return o;
}

std::vector<int32_t> run(Model& m, const EngineOptions& o, const Request& r, EngineStats* st = nullptr) {
  Engine e(m, nullptr, o);
  auto res = e.generate(r);
  if (st) *st = e.stats();
  return res.tokens;
}

// ---- the MTP module's own drafts ----

TEST(Speculative, MtpGreedyEqualsPlainEveryKAndKvFormat) {
  for (const char* fx : {"deepseek-v3-tiny", "glm-4.7-flash-tiny"})
    for (KvDType dt : {KvDType::F32, KvDType::BF16, KvDType::FP8})
      for (uint32_t seed : {1u, 2u}) {
        Model& m = mtp_model(fx);
        const Request r = greedy(prompt_ids(5 + int(seed) * 9, seed), 40);
        const auto plain = run(m, options(64, 8, dt), r);
        ASSERT_EQ(plain.size(), 40u);
        for (int64_t k : {1, 2, 3}) {
          EngineStats st;
          EXPECT_EQ(run(m, options(64, 8, dt, k), r, &st), plain) << fx << " " << kv_dtype_name(dt) << " k=" << k;
          EXPECT_GT(st.spec_steps, 0);
          EXPECT_EQ(st.spec_draft_tokens, st.spec_steps * k);
          EXPECT_GE(st.spec_tokens_per_step(), 1.0);
          EXPECT_LE(st.spec_tokens_per_step(), double(k + 1));
        }
      }
}

// The fast precision: bf16 activations, AMX / GEMV choices by token count. The verify rows run
// on the one-token kernels, so the tokens still agree exactly.
TEST(Speculative, MtpGreedyEqualsPlainInFastPrecision) {
  for (const char* fx : {"deepseek-v3-tiny", "glm-4.7-flash-tiny"}) {
    Model& m = mtp_model(fx, cpu::Precision::Fast);
    for (uint32_t seed : {3u, 4u, 5u}) {
      const Request r = greedy(prompt_ids(20, seed), 48);
      const auto plain = run(m, options(64, 16, KvDType::BF16), r);
      for (int64_t k : {1, 3}) EXPECT_EQ(run(m, options(64, 16, KvDType::BF16, k), r), plain) << fx << " k=" << k;
    }
  }
}

TEST(Speculative, MtpBatchedGreedyEqualsAlone) {
  Model& m = mtp_model("deepseek-v3-tiny");
  std::vector<Request> reqs;
  for (uint32_t i = 0; i < 4; ++i) reqs.push_back(greedy(prompt_ids(3 + 7 * int(i), 10 + i), 24 + 3 * i));
  std::vector<std::vector<int32_t>> alone;
  for (auto& r : reqs) alone.push_back(run(m, options(64, 8, KvDType::F32), r));
  Engine e(m, nullptr, options(64, 8, KvDType::F32, 2));
  std::vector<RequestResult> got(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    e.submit(reqs[i], [&got, i](const RequestEvent& ev) { got[i].add(ev); });
  e.run_until_idle();
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].tokens, alone[i]) << "request " << i;
  EXPECT_GT(e.stats().spec_steps, 0);
  EXPECT_EQ(e.stats().kv_pages_free + e.stats().kv_pages_prefix_cache, e.stats().kv_pages_total);
}

TEST(Speculative, DraftsNeverTakeAnotherSequencesToken) {
  // Passes of two tokens and two sequences with drafts: each decodes a token in every pass and
  // the drafts get what is left (here nothing), rather than one sequence's drafts filling the
  // pass while the other waits.
  Model& m = mtp_model("deepseek-v3-tiny");
  EngineOptions o = options(64, 8, KvDType::F32, 2);
  o.max_batch_tokens = 2;
  std::vector<Request> reqs = {greedy(prompt_ids(1, 7), 20), greedy(prompt_ids(1, 8), 20)};
  Engine e(m, nullptr, o);
  EXPECT_EQ(e.options().max_running, 2) << "no more sequences run than a pass has tokens";
  std::vector<RequestResult> got(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    e.submit(reqs[i], [&got, i](const RequestEvent& ev) { got[i].add(ev); });
  for (int pass = 0; pass < 100 && e.step(); ++pass)
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(got[i].tokens.size(), std::min<size_t>(size_t(pass + 1), 20)) << "request " << i << " pass " << pass;
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].tokens, run(m, options(64, 8, KvDType::F32), reqs[i]));
}

// ---- injected drafts ----

// Drafts from a known continuation of the prompt: position i of the output is cont[i]; `wrong`
// makes the draft at output position w a different token.
std::shared_ptr<DraftSource> from_continuation(std::vector<int32_t> cont, size_t prompt_len,
                                               std::function<bool(size_t)> wrong = nullptr) {
  return std::make_shared<InjectedDrafts>([cont, prompt_len, wrong](const Sequence& s, int64_t k) {
    std::vector<int32_t> d;
    for (int64_t j = 0; j < k; ++j) {
      const size_t at = s.tokens.size() - prompt_len + size_t(j);
      if (at >= cont.size()) break;
      d.push_back(wrong && wrong(at) ? (cont[at] + 1) % 500 + 2 : cont[at]);
    }
    return d;
  });
}

TEST(Speculative, TrueContinuationIsAcceptedWhole) {
  Model& m = mtp_model("deepseek-v3-tiny");
  for (KvDType dt : {KvDType::F32, KvDType::BF16, KvDType::FP8}) {
    const Request r = greedy(prompt_ids(11, 7), 33);
    const auto plain = run(m, options(64, 4, dt), r);
    for (int64_t k : {1, 2, 4}) {
      EngineStats st;
      EXPECT_EQ(run(m, options(64, 4, dt, k, from_continuation(plain, r.prompt.size())), r, &st), plain);
      EXPECT_EQ(st.spec_accepted_tokens, st.spec_draft_tokens) << kv_dtype_name(dt) << " k=" << k;
      EXPECT_DOUBLE_EQ(st.spec_acceptance_rate(), 1.0);
      // The first token comes from the prompt's pass; each verify then yields k + 1 until the
      // token limit cuts the last run short.
      EXPECT_EQ(st.spec_steps, (int64_t(plain.size()) - 1 + k) / (k + 1)) << kv_dtype_name(dt) << " k=" << k;
    }
  }
}

TEST(Speculative, AWrongTokenCutsExactlyThere) {
  Model& m = mtp_model("glm-4.7-flash-tiny");
  const Request r = greedy(prompt_ids(9, 8), 30);
  const auto plain = run(m, options(64, 4, KvDType::F32), r);
  const int64_t k = 4;
  // Only output position 6 is wrong. The verify covering it accepts the drafts before it, then
  // the target's own token replaces it.
  for (size_t wrong_at : {size_t(1), size_t(6), size_t(13)}) {
    std::vector<std::pair<int64_t, int64_t>> steps;  // (output tokens before, tokens taken)
    auto src = from_continuation(plain, r.prompt.size(), [wrong_at](size_t at) { return at == wrong_at; });
    Engine e(m, nullptr, options(64, 4, KvDType::F32, k, src));
    RequestResult res;
    e.submit(r, [&](const RequestEvent& ev) { res.add(ev); });
    int64_t before = 0;
    while (e.step()) {
      const int64_t now = int64_t(res.tokens.size());
      steps.push_back({before, now - before});
      before = now;
    }
    EXPECT_EQ(res.tokens, plain) << "wrong at " << wrong_at;
    // The step whose drafts start at output position s0 <= wrong_at < s0 + k takes exactly
    // wrong_at - s0 drafts plus the target's token; its drafts from wrong_at on are the only
    // ones the run does not accept.
    bool seen = false;
    for (auto [s0, taken] : steps)
      if (s0 >= 1 && int64_t(wrong_at) >= s0 && int64_t(wrong_at) < s0 + k) {
        EXPECT_EQ(taken, int64_t(wrong_at) - s0 + 1) << "wrong at " << wrong_at << ", step from " << s0;
        const EngineStats st = e.stats();
        EXPECT_EQ(st.spec_draft_tokens - st.spec_accepted_tokens, s0 + k - int64_t(wrong_at)) << wrong_at;
        seen = true;
        break;
      }
    EXPECT_TRUE(seen) << wrong_at;
  }
}

// After every step the sequence holds exactly the pages of its cached tokens: the pages a
// rejected run of drafts reserved past a page boundary are free again.
TEST(Speculative, RollbackFreesPagesAtBoundaries) {
  Model& m = mtp_model("deepseek-v3-tiny");
  for (KvDType dt : {KvDType::F32, KvDType::BF16, KvDType::FP8}) {
    const int64_t ps = 4;
    const Request r = greedy(prompt_ids(6, 9), 40);
    const auto plain = run(m, options(64, ps, dt), r);
    // Every other draft run is wrong from its second token on: rejections land on all offsets
    // within a page.
    auto src = from_continuation(plain, r.prompt.size(), [](size_t at) { return at % 3 == 2; });
    Engine e(m, nullptr, options(64, ps, dt, 3, src));
    int64_t got = 0;
    const int64_t id = e.submit(r, [&](const RequestEvent& ev) { got += ev.token >= 0; });
    std::vector<int32_t> tokens;
    while (e.step()) {
      const auto pages = e.pages_of(id);
      if (pages.empty()) break;  // finished
      // Cached: the prompt and every output token but the last (it runs in the next pass).
      const int64_t cached = int64_t(r.prompt.size()) + got - 1;
      EXPECT_EQ(int64_t(pages.size()), pages_for_tokens(cached, ps)) << kv_dtype_name(dt) << " after " << got;
      EXPECT_EQ(e.stats().kv_pages_free, e.stats().kv_pages_total - int64_t(pages.size()));
    }
    EXPECT_EQ(got, 40);
    EXPECT_EQ(e.stats().kv_pages_free + e.stats().kv_pages_prefix_cache, e.stats().kv_pages_total);
    EXPECT_LT(e.stats().spec_acceptance_rate(), 1.0);
  }
}

TEST(Speculative, StopConditionsInsideAcceptedRuns) {
  Model& m = mtp_model("deepseek-v3-tiny");
  const Request base = greedy(prompt_ids(10, 11), 30);
  const auto plain = run(m, options(64, 8, KvDType::F32), base);
  auto src = from_continuation(plain, base.prompt.size());
  for (int64_t limit : {int64_t(2), int64_t(5), int64_t(7)}) {
    Request r = base;
    r.max_new_tokens = limit;
    EXPECT_EQ(run(m, options(64, 8, KvDType::F32, 4, src), r),
              std::vector<int32_t>(plain.begin(), plain.begin() + limit))
        << "max tokens " << limit;
  }
  // EOS: the first occurrence of plain[6] ends the output there, whatever the drafts after it.
  Request r = base;
  const int32_t eos = plain[6];
  r.eos_token_ids = {eos};
  const size_t end = size_t(std::find(plain.begin(), plain.end(), eos) - plain.begin()) + 1;
  EXPECT_EQ(run(m, options(64, 8, KvDType::F32, 4, src), r), std::vector<int32_t>(plain.begin(), plain.begin() + end));
}

TEST(Speculative, StopStringInsideAcceptedRun) {
  Model& m = mtp_model("deepseek-v3-tiny");
  test::TempDir dir("spec-tok");
  Tokenizer::write_byte_level_tokenizer(dir.str(), 512);
  Tokenizer tok = Tokenizer::load(dir.str());
  Request base = greedy(tok.encode("for (int i = 0;", true), 24);
  Engine plain_engine(m, &tok, options(64, 8, KvDType::F32));
  const auto free_run = plain_engine.generate(base);
  // A stop string of two characters of the output's text, from its middle.
  std::string stop;
  for (size_t i = free_run.text.size() / 2; i + 1 < free_run.text.size() && stop.empty(); ++i)
    if (static_cast<unsigned char>(free_run.text[i]) < 0x80 && static_cast<unsigned char>(free_run.text[i + 1]) < 0x80)
      stop = free_run.text.substr(i, 2);
  ASSERT_FALSE(stop.empty());
  Request r = base;
  r.stop = {stop};
  Engine plain2(m, &tok, options(64, 8, KvDType::F32));
  const auto want = plain2.generate(r);
  Engine spec(m, &tok, options(64, 8, KvDType::F32, 4, from_continuation(free_run.tokens, base.prompt.size())));
  std::string streamed;
  const auto got = spec.generate(r, [&](const RequestEvent& e) { streamed += e.text; });
  EXPECT_EQ(got.reason, FinishReason::StopString);
  EXPECT_EQ(got.text, want.text);
  EXPECT_EQ(got.tokens, want.tokens) << "no token past the stop";
  EXPECT_EQ(streamed, want.text);
}

// ---- rejection sampling keeps the distribution ----

TEST(Speculative, RejectionSamplingKeepsTheDistribution) {
  Model& m = mtp_model("deepseek-v3-tiny");
  const auto prompt = prompt_ids(6, 12);
  const int32_t forced = 77;  // the first output token, forced: the second is then drawn from p
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 8;
  // p: the target's distribution of the second token (the same sampler settings).
  std::vector<float> p;
  {
    LatentPool pool = m.make_pool(8, 16, KvDType::F32);
    PageTable t;
    std::vector<int32_t> ids = prompt;
    ids.push_back(forced);
    std::vector<SeqSlice> b{{&t, ids}};
    std::vector<float> logits;
    ForwardOptions fo;
    fo.last_logits_only = true;
    m.forward(b, pool, fo, logits);
    p = Sampler(sp).probabilities(logits);
  }
  std::vector<int32_t> support;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] > 0) support.push_back(int32_t(i));
  ASSERT_EQ(support.size(), 8u);
  // q: uniform over four of p's tokens and four it never gives: both outcomes of the test occur.
  std::vector<float> q(p.size(), 0.0f);
  std::vector<int32_t> qs = {support[0], support[3], support[5], support[7], 300, 301, 302, 303};
  for (int32_t id : qs) q[size_t(id)] = 1.0f / 8;
  ASSERT_EQ(std::find(support.begin(), support.end(), 300), support.end());
  const int trials = 4000;
  std::map<int32_t, int> count;
  std::mt19937_64 draft_rng(99);
  auto src = InjectedDrafts::filling([&](Sequence& s, int64_t) {
    s.draft = {qs[draft_rng() % qs.size()]};
    s.draft_probs = {q};
  });
  EngineOptions o = options(16, 16, KvDType::F32, 1, src);
  o.prefix_cache = false;
  Engine e(m, nullptr, o);
  for (int t = 0; t < trials; ++t) {
    Request r;
    r.prompt = prompt;
    r.sampling = sp;
    r.sampling.seed = uint64_t(t);
    r.max_new_tokens = 2;
    r.logits_processor = [&](std::span<float> logits, std::span<const int32_t> tokens) {
      if (tokens.size() == prompt.size())
        for (size_t i = 0; i < logits.size(); ++i) logits[i] = int32_t(i) == forced ? 0.0f : -INFINITY;
    };
    auto res = e.generate(r);
    ASSERT_EQ(res.tokens.size(), 2u);
    ASSERT_EQ(res.tokens[0], forced);
    count[res.tokens[1]]++;
  }
  EXPECT_EQ(e.stats().spec_steps, trials);
  EXPECT_GT(e.stats().spec_accepted_tokens, trials / 10);
  EXPECT_LT(e.stats().spec_accepted_tokens, trials * 9 / 10);
  // Pearson's chi-square over p's 8 tokens (7 degrees of freedom): P(X^2 > 42) = 5.2e-7 under
  // the null hypothesis, the false-failure probability of this test. A token outside p's
  // support fails it at once. The draft distribution q itself would give X^2 in the thousands.
  auto chi2 = [&](const std::vector<float>& dist) {
    double x = 0;
    for (int32_t id : support) {
      const double want = trials * double(dist[size_t(id)]);
      const double d = count[id] - want;
      x += want > 0 ? d * d / want : (count[id] ? INFINITY : 0);
    }
    return x;
  };
  int inside = 0;
  for (int32_t id : support) inside += count[id];
  EXPECT_EQ(inside, trials) << "a token outside the target's support was emitted";
  EXPECT_LT(chi2(p), 42.0);
  EXPECT_GT(chi2(q), 42.0) << "the test tells the draft's distribution from the target's";
}

TEST(Speculative, AcceptanceRulePieces) {
  const std::vector<float> p = {0.5f, 0.3f, 0.2f, 0.0f}, q = {0.25f, 0.25f, 0.25f, 0.25f};
  EXPECT_TRUE(accept_draft(p, q, 0, 0.999));   // p/q = 2: always
  EXPECT_TRUE(accept_draft(p, q, 2, 0.79));    // p/q = 0.8
  EXPECT_FALSE(accept_draft(p, q, 2, 0.81));
  EXPECT_FALSE(accept_draft(p, q, 3, 0.0));    // p = 0: never
  EXPECT_TRUE(accept_draft(p, {}, 1, 0.29));   // deterministic draft: with probability p(d)
  EXPECT_FALSE(accept_draft(p, {}, 1, 0.31));
  const auto r = residual_distribution(p, q, 2);
  EXPECT_NEAR(r[0], 0.25 / 0.30, 1e-6);
  EXPECT_NEAR(r[1], 0.05 / 0.30, 1e-6);
  EXPECT_EQ(r[2], 0.0f);
  EXPECT_EQ(r[3], 0.0f);
  const auto r1 = residual_distribution(p, {}, 0);
  EXPECT_NEAR(r1[1], 0.6, 1e-6);
  EXPECT_NEAR(r1[2], 0.4, 1e-6);
  EXPECT_EQ(r1[0], 0.0f);
}

// ---- grammar state follows rejected drafts ----

TEST(Speculative, GrammarProcessorRollsBackRejectedDrafts) {
  test::TempDir dir("spec-grammar");
  Tokenizer::write_byte_level_tokenizer(dir.str(), 512);
  Tokenizer tok = Tokenizer::load(dir.str());
  auto table = grammar::TokenTable::from_tokenizer(tok, 512, {tok.eos_id()});
  auto g = std::make_shared<const grammar::CompiledGrammar>(grammar::Grammar::parse(R"(root ::= "a" ("b" "c" | "d" "e"))"), table);
  const std::vector<int32_t> prompt = {tok.bos_id(), 100};
  const int32_t a = tok.encode("a", false)[0], b = tok.encode("b", false)[0], c = tok.encode("c", false)[0],
                d = tok.encode("d", false)[0], e = tok.encode("e", false)[0];
  LogitsProcessor spec = grammar_processor(g, prompt.size(), &tok);
  auto mask = [&](LogitsProcessor& proc, std::vector<int32_t> out) {
    std::vector<int32_t> t = prompt;
    t.insert(t.end(), out.begin(), out.end());
    std::vector<float> logits(512, 0.0f);
    proc(logits, t);
    std::vector<int32_t> allowed;
    for (int32_t i = 0; i < 512; ++i)
      if (logits[size_t(i)] == 0.0f) allowed.push_back(i);
    return allowed;
  };
  // Drafting saw a, b, c; the engine kept a and took d instead of b.
  mask(spec, {});
  mask(spec, {a});
  mask(spec, {a, b});
  EXPECT_EQ(mask(spec, {a, b, c}), std::vector<int32_t>{tok.eos_id()});
  const auto after = mask(spec, {a, d});
  LogitsProcessor fresh = grammar_processor(g, prompt.size(), &tok);
  EXPECT_EQ(after, mask(fresh, {a, d}));
  EXPECT_EQ(after, std::vector<int32_t>{e});
  LogitsProcessor fresh_a = grammar_processor(g, prompt.size(), &tok);
  const auto after_a = mask(spec, {a});  // back past d as well
  EXPECT_EQ(after_a, mask(fresh_a, {a}));
  EXPECT_NE(std::find(after_a.begin(), after_a.end(), b), after_a.end());
  EXPECT_NE(std::find(after_a.begin(), after_a.end(), d), after_a.end());
}

TEST(Speculative, GrammarConstrainedGreedyEqualsPlain) {
  Model& m = mtp_model("deepseek-v3-tiny");
  test::TempDir dir("spec-grammar2");
  Tokenizer::write_byte_level_tokenizer(dir.str(), 512);
  Tokenizer tok = Tokenizer::load(dir.str());
  auto table = grammar::TokenTable::from_tokenizer(tok, 512, {tok.eos_id()});
  auto g = std::make_shared<const grammar::CompiledGrammar>(grammar::Grammar::parse(R"(root ::= [a-z]+ "." [0-9]+)"), table);
  Request r = greedy(tok.encode("x", true), 30);
  r.eos_token_ids = {tok.eos_id()};
  auto make = [&] {
    Request q = r;
    q.logits_processor = grammar_processor(g, q.prompt.size(), &tok);
    return q;
  };
  Engine plain(m, &tok, options(64, 8, KvDType::F32));
  const auto want = plain.generate(make());
  for (int64_t k : {1, 3}) {
    Engine spec(m, &tok, options(64, 8, KvDType::F32, k));
    const auto got = spec.generate(make());
    EXPECT_EQ(got.tokens, want.tokens) << "k=" << k;
    EXPECT_EQ(got.text, want.text);
  }
}

// ---- the adaptive gate ----

TEST(Speculative, GateSwitchesOffWhenPlainIsFaster) {
  SpecGate g;
  int spec = 0, plain = 0;
  for (int i = 0; i < 200; ++i) {
    const bool s = g.speculate_next();
    (s ? spec : plain)++;
    // Speculation yields 1.05 tokens per sequence and step at 1.4x the pass time: slower.
    g.record(s, 100, s ? 105 : 100, s ? 1.4 : 1.0);
  }
  EXPECT_GT(plain, 170);
  EXPECT_GT(spec, 5) << "it keeps exploring";
  EXPECT_NEAR(g.expected_tokens(), 1.05, 1e-9);
  EXPECT_NEAR(g.cost_ratio(), 1.4, 1e-9);
  EXPECT_LT(g.gain(), 1.0);
  SpecGate h;
  spec = plain = 0;
  for (int i = 0; i < 200; ++i) {
    const bool s = h.speculate_next();
    (s ? spec : plain)++;
    h.record(s, 100, s ? 180 : 100, s ? 1.1 : 1.0);  // 1.8 tokens per step at 1.1x: faster
  }
  EXPECT_GT(spec, 170);
  EXPECT_GT(plain, 5);
  EXPECT_NEAR(h.gain(), 1.8 / 1.1, 1e-9);
  SpecGate off(false);
  for (int i = 0; i < 50; ++i) {
    EXPECT_TRUE(off.speculate_next());
    off.record(true, 1, 1, 10.0);
  }
}

// Off while the drafts are wrong, back on within a few explorations once they are right; the
// step costs (t_spec / t_plain = 1.3) stay the same throughout.
TEST(Speculative, GateComesBackOnWhenDraftsTurnRight) {
  SpecGate g;
  auto pass = [&](double tokens_per_seq) {
    const bool s = g.speculate_next();
    g.record(s, 2, s ? int64_t(2 * tokens_per_seq) : 2, s ? 1.3 : 1.0);
    return s;
  };
  for (int i = 0; i < 100; ++i) pass(1.0);
  EXPECT_LT(g.gain(), 1.0);
  int last_plain = -1;
  for (int i = 0; i < 200; ++i)
    if (!pass(2.0)) last_plain = i;
  EXPECT_GT(g.gain(), 1.0);
  // After the turn: one exploration (at most kExplore passes away) measures E = 2 (> 1.3), and
  // from then on plain passes are only the explorations, one per kExplore + 1.
  int plain_after = 0;
  for (int i = 0; i < 170; ++i) plain_after += !pass(2.0);
  EXPECT_LE(plain_after, 170 / SpecGate::kExplore + 1);
  EXPECT_GE(last_plain, 0);
}

// ---- the draft head ----

// Greedy output stays the model's whatever the drafts' head: verification reads lm_head as
// stored.
TEST(Speculative, DraftHeadFormatsKeepGreedyOutput) {
  for (const char* fx : {"deepseek-v3-tiny", "glm-4.7-flash-tiny"}) {
    Model& m = mtp_model(fx);
    const Request r = greedy(prompt_ids(12, 21), 40);
    const auto plain = run(m, options(64, 8, KvDType::F32), r);
    for (quant::QuantFormat f : {quant::QuantFormat::BF16, quant::QuantFormat::FP8, quant::QuantFormat::INT4})
      for (int64_t k : {1, 2}) {
        EngineOptions o = options(64, 8, KvDType::F32, k);
        o.speculative.draft_head = f;
        EngineStats st;
        EXPECT_EQ(run(m, o, r, &st), plain) << fx << " " << quant::quant_format_name(f) << " k=" << k;
        EXPECT_GT(st.spec_steps, 0);
        const WeightFormat want = f == quant::QuantFormat::INT4  ? WeightFormat::INT4_GROUP
                                  : f == quant::QuantFormat::FP8 ? WeightFormat::FP8_BLOCK128
                                                                 : m.weights().mtp[0].head.format;
        EXPECT_EQ(m.mtp_draft_head().format, want);
      }
    const double err = m.set_mtp_draft_head(quant::QuantFormat::INT4);
    EXPECT_GT(err, 0.0);
    EXPECT_LT(err, 0.2);  // INT4 groups of 32 with the scale search: ~0.1 on Gaussian-like rows
    EXPECT_EQ(m.set_mtp_draft_head(quant::QuantFormat::BF16), 0.0);
    EXPECT_EQ(m.mtp_draft_head().data, m.weights().mtp[0].head.data);
  }
}

// A draft is right about as often with the INT4 head as with the head as stored where the
// draft's logits carry a trained-like signal: hidden rows h = beta w_t + noise, beta chosen so
// the stored head gives the target t a softmax probability near 0.5-0.9 (a confident trained
// draft). The two heads' argmaxes are then the same on almost every row; on pure noise rows
// (beta = 0: near-ties among 4096 logits, as random weights give) they differ far more often.
TEST(Speculative, Int4DraftHeadAgreesOnTrainedLikeLogits) {
  const int64_t V = 4096, D = 512;
  std::mt19937 rng(5);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<uint16_t> w(size_t(V * D));
  for (auto& v : w) v = f32_to_bf16(n01(rng) / std::sqrt(float(D)));
  MatrixView head;
  head.format = WeightFormat::BF16;
  head.rows = V;
  head.cols = D;
  head.data = w.data();
  const quant::QuantizedMatrix q4 = quant::quantize_matrix(head, quant::QuantFormat::INT4);
  const MatrixView h4 = q4.view();
  cpu::Context ctx;
  auto agreement = [&](float beta, double* mean_p) {
    const int rows = 300;
    std::vector<float> x(size_t(rows * D)), a(size_t(rows * V)), b(size_t(rows * V)), wt(static_cast<size_t>(D));
    for (int r = 0; r < rows; ++r) {
      const int64_t t = int64_t(rng() % uint32_t(V));
      head.dequant_row(t, wt.data());
      for (int64_t d = 0; d < D; ++d) x[size_t(r * D + d)] = beta * wt[size_t(d)] * std::sqrt(float(D)) + n01(rng);
    }
    cpu::matmul(ctx, x.data(), rows, head, a.data());
    cpu::matmul(ctx, x.data(), rows, h4, b.data());
    int same = 0;
    double psum = 0;
    for (int r = 0; r < rows; ++r) {
      const float* ra = a.data() + r * V;
      const float* rb = b.data() + r * V;
      const int64_t ia = std::max_element(ra, ra + V) - ra, ib = std::max_element(rb, rb + V) - rb;
      same += ia == ib;
      double z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp(double(ra[v] - ra[ia]));
      psum += 1.0 / z;
    }
    *mean_p = psum / rows;
    return double(same) / rows;
  };
  double p_trained = 0, p_noise = 0;
  const double trained = agreement(0.45f, &p_trained), noise = agreement(0.0f, &p_noise);
  EXPECT_GT(p_trained, 0.5) << "the rows meant to look trained";
  EXPECT_LT(p_noise, 0.05);
  EXPECT_GE(trained, 0.98) << "top-1 probability " << p_trained;
  EXPECT_LT(noise, trained);
  std::printf("INT4 draft head: argmax agreement %.3f on trained-like rows (top-1 probability %.2f), %.3f on noise rows\n",
              trained, p_trained, noise);
}

// ---- preemption ----

// Speculating sequences that outgrow a small pool are preempted and recompute: each gives its
// MTP cache back in the step that preempts it, and every request still gets the tokens it gets
// alone.
TEST(Speculative, PreemptedSequencesReleaseTheirMtpCacheAtOnce) {
  Model& m = mtp_model("deepseek-v3-tiny");
  std::vector<Request> reqs;
  for (uint32_t i = 0; i < 4; ++i) reqs.push_back(greedy(prompt_ids(14 + 3 * int(i), 300 + i), 26));
  std::vector<std::vector<int32_t>> alone;
  for (auto& r : reqs) alone.push_back(run(m, options(64, 8, KvDType::F32), r));
  const int64_t pages = 10, ps = 8;  // 80 tokens: two or three of the requests at a time
  auto mtp = std::make_shared<MtpDrafts>(m, pages, ps, KvDType::F32);
  EngineOptions o = options(pages, ps, KvDType::F32, 2, mtp);
  o.prefix_cache = false;
  Engine e(m, nullptr, o);
  std::vector<RequestResult> got(reqs.size());
  std::vector<int64_t> ids;
  for (size_t i = 0; i < reqs.size(); ++i) ids.push_back(e.submit(reqs[i], [&got, i](const RequestEvent& ev) { got[i].add(ev); }));
  int64_t preemptions = 0, checked = 0;
  while (e.step()) {
    const EngineStats st = e.stats();
    if (st.preemptions > preemptions) {
      preemptions = st.preemptions;
      // Whoever holds no pages now (preempted, queued or finished) holds no MTP rows either.
      int64_t held = 0;
      for (int64_t id : ids) {
        if (e.pages_of(id).empty()) {
          EXPECT_EQ(mtp->cached_rows(id), -1) << "request " << id;
          ++checked;
        } else if (mtp->cached_rows(id) > 0) {
          held += pages_for_tokens(mtp->cached_rows(id), ps);
        }
      }
      EXPECT_LE(held, pages - mtp->pool().free_pages());
    }
  }
  EXPECT_GT(preemptions, 0) << "the pool was meant to run short";
  EXPECT_GT(checked, 0);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].tokens, alone[i]) << "request " << i;
  EXPECT_GT(e.stats().spec_steps, 0);
  EXPECT_EQ(mtp->pool().free_pages(), pages) << "every MTP page came back";
}

// `mla run --speculative mtp`: the same text as without it (greedy, fast precision), and the
// acceptance and tokens per step on stderr; a checkpoint without the module is refused.
TEST(Speculative, RunCommandFlags) {
  test::TempDir dir("spec-cli");
  const std::string fx = test::fixture("deepseek-v3-tiny");
  std::filesystem::copy_file(fx + "/config.json", dir / "config.json");
  std::filesystem::copy_file(fx + "/model.safetensors", dir / "model.safetensors");
  Tokenizer::write_byte_level_tokenizer(dir.str(), 512);
  const std::string base = "run -m '" + dir.str() + "' -p 'speculate' -n 40 --temperature 0 --ignore-eos --threads 1";
  const auto plain = test::run_mla(base + " 2>/dev/null", false);
  ASSERT_EQ(plain.status, 0) << plain.output;
  for (const char* k : {"1", "3"}) {
    const auto out = test::run_mla(base + " --speculative mtp --draft-tokens " + std::string(k) + " 2>/dev/null", false);
    ASSERT_EQ(out.status, 0);
    EXPECT_EQ(out.output, plain.output) << "k=" << k;
    const auto err = test::run_mla(base + " --speculative mtp --no-adaptive-speculation --draft-tokens " + std::string(k) + " 2>&1 >/dev/null", false);
    EXPECT_NE(err.output.find("speculative"), std::string::npos) << err.output;
    EXPECT_NE(err.output.find("acceptance"), std::string::npos) << err.output;
    EXPECT_NE(err.output.find("tokens per step"), std::string::npos) << err.output;
  }
  const auto bad = test::run_mla(base + " --speculative mtp --draft-tokens 0", true);
  EXPECT_NE(bad.status, 0);
  const auto none = test::run_mla("run -m '" + test::fixture("kimi-k2-tiny") + "' -p x -n 2 --speculative mtp", true);
  EXPECT_NE(none.status, 0);
}

TEST(Speculative, RefusesAModelWithoutItsMtpModule) {
  auto plain = Model::load(test::fixture("deepseek-v3-tiny"));
  EXPECT_THROW(Engine(*plain, nullptr, options(16, 8, KvDType::F32, 1)), std::invalid_argument);
}

}  // namespace
}  // namespace mla
