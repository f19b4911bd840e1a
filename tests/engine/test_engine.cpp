// Engine tests on the deepseek-v3-tiny fixture (context 256, 512 logit rows) with a byte-level
// tokenizer: greedy tokens equal the fixture's HuggingFace continuation; every stop condition
// (EOS, stop string across tokens, max tokens, context, full cache) ends the output as
// defined; a chat-like second request reuses the first's full pages and computes only the
// rest; concurrent greedy requests give exactly the tokens each gives alone (also with chunked
// prefill, staggered arrivals, preemption under a tiny pool and the engine thread); the prefix
// cache shares pages by reference count and changes no output; requests that can never run are
// refused; cancellation returns the pages; ids without a token are never sampled; and one bad
// sequence ends alone while the rest of its batch goes on.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <thread>

#include "engine/engine.h"
#include "engine/test_requests.h"
#include "kv/page_hash.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace mla {
namespace {

struct Fixture {
  std::unique_ptr<Model> model;
  std::unique_ptr<test::TempDir> dir;
  std::unique_ptr<Tokenizer> tokenizer;
};

Fixture& fixture() {
  static Fixture f;
  if (!f.model) {
    f.model = Model::load(test::fixture("deepseek-v3-tiny"));
    f.dir = std::make_unique<test::TempDir>("engine-tok");
    Tokenizer::write_byte_level_tokenizer(f.dir->str(), 512);
    f.tokenizer = std::make_unique<Tokenizer>(Tokenizer::load(f.dir->str()));
  }
  return f;
}

using test::greedy;
using test::pool_of;
using test::prompt_ids;

std::unique_ptr<Engine> make_engine(EngineOptions opt, bool with_tokenizer = false) {
  Fixture& f = fixture();
  return std::make_unique<Engine>(*f.model, with_tokenizer ? f.tokenizer.get() : nullptr, opt);
}

// Collects each request's events.
struct Collector {
  std::map<int64_t, RequestResult> results;
  std::map<int64_t, int> finished;
  Engine::Callback cb() {
    return [this](const RequestEvent& e) {
      results[e.request_id].add(e);
      if (e.finished) ++finished[e.request_id];
    };
  }
};

RequestResult run_alone(const Request& req, bool with_tokenizer = false) {
  auto e = make_engine(pool_of(64, 16), with_tokenizer);
  return e->generate(req);
}

std::vector<Request> some_requests() {
  std::vector<Request> reqs;
  const int lens[] = {5, 37, 1, 70, 12, 23};
  const int news[] = {14, 9, 20, 6, 17, 11};
  for (int i = 0; i < 6; ++i) reqs.push_back(greedy(prompt_ids(lens[i], 100 + i), news[i]));
  return reqs;
}

// ---- one sequence ----

TEST(Engine, GreedyMatchesHuggingFaceContinuation) {
  Fixture& f = fixture();
  SafetensorsFile golden(test::fixture("deepseek-v3-tiny") + "/golden.safetensors");
  for (int j = 0; j < 3; ++j) {
    const int64_t T = test::read_ids(*golden.find("seq" + std::to_string(j) + "_prompt"))[0];
    auto ids = test::read_ids(*golden.find("seq" + std::to_string(j) + "_ids"));
    std::vector<int32_t> prompt(ids.begin(), ids.begin() + T), expected(ids.begin() + T, ids.end());
    auto e = make_engine(pool_of(16, 64), true);
    auto r = e->generate(greedy(prompt, int64_t(expected.size())));  // no EOS ids: HF generated 8 tokens
    EXPECT_EQ(r.tokens, expected) << "sequence " << j;
    EXPECT_EQ(r.reason, FinishReason::MaxTokens);
    EXPECT_EQ(r.prompt_tokens, T);
    EXPECT_EQ(r.decode_steps(), int64_t(expected.size()) - 1) << "the last token is sampled, not fed";
    EXPECT_EQ(r.text, f.tokenizer->decode(expected, true));
  }
}

TEST(Engine, StreamsTheTextAndReportsFigures) {
  Fixture& f = fixture();
  auto e = make_engine(pool_of(4, 64, KvDType::BF16), true);
  std::string streamed;
  int with_text = 0;
  auto r = e->generate(greedy(f.tokenizer->encode("The cache keeps", true), 12), [&](const RequestEvent& ev) {
    streamed += ev.text;
    with_text += !ev.text.empty();
  });
  EXPECT_EQ(streamed, r.text);
  EXPECT_GT(with_text, 1) << "text arrives token by token";
  EXPECT_EQ(r.tokens.size(), 12u);
  EXPECT_GT(r.prompt_tokens_per_second(), 0);
  EXPECT_GT(r.generated_tokens_per_second(), 0);
  const auto& c = f.model->config();
  EXPECT_EQ(e->pool().bytes_per_token(), c.num_hidden_layers * (c.kv_lora_rank + c.qk_rope_head_dim) * 2)
      << "bf16 latent rows, all layers";
}

// A chat turn: everything so far plus new text. The first turn's full pages come from the
// prefix cache; only the rest (the partial last page and the new tokens) is computed.
TEST(Engine, NextTurnComputesOnlyItsNewTokensAndAPartialPage) {
  Fixture& f = fixture();
  const int64_t ps = 16;
  auto prompt = prompt_ids(40, 17);
  auto e = make_engine(pool_of(16, ps), true);
  auto first = e->generate(greedy(prompt, 6));
  ASSERT_EQ(first.tokens.size(), 6u);
  std::vector<int32_t> next = prompt;
  next.insert(next.end(), first.tokens.begin(), first.tokens.end());
  auto more = f.tokenizer->encode(" look at", false);
  next.insert(next.end(), more.begin(), more.end());
  const int64_t held = int64_t(prompt.size()) + 5;  // the last sampled token was never fed
  const int64_t computed_before = e->stats().computed_tokens;
  auto second = e->generate(greedy(next, 6));
  EXPECT_EQ(second.cached_tokens, held / ps * ps) << "the first turn's full pages";
  EXPECT_GT(second.cached_tokens, 0);
  EXPECT_EQ(second.computed_prompt_tokens(), int64_t(next.size()) - second.cached_tokens);
  EXPECT_LT(int64_t(next.size()) - second.cached_tokens, int64_t(next.size()) - held + ps)
      << "new tokens plus at most a partial page";
  EXPECT_EQ(e->stats().computed_tokens - computed_before, second.computed_prompt_tokens() + 5)
      << "the prompt's computed tokens, then one per decoded token";
  auto ref = run_alone(greedy(next, 6), true);
  EXPECT_EQ(ref.cached_tokens, 0);
  EXPECT_EQ(second.tokens, ref.tokens) << "a shared prefix continues as a fresh prefill";
  // A prompt that diverges after the first page shares just that page.
  std::vector<int32_t> other(prompt.begin(), prompt.begin() + 20);
  other.push_back(prompt[20] == 65 ? 66 : 65);
  auto third = e->generate(greedy(other, 3));
  EXPECT_EQ(third.cached_tokens, 16);
  EXPECT_EQ(third.tokens, run_alone(greedy(other, 3)).tokens);
}

TEST(Engine, StopsOnEos) {
  Fixture& f = fixture();
  auto prompt = f.tokenizer->encode("Hello", true);
  auto free_run = run_alone(greedy(prompt, 8), true);
  ASSERT_EQ(free_run.tokens.size(), 8u);
  // Make the third greedy token an EOS id: the output stops at its first occurrence, without it.
  auto req = greedy(prompt, 8);
  req.eos_token_ids = {free_run.tokens[2]};
  auto r = run_alone(req, true);
  EXPECT_EQ(r.reason, FinishReason::Eos);
  size_t first = size_t(std::find(free_run.tokens.begin(), free_run.tokens.end(), free_run.tokens[2]) -
                        free_run.tokens.begin());
  ASSERT_EQ(r.tokens.size(), first + 1);
  std::vector<int32_t> before(free_run.tokens.begin(), free_run.tokens.begin() + long(first));
  EXPECT_EQ(r.text, f.tokenizer->decode(before, true));
}

TEST(Engine, StopStringAcrossTokens) {
  Fixture& f = fixture();
  auto prompt = f.tokenizer->encode("for (int i = 0;", true);
  auto free_run = run_alone(greedy(prompt, 24), true);
  // A stop string made of the end of one token's text and the start of the next (ASCII there).
  std::vector<std::string> pieces;
  for (int32_t id : free_run.tokens) pieces.push_back(f.tokenizer->decode({id}, true));
  auto ascii = [](char c) { return static_cast<unsigned char>(c) < 0x80; };
  std::string stop;
  for (size_t i = 1; i + 2 < pieces.size() && stop.empty(); ++i)
    if (!pieces[i].empty() && !pieces[i + 1].empty() && ascii(pieces[i].back()) && ascii(pieces[i + 1][0]))
      stop = std::string(1, pieces[i].back()) + pieces[i + 1][0];
  ASSERT_FALSE(stop.empty()) << "the output has two adjacent tokens with ASCII at their boundary";
  const std::string& full = free_run.text;
  ASSERT_NE(full.find(stop), std::string::npos);
  auto req = greedy(prompt, 24);
  req.stop = {stop};
  std::string streamed;
  auto e = make_engine(pool_of(64, 16), true);
  auto r = e->generate(req, [&](const RequestEvent& ev) { streamed += ev.text; });
  EXPECT_EQ(r.reason, FinishReason::StopString);
  EXPECT_EQ(r.text, full.substr(0, full.find(stop)));
  EXPECT_EQ(streamed, r.text) << "the stop text never reaches the callback";
  EXPECT_LT(r.tokens.size(), free_run.tokens.size());
}

TEST(Engine, MaxTokensAndContext) {
  auto e = make_engine(pool_of(64, 16));
  auto prompt = prompt_ids(9, 4);
  auto r = e->generate(greedy(prompt, 5));
  EXPECT_EQ(r.reason, FinishReason::MaxTokens);
  EXPECT_EQ(r.tokens.size(), 5u);
  auto zero = e->generate(greedy(prompt, 0));
  EXPECT_EQ(zero.tokens.size(), 0u);
  EXPECT_EQ(zero.reason, FinishReason::MaxTokens);
  // The fixture's context is max_position_embeddings = 256 tokens.
  const int64_t ctx = fixture().model->config().max_position_embeddings;
  std::vector<int32_t> long_prompt(size_t(ctx - 3), 65);
  auto c = e->generate(greedy(long_prompt, -1));
  EXPECT_EQ(c.reason, FinishReason::ContextLength);
  EXPECT_EQ(int64_t(long_prompt.size() + c.tokens.size()), ctx + 1) << "positions 0..ctx-1 fed, one more sampled";
  EXPECT_THROW(e->generate(greedy(std::vector<int32_t>(size_t(ctx + 1), 65), 4)), RequestError);
}

TEST(Engine, FullKvCacheEndsCleanly) {
  Fixture& f = fixture();
  const auto& c = f.model->config();
  // The one budget rule: 1.5 pages' worth of bytes is one page of 16 tokens.
  const double budget =
      double(latent_row_bytes(c.kv_lora_rank, c.qk_rope_head_dim, KvDType::BF16)) * c.num_hidden_layers * 16 * 1.5;
  EngineOptions o = pool_of(kv_cache_pages(c, budget, 16, KvDType::BF16), 16, KvDType::BF16);
  auto e = make_engine(o, true);
  ASSERT_EQ(e->capacity_tokens(), 16);
  std::vector<int32_t> prompt(10, 70);
  auto r = e->generate(greedy(prompt, 50));
  EXPECT_EQ(r.reason, FinishReason::KvCacheFull);
  EXPECT_EQ(r.tokens.size(), 7u) << "16 cached tokens: 10 prompt + 6 fed outputs, a 7th sampled";
  EXPECT_NE(r.message.find("KV cache"), std::string::npos) << r.message;
  EXPECT_EQ(r.text, f.tokenizer->decode(r.tokens, true)) << "the end flush ran";
  EXPECT_THROW(e->generate(greedy(std::vector<int32_t>(40, 70), 5)), RequestError);
  // The cache is still usable after both.
  EXPECT_EQ(e->generate(greedy(prompt, 3)).reason, FinishReason::MaxTokens);
}

TEST(Engine, KvBudgetRule) {
  const auto& c = fixture().model->config();
  const int64_t page_bytes = latent_row_bytes(c.kv_lora_rank, c.qk_rope_head_dim, KvDType::BF16) *
                             c.num_hidden_layers * 64;
  EXPECT_EQ(kv_cache_pages(c, double(page_bytes) * 3.5, 64, KvDType::BF16), 3);
  EXPECT_EQ(kv_cache_pages(c, 0, 64, KvDType::BF16), 4) << "one context of 256 tokens";
  EXPECT_EQ(kv_cache_pages(c, 0, 64, KvDType::BF16, 8), 32) << "eight contexts";
  EXPECT_THROW(kv_cache_pages(c, double(page_bytes) / 2, 64, KvDType::BF16), std::invalid_argument);
  EXPECT_THROW(kv_cache_pages(c, -1, 64, KvDType::BF16), std::invalid_argument);
  EXPECT_THROW(kv_cache_pages(c, 0, 0, KvDType::BF16), std::invalid_argument);
}

TEST(Engine, SeededSamplingReproduces) {
  Fixture& f = fixture();
  Request req;
  req.prompt = f.tokenizer->encode("The sea is", true);
  req.sampling.temperature = 1.0f;
  req.sampling.top_p = 0.95f;
  req.sampling.seed = 77;
  req.max_new_tokens = 16;
  auto a = run_alone(req, true), b = run_alone(req, true);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.tokens.size(), 16u);
}

TEST(Engine, RefusesRequestsThatCannotRun) {
  auto e = make_engine(pool_of(4, 8));  // 32 tokens
  Collector c;
  EXPECT_THROW(e->submit(greedy(prompt_ids(33, 1), 4), c.cb()), RequestError);
  EXPECT_NO_THROW(e->submit(greedy(prompt_ids(32, 1), 4), c.cb()));
  EXPECT_THROW(e->submit(greedy({}, 4), c.cb()), RequestError);
  EXPECT_THROW(e->submit(greedy({1, 512}, 4), c.cb()), RequestError);
  EXPECT_THROW(e->submit(greedy({5000}, 4), c.cb()), RequestError);
  auto bad = greedy({1, 2}, 4);
  bad.sampling.top_p = 2;
  EXPECT_THROW(e->submit(bad, c.cb()), RequestError);
  auto stop = greedy({1, 2}, 4);
  stop.stop = {"x"};
  EXPECT_THROW(e->submit(stop, c.cb()), RequestError) << "stop strings need a tokenizer";
  // The model's context (256) bounds a request even when the cache is larger.
  auto big = make_engine(pool_of(64, 16));
  try {
    big->submit(greedy(prompt_ids(257, 2), 4), c.cb());
    FAIL() << "no exception";
  } catch (const RequestError& err) {
    EXPECT_NE(std::string(err.what()).find("context of 256"), std::string::npos) << err.what();
  }
}

// ---- many sequences ----

TEST(Engine, ConcurrentGreedyEqualsAlone) {
  auto reqs = some_requests();
  std::vector<RequestResult> alone;
  for (auto& r : reqs) alone.push_back(run_alone(r));
  // Small budgets mix prefill chunks with decode tokens in the same passes; a small chunk_depth
  // shrinks the chunks that share a pass with decode tokens (scheduler.h).
  for (auto [budget, chunk_depth] : {std::pair<int64_t, int64_t>{512, 16384}, {16, 16384}, {3, 16384}, {512, 4}}) {
    EngineOptions opt = pool_of(64, 16);
    opt.max_batch_tokens = budget;
    opt.chunk_depth = chunk_depth;
    auto e = make_engine(opt);
    Collector c;
    std::vector<int64_t> ids;
    for (size_t i = 0; i < 3; ++i) ids.push_back(e->submit(reqs[i], c.cb()));
    for (int k = 0; k < 4; ++k) e->step();  // the rest arrive while these run
    for (size_t i = 3; i < reqs.size(); ++i) ids.push_back(e->submit(reqs[i], c.cb()));
    e->run_until_idle();
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(c.finished[ids[i]], 1);
      EXPECT_EQ(c.results[ids[i]].tokens, alone[i].tokens) << "request " << i << " budget " << budget << " depth "
                                                           << chunk_depth;
      EXPECT_EQ(c.results[ids[i]].reason, FinishReason::MaxTokens);
    }
    auto st = e->stats();
    EXPECT_EQ(st.requests_finished, int64_t(reqs.size()));
    EXPECT_EQ(st.running, 0);
    EXPECT_LT(st.steps, 200) << "requests ran side by side";
    EXPECT_GT(st.step_seconds, 0);
    EXPECT_GT(st.decode_step_seconds_max, 0);
    EXPECT_LE(st.decode_step_seconds_max, st.step_seconds);
    EXPECT_EQ(st.kv_pages_free + st.kv_pages_prefix_cache, st.kv_pages_total) << "every page came back";
  }
}

TEST(Engine, PreemptionUnderTinyPoolKeepsTokens) {
  std::vector<Request> reqs;
  for (int i = 0; i < 5; ++i) reqs.push_back(greedy(prompt_ids(14 + 3 * i, 200 + i), 30 - 2 * i));
  reqs.push_back(greedy(prompt_ids(70, 210), 6));
  std::vector<RequestResult> alone;
  for (auto& r : reqs) alone.push_back(run_alone(r));
  // 10 pages of 8 tokens: the largest request (70 + 6) fits alone; three of the others are
  // admitted together and outgrow the pool as they decode.
  for (bool prefix_cache : {false, true}) {
    EngineOptions opt = pool_of(10, 8);
    opt.prefix_cache = prefix_cache;
    auto e = make_engine(opt);
    Collector c;
    std::vector<int64_t> ids;
    for (auto& r : reqs) ids.push_back(e->submit(r, c.cb()));
    e->run_until_idle();
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(c.finished[ids[i]], 1);
      EXPECT_EQ(c.results[ids[i]].tokens, alone[i].tokens) << "request " << i << " prefix cache " << prefix_cache;
    }
    auto st = e->stats();
    EXPECT_GT(st.preemptions, 0) << "the pool was meant to run short";
    EXPECT_EQ(st.kv_pages_free + st.kv_pages_prefix_cache, st.kv_pages_total);
  }
}

TEST(Engine, LoneSequenceFillingTheCacheEndsWithKvCacheFull) {
  auto e = make_engine(pool_of(4, 8));  // 32 tokens
  auto r = e->generate(greedy(prompt_ids(20, 3), 100));
  EXPECT_EQ(r.reason, FinishReason::KvCacheFull);
  EXPECT_EQ(r.tokens.size(), 13u) << "20 prompt + 12 generated fill 32 slots; the 13th needs no slot";
}

TEST(Engine, PrefixCacheSharesPagesAndKeepsTokens) {
  const int64_t ps = 4;
  auto base = prompt_ids(22, 11);
  auto a = greedy(base, 6);
  auto b = greedy(base, 9);
  b.prompt.push_back(300);
  b.prompt.push_back(301);
  RequestResult b_alone = run_alone(b);

  auto e = make_engine(pool_of(64, ps));
  Collector c;
  int64_t ida = e->submit(a, c.cb());
  e->step();  // a reads its prompt: its 5 full pages go into the cache
  EXPECT_EQ(e->stats().prefix_cache_entries, 5) << "the cache holds pages: a's five full ones";
  std::vector<int32_t> pa = e->pages_of(ida);
  ASSERT_GE(pa.size(), 6u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(e->pool().refcount(pa[size_t(i)]), 2) << "page " << i;
  EXPECT_EQ(e->pool().refcount(pa[5]), 1) << "the partial page is a's own";

  int64_t idb = e->submit(b, c.cb());
  e->step();
  std::vector<int32_t> pb = e->pages_of(idb);
  ASSERT_GE(pb.size(), 6u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(pb[size_t(i)], pa[size_t(i)]) << "b shares a's page " << i;
    EXPECT_EQ(e->pool().refcount(pb[size_t(i)]), 3) << "a, b and the cache hold page " << i;
  }
  EXPECT_NE(pb[5], pa[5]);
  e->run_until_idle();
  EXPECT_EQ(c.results[idb].cached_tokens, 20);
  EXPECT_EQ(c.results[idb].tokens, b_alone.tokens);
  EXPECT_EQ(e->stats().prefix_hit_tokens, 20);

  // After both finished, a request repeating a's prompt and output reuses the finished pages.
  auto again = greedy(base, 4);
  again.prompt.insert(again.prompt.end(), c.results[ida].tokens.begin(), c.results[ida].tokens.end());
  RequestResult again_alone = run_alone(again);
  int64_t idc = e->submit(again, c.cb());
  e->run_until_idle();
  EXPECT_EQ(c.results[idc].cached_tokens, 24) << "22 + 6 tokens: a's cache held 27, 24 of them on full pages";
  EXPECT_EQ(c.results[idc].tokens, again_alone.tokens);
}

// The prompt cache's RAM and disk tiers under the engine: a prompt whose pages were pushed out
// of the pool into RAM, and the same prompt in a new engine reading them from disk (a restart),
// give the tokens a cold start gives, and report the tokens they took from each tier.
TEST(Engine, PromptCacheTiersGiveTheOutputOfAColdStart) {
  test::TempDir dir("engine-tiers");
  const Request req = greedy(prompt_ids(70, 7), 8);
  const RequestResult cold = run_alone(req);
  EngineOptions opt = pool_of(12, 8);  // 96 tokens: another request pushes req's pages out
  opt.prefix_tiers.ram_bytes = int64_t(1) << 20;
  opt.prefix_tiers.disk_dir = dir.str();
  opt.prefix_tiers.disk_bytes = int64_t(1) << 30;
  opt.prefix_tiers.fingerprint = Digest().add("deepseek-v3-tiny").finish();
  {
    auto e = make_engine(opt);
    EXPECT_EQ(e->generate(req).tokens, cold.tokens);
    EXPECT_EQ(e->generate(greedy(prompt_ids(80, 300), 4)).reason, FinishReason::MaxTokens);
    const RequestResult from_ram = e->generate(req);
    EXPECT_EQ(from_ram.tokens, cold.tokens);
    EXPECT_EQ(from_ram.cached_tokens, 64) << "69 tokens may come from the cache: 8 full pages";
    EXPECT_GT(e->stats().prefix.hit_tokens[int(CacheTier::Ram)], 0) << "the pool gave the pages up to RAM";
    e->flush_prompt_cache();
  }
  opt.prefix_tiers.ram_bytes = 0;
  auto e = make_engine(opt);
  const RequestResult from_disk = e->generate(req);
  EXPECT_EQ(from_disk.tokens, cold.tokens);
  EXPECT_EQ(from_disk.cached_tokens, 64);
  EXPECT_EQ(e->stats().prefix.hit_tokens[int(CacheTier::Disk)], 64);
}

// Two running sequences cross a page boundary in the same step while a long request waits: the
// admission must leave both pages free (one page in hand is not enough), or the step's forward
// pass finds the cache short and fails every request in the batch.
TEST(Engine, AdmissionLeavesThePagesOfTheRunningSequencesStep) {
  EngineOptions opt = pool_of(8, 4);
  opt.prefix_cache = false;
  auto e = make_engine(opt);
  Collector c;
  const auto a = greedy(prompt_ids(4, 11), 6), b = greedy(prompt_ids(4, 12), 6), late = greedy(prompt_ids(20, 13), 3);
  const int64_t ia = e->submit(a, c.cb()), ib = e->submit(b, c.cb());
  e->step();  // both prefilled: 4 tokens each on one page, their next token starts a second page
  const int64_t ic = e->submit(late, c.cb());  // 5 pages: fits the 6 free only if the two wait
  e->run_until_idle();
  for (int64_t id : {ia, ib, ic}) EXPECT_NE(c.results[id].reason, FinishReason::Error) << c.results[id].message;
  EXPECT_EQ(c.results[ia].tokens, run_alone(a).tokens);
  EXPECT_EQ(c.results[ib].tokens, run_alone(b).tokens);
  EXPECT_EQ(c.results[ic].tokens, run_alone(late).tokens);
  EXPECT_EQ(e->stats().kv_pages_free, 8);
}

TEST(Engine, CancelReturnsPages) {
  EngineOptions opt = pool_of(16, 8);
  opt.prefix_cache = false;
  auto e = make_engine(opt);
  Collector c;
  int64_t id = e->submit(greedy(prompt_ids(20, 5), 50), c.cb());
  int64_t queued = e->submit(greedy(prompt_ids(100, 6), 50), c.cb());  // waits: not enough pages
  e->step();
  e->step();
  EXPECT_LT(e->stats().kv_pages_free, 16);
  e->cancel(id);
  e->cancel(queued);
  e->step();  // one step ends both
  EXPECT_EQ(c.finished[id], 1);
  EXPECT_EQ(c.results[id].reason, FinishReason::Cancelled);
  EXPECT_EQ(c.results[queued].reason, FinishReason::Cancelled);
  EXPECT_EQ(c.results[queued].tokens.size(), 0u);
  EXPECT_EQ(e->stats().kv_pages_free, 16);
  EXPECT_EQ(e->stats().requests_cancelled, 2);
  EXPECT_FALSE(e->step()) << "nothing left";
}

TEST(Engine, BatchedTextAndStopStringsEqualAlone) {
  Fixture& f = fixture();
  auto prompt = f.tokenizer->encode("Hello there, how are you?", true);
  auto ref = run_alone(greedy(prompt, 24), true);
  ASSERT_FALSE(ref.text.empty());
  std::string stop = ref.text.substr(ref.text.size() / 2, 2);
  auto with_stop = greedy(prompt, 24);
  with_stop.stop = {stop};
  auto ref_stop = run_alone(with_stop, true);
  EXPECT_EQ(ref_stop.reason, FinishReason::StopString);
  EXPECT_EQ(ref_stop.text.size(), ref.text.find(stop));

  // The same two requests beside others, in small chunks.
  EngineOptions opt = pool_of(64, 16);
  opt.max_batch_tokens = 8;
  auto e = make_engine(opt, true);
  Collector c;
  std::vector<int64_t> others;
  for (auto& r : some_requests()) others.push_back(e->submit(r, c.cb()));
  int64_t id = e->submit(greedy(prompt, 24), c.cb());
  int64_t id2 = e->submit(with_stop, c.cb());
  e->run_until_idle();
  EXPECT_EQ(c.results[id].tokens, ref.tokens);
  EXPECT_EQ(c.results[id].text, ref.text);
  EXPECT_EQ(c.results[id2].reason, FinishReason::StopString);
  EXPECT_EQ(c.results[id2].text, ref_stop.text);
  for (int64_t o : others) EXPECT_EQ(c.finished[o], 1);
}

TEST(Engine, EngineThreadServesManyThreads) {
  auto reqs = some_requests();
  std::vector<RequestResult> alone;
  for (auto& r : reqs) alone.push_back(run_alone(r));
  EngineOptions opt = pool_of(24, 8);
  opt.max_batch_tokens = 32;
  auto e = make_engine(opt);
  e->start();
  std::vector<RequestResult> got(reqs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i) threads.emplace_back([&, i] { got[i] = e->generate(reqs[i]); });
  for (auto& t : threads) t.join();
  e->stop();
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(got[i].tokens, alone[i].tokens) << "request " << i << " " << finish_reason_name(got[i].reason) << " "
                                              << got[i].message;
  EXPECT_EQ(e->stats().requests_finished, int64_t(reqs.size()));
}

// ---- the vocabulary gap and per-sequence errors ----

// A tokenizer of 300 ids under the model's 512 logit rows (DeepSeek-V3: 128,815 under 129,280).
// A processor pushes a gap id to the top: the engine masks the gap after it, so with the
// tokenizer no gap id is ever sampled; without one the push wins (the processor works).
TEST(Engine, IdsWithoutATokenAreNeverSampled) {
  Fixture& f = fixture();
  test::TempDir dir("engine-small-tok");
  Tokenizer::write_byte_level_tokenizer(dir.str(), 300);
  Tokenizer small = Tokenizer::load(dir.str());
  ASSERT_EQ(small.vocab_size(), 300u);
  auto push_gap = [](std::span<float> logits, std::span<const int32_t>) { logits[400] = 1e6f; };
  for (float temperature : {0.0f, 1.0f}) {
    Request req = greedy(prompt_ids(6, 9), 12);
    req.sampling.temperature = temperature;
    req.sampling.seed = 5;
    req.logits_processor = push_gap;
    Engine with(*f.model, &small, pool_of(8, 16));
    auto r = with.generate(req);
    EXPECT_EQ(r.reason, FinishReason::MaxTokens) << r.message;
    ASSERT_EQ(r.tokens.size(), 12u);
    for (int32_t id : r.tokens) EXPECT_LT(id, 300) << "temperature " << temperature;
    EXPECT_EQ(r.text, small.decode(r.tokens, true));
    Engine without(*f.model, nullptr, pool_of(8, 16));
    auto raw = without.generate(req);
    ASSERT_FALSE(raw.tokens.empty());
    EXPECT_EQ(raw.tokens[0], 400);
  }
}

// One sequence's sampling fails (its logits turn NaN at its third token); it ends with Error
// and the others in the same batches finish with the tokens they give alone.
TEST(Engine, OneBadSequenceDoesNotFailTheBatch) {
  auto reqs = some_requests();
  std::vector<RequestResult> alone;
  for (auto& r : reqs) alone.push_back(run_alone(r));
  Request bad = greedy(prompt_ids(10, 77), 20);
  auto calls = std::make_shared<int>(0);
  bad.logits_processor = [calls](std::span<float> logits, std::span<const int32_t>) {
    if (++*calls == 3) std::fill(logits.begin(), logits.end(), std::nanf(""));
  };
  auto e = make_engine(pool_of(64, 16), true);
  Collector c;
  std::vector<int64_t> ids;
  for (size_t i = 0; i < 3; ++i) ids.push_back(e->submit(reqs[i], c.cb()));
  const int64_t bad_id = e->submit(bad, c.cb());
  for (size_t i = 3; i < reqs.size(); ++i) ids.push_back(e->submit(reqs[i], c.cb()));
  e->run_until_idle();
  EXPECT_EQ(c.finished[bad_id], 1);
  EXPECT_EQ(c.results[bad_id].reason, FinishReason::Error);
  EXPECT_NE(c.results[bad_id].message.find("sampling failed"), std::string::npos) << c.results[bad_id].message;
  EXPECT_EQ(c.results[bad_id].tokens.size(), 2u);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(c.results[ids[i]].reason, FinishReason::MaxTokens) << c.results[ids[i]].message;
    EXPECT_EQ(c.results[ids[i]].tokens, alone[i].tokens) << "request " << i;
  }
  auto st = e->stats();
  EXPECT_EQ(st.kv_pages_free + st.kv_pages_prefix_cache, st.kv_pages_total) << "the bad sequence's pages came back";
}

}  // namespace
}  // namespace mla
