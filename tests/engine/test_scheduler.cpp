// Scheduler tests on the deepseek-v3-tiny fixture: concurrent greedy requests give exactly the
// tokens each gives alone (and the Generator gives), also with chunked prefill and staggered
// arrivals; preemption under a tiny pool completes every request with the same tokens; the
// prefix cache shares pages by reference count and changes no output; requests that can never
// run are refused; cancellation returns the pages; the engine thread serves several threads.
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "engine/generator.h"
#include "engine/scheduler.h"
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
    f.dir = std::make_unique<test::TempDir>("sched-tok");
    Tokenizer::write_byte_level_tokenizer(f.dir->str(), 512);
    f.tokenizer = std::make_unique<Tokenizer>(Tokenizer::load(f.dir->str()));
  }
  return f;
}

std::vector<int32_t> prompt_ids(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(int32_t(2 + rng() % 500));
  return ids;
}

ScheduledRequest greedy(std::vector<int32_t> prompt, int64_t max_new) {
  ScheduledRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.max_new_tokens = max_new;
  return r;
}

std::unique_ptr<Scheduler> make_scheduler(int64_t pages, int64_t page_size, SchedulerOptions opt = {},
                                          bool with_tokenizer = false) {
  Fixture& f = fixture();
  return std::make_unique<Scheduler>(*f.model, f.model->make_pool(pages, page_size, KvDType::F32),
                                     with_tokenizer ? f.tokenizer.get() : nullptr, opt);
}

// Collects each request's events.
struct Collector {
  std::map<int64_t, ScheduledResult> results;
  std::map<int64_t, int> finished;
  Scheduler::Callback cb() {
    return [this](const TokenEvent& e) {
      auto& r = results[e.request_id];
      if (e.token >= 0) r.tokens.push_back(e.token);
      r.text += e.text;
      r.prompt_tokens = e.prompt_tokens;
      r.cached_tokens = e.cached_tokens;
      if (e.finished) {
        r.reason = e.reason;
        r.message = e.message;
        ++finished[e.request_id];
      }
    };
  }
};

ScheduledResult run_alone(const ScheduledRequest& req) {
  auto s = make_scheduler(64, 16);
  Collector c;
  int64_t id = s->submit(req, c.cb());
  s->run_until_idle();
  EXPECT_EQ(c.finished[id], 1);
  return c.results[id];
}

std::vector<ScheduledRequest> some_requests() {
  std::vector<ScheduledRequest> reqs;
  const int lens[] = {5, 37, 1, 70, 12, 23};
  const int news[] = {14, 9, 20, 6, 17, 11};
  for (int i = 0; i < 6; ++i) reqs.push_back(greedy(prompt_ids(lens[i], 100 + i), news[i]));
  return reqs;
}

TEST(Scheduler, AloneEqualsGenerator) {
  Fixture& f = fixture();
  auto req = greedy(prompt_ids(30, 7), 12);
  ScheduledResult alone = run_alone(req);
  ASSERT_EQ(alone.tokens.size(), 12u);
  EXPECT_EQ(alone.reason, FinishReason::MaxTokens);
  GeneratorOptions go;
  go.kv_dtype = KvDType::F32;
  Generator g(*f.model, *f.tokenizer, go);
  GenerateParams gp;
  gp.sampling.temperature = 0;
  gp.max_new_tokens = 12;
  EXPECT_EQ(g.generate(req.prompt, gp).tokens, alone.tokens);
}

TEST(Scheduler, ConcurrentGreedyEqualsAlone) {
  auto reqs = some_requests();
  std::vector<ScheduledResult> alone;
  for (auto& r : reqs) alone.push_back(run_alone(r));
  // Small budgets mix prefill chunks with decode tokens in the same passes.
  for (int64_t budget : {512, 16, 3}) {
    SchedulerOptions opt;
    opt.max_batch_tokens = budget;
    auto s = make_scheduler(64, 16, opt);
    Collector c;
    std::vector<int64_t> ids;
    for (size_t i = 0; i < 3; ++i) ids.push_back(s->submit(reqs[i], c.cb()));
    for (int k = 0; k < 4; ++k) s->step();  // the rest arrive while these run
    for (size_t i = 3; i < reqs.size(); ++i) ids.push_back(s->submit(reqs[i], c.cb()));
    s->run_until_idle();
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(c.finished[ids[i]], 1);
      EXPECT_EQ(c.results[ids[i]].tokens, alone[i].tokens) << "request " << i << " budget " << budget;
      EXPECT_EQ(c.results[ids[i]].reason, FinishReason::MaxTokens);
    }
    auto st = s->stats();
    EXPECT_EQ(st.requests_finished, int64_t(reqs.size()));
    EXPECT_EQ(st.running, 0);
    EXPECT_LT(st.steps, 200) << "requests ran side by side";
    EXPECT_EQ(st.kv_pages_free + st.kv_pages_prefix_cache, st.kv_pages_total) << "every page came back";
  }
}

TEST(Scheduler, PreemptionUnderTinyPoolKeepsTokens) {
  std::vector<ScheduledRequest> reqs;
  for (int i = 0; i < 5; ++i) reqs.push_back(greedy(prompt_ids(14 + 3 * i, 200 + i), 30 - 2 * i));
  reqs.push_back(greedy(prompt_ids(70, 210), 6));
  std::vector<ScheduledResult> alone;
  for (auto& r : reqs) alone.push_back(run_alone(r));
  // 10 pages of 8 tokens: the largest request (70 + 6) fits alone; three of the others are
  // admitted together and outgrow the pool as they decode.
  for (bool prefix_cache : {false, true}) {
    SchedulerOptions opt;
    opt.prefix_cache = prefix_cache;
    auto s = make_scheduler(10, 8, opt);
    Collector c;
    std::vector<int64_t> ids;
    for (auto& r : reqs) ids.push_back(s->submit(r, c.cb()));
    s->run_until_idle();
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(c.finished[ids[i]], 1);
      EXPECT_EQ(c.results[ids[i]].tokens, alone[i].tokens) << "request " << i << " prefix cache " << prefix_cache;
    }
    auto st = s->stats();
    EXPECT_GT(st.preemptions, 0) << "the pool was meant to run short";
    EXPECT_EQ(st.kv_pages_free + st.kv_pages_prefix_cache, st.kv_pages_total);
  }
}

TEST(Scheduler, LoneSequenceFillingTheCacheEndsWithLength) {
  auto s = make_scheduler(4, 8);  // 32 tokens
  Collector c;
  int64_t id = s->submit(greedy(prompt_ids(20, 3), 100), c.cb());
  s->run_until_idle();
  EXPECT_EQ(c.finished[id], 1);
  EXPECT_EQ(c.results[id].reason, FinishReason::KvCacheFull);
  EXPECT_STREQ(openai_finish_reason(c.results[id].reason), "length");
  EXPECT_EQ(c.results[id].tokens.size(), 13u) << "20 prompt + 12 generated fill 32 slots; the 13th needs no slot";
}

TEST(Scheduler, PrefixCacheSharesPagesAndKeepsTokens) {
  Fixture& f = fixture();
  const int64_t ps = 4;
  auto base = prompt_ids(22, 11);
  auto a = greedy(base, 6);
  auto b = greedy(base, 9);
  b.prompt.push_back(300);
  b.prompt.push_back(301);
  ScheduledResult b_alone = run_alone(b);
  (void)f;

  auto s = make_scheduler(64, ps);
  Collector c;
  int64_t ida = s->submit(a, c.cb());
  s->step();  // a reads its prompt: its 5 full pages go into the cache
  EXPECT_EQ(s->stats().prefix_cache_entries, 1);
  std::vector<int32_t> pa = s->pages_of(ida);
  ASSERT_GE(pa.size(), 6u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(s->pool().refcount(pa[size_t(i)]), 2) << "page " << i;
  EXPECT_EQ(s->pool().refcount(pa[5]), 1) << "the partial page is a's own";

  int64_t idb = s->submit(b, c.cb());
  s->step();
  std::vector<int32_t> pb = s->pages_of(idb);
  ASSERT_GE(pb.size(), 6u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(pb[size_t(i)], pa[size_t(i)]) << "b shares a's page " << i;
    EXPECT_EQ(s->pool().refcount(pb[size_t(i)]), 3) << "a, b and the cache hold page " << i;
  }
  EXPECT_NE(pb[5], pa[5]);
  s->run_until_idle();
  EXPECT_EQ(c.results[idb].cached_tokens, 20);
  EXPECT_EQ(c.results[idb].tokens, b_alone.tokens);
  EXPECT_EQ(s->stats().prefix_hit_tokens, 20);

  // After both finished, a request repeating a's prompt and output reuses the finished pages.
  auto again = greedy(base, 4);
  again.prompt.insert(again.prompt.end(), c.results[ida].tokens.begin(), c.results[ida].tokens.end());
  ScheduledResult again_alone = run_alone(again);
  int64_t idc = s->submit(again, c.cb());
  s->run_until_idle();
  EXPECT_EQ(c.results[idc].cached_tokens, 24) << "22 + 6 tokens: a's cache held 27, 24 of them on full pages";
  EXPECT_EQ(c.results[idc].tokens, again_alone.tokens);
}

TEST(Scheduler, RefusesRequestsThatCannotRun) {
  auto s = make_scheduler(4, 8);  // 32 tokens
  Collector c;
  EXPECT_THROW(s->submit(greedy(prompt_ids(33, 1), 4), c.cb()), RequestError);
  EXPECT_NO_THROW(s->submit(greedy(prompt_ids(32, 1), 4), c.cb()));
  EXPECT_THROW(s->submit(greedy({}, 4), c.cb()), RequestError);
  EXPECT_THROW(s->submit(greedy({1, 512}, 4), c.cb()), RequestError);
  auto bad = greedy({1, 2}, 4);
  bad.sampling.top_p = 2;
  EXPECT_THROW(s->submit(bad, c.cb()), RequestError);
  auto stop = greedy({1, 2}, 4);
  stop.stop = {"x"};
  EXPECT_THROW(s->submit(stop, c.cb()), RequestError) << "stop strings need a tokenizer";
  // The model's context (256) bounds a request even when the cache is larger.
  auto big = make_scheduler(64, 16);
  try {
    big->submit(greedy(prompt_ids(257, 2), 4), c.cb());
    FAIL() << "no exception";
  } catch (const RequestError& e) {
    EXPECT_NE(std::string(e.what()).find("context of 256"), std::string::npos) << e.what();
  }
}

// Two running sequences cross a page boundary in the same step while a long request waits: the
// admission must leave both pages free (one page in hand is not enough), or the step's forward
// pass finds the cache short and fails every request in the batch.
TEST(Scheduler, AdmissionLeavesThePagesOfTheRunningSequencesStep) {
  SchedulerOptions opt;
  opt.prefix_cache = false;
  auto s = make_scheduler(8, 4, opt);
  Collector c;
  const auto a = greedy(prompt_ids(4, 11), 6), b = greedy(prompt_ids(4, 12), 6), late = greedy(prompt_ids(20, 13), 3);
  const int64_t ia = s->submit(a, c.cb()), ib = s->submit(b, c.cb());
  s->step();  // both prefilled: 4 tokens each on one page, their next token starts a second page
  const int64_t ic = s->submit(late, c.cb());  // 5 pages: fits the 6 free only if the two wait
  s->run_until_idle();
  for (int64_t id : {ia, ib, ic}) EXPECT_NE(c.results[id].reason, FinishReason::Error) << c.results[id].message;
  EXPECT_EQ(c.results[ia].tokens, run_alone(a).tokens);
  EXPECT_EQ(c.results[ib].tokens, run_alone(b).tokens);
  EXPECT_EQ(c.results[ic].tokens, run_alone(late).tokens);
  EXPECT_EQ(s->stats().kv_pages_free, 8);
}

TEST(Scheduler, CancelReturnsPages) {
  SchedulerOptions opt;
  opt.prefix_cache = false;
  auto s = make_scheduler(16, 8, opt);
  Collector c;
  int64_t id = s->submit(greedy(prompt_ids(20, 5), 50), c.cb());
  int64_t queued = s->submit(greedy(prompt_ids(100, 6), 50), c.cb());  // waits: not enough pages
  s->step();
  s->step();
  EXPECT_LT(s->stats().kv_pages_free, 16);
  s->cancel(id);
  s->cancel(queued);
  s->run_until_idle();
  EXPECT_EQ(c.finished[id], 1);
  EXPECT_EQ(c.results[id].reason, FinishReason::Cancelled);
  EXPECT_EQ(c.results[queued].reason, FinishReason::Cancelled);
  EXPECT_EQ(c.results[queued].tokens.size(), 0u);
  EXPECT_EQ(s->stats().kv_pages_free, 16);
}

TEST(Scheduler, TextAndStopStringsMatchGenerator) {
  Fixture& f = fixture();
  auto prompt = f.tokenizer->encode("Hello there, how are you?", true);
  GeneratorOptions go;
  go.kv_dtype = KvDType::F32;
  Generator g(*f.model, *f.tokenizer, go);
  GenerateParams gp;
  gp.sampling.temperature = 0;
  gp.max_new_tokens = 24;
  auto ref = g.generate(prompt, gp);
  ASSERT_FALSE(ref.text.empty());

  auto s = make_scheduler(64, 16, {}, true);
  Collector c;
  auto req = greedy(prompt, 24);
  int64_t id = s->submit(req, c.cb());
  s->run_until_idle();
  EXPECT_EQ(c.results[id].tokens, ref.tokens);
  EXPECT_EQ(c.results[id].text, ref.text);

  // A stop string taken from the middle of the output ends it before that text.
  std::string stop = ref.text.substr(ref.text.size() / 2, 2);
  req.stop = {stop};
  gp.stop = {stop};
  g.clear();
  auto ref_stop = g.generate(prompt, gp);
  int64_t id2 = s->submit(req, c.cb());
  s->run_until_idle();
  EXPECT_EQ(c.results[id2].reason, FinishReason::StopString);
  EXPECT_EQ(c.results[id2].text, ref_stop.text);
  EXPECT_EQ(ref.text.find(stop), c.results[id2].text.size());
}

TEST(Scheduler, EngineThreadServesManyThreads) {
  auto reqs = some_requests();
  std::vector<ScheduledResult> alone;
  for (auto& r : reqs) alone.push_back(run_alone(r));
  SchedulerOptions opt;
  opt.max_batch_tokens = 32;
  auto s = make_scheduler(24, 8, opt);
  s->start();
  std::vector<ScheduledResult> got(reqs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i) threads.emplace_back([&, i] { got[i] = s->generate(reqs[i]); });
  for (auto& t : threads) t.join();
  s->stop();
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].tokens, alone[i].tokens) << "request " << i << " reason " << finish_reason_name(got[i].reason) << " " << got[i].message << " alone " << finish_reason_name(alone[i].reason);
  EXPECT_EQ(s->stats().requests_finished, int64_t(reqs.size()));
}

}  // namespace
}  // namespace mla
