// Lockstep replay (engine/lockstep.h) in one process: rank 0's Engine with a Leader and a
// follower running follow() on a thread, over a loopback pair of ranks whose broadcasts go
// through a queue. The follower's pool must end up holding, byte for byte, what the engine's
// holds (every pass replayed, chunked prefill and shared prefixes included); heartbeats keep an
// idle follower waiting, silence ends it at the timeout; a failed collective ends every request.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "engine/lockstep.h"
#include "engine/test_requests.h"
#include "test_util.h"

namespace mla {
namespace {

using test::greedy;
using test::prompt_ids;

// Rank 0's broadcasts, queued for rank 1. Rank 0 can be told to fail its n-th broadcast.
struct Wire {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> messages;
  int64_t sent = 0, fail_at = -1;
};

class LoopbackComm final : public parallel::Comm {
 public:
  LoopbackComm(std::shared_ptr<Wire> wire, int rank) : wire_(std::move(wire)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  void allgather(const void*, size_t, void*) override { throw std::logic_error("no allgather in these tests"); }
  void broadcast(void* buf, size_t bytes, int root) override {
    EXPECT_EQ(root, 0);
    std::unique_lock lk(wire_->mu);
    if (rank_ == 0) {
      if (wire_->sent++ == wire_->fail_at) throw parallel::CommError("rank 1 did not answer (test)");
      wire_->messages.emplace_back(static_cast<const char*>(buf), bytes);
      wire_->cv.notify_all();
      return;
    }
    auto arrived = [&] { return !wire_->messages.empty() || interrupted_; };
    if (timeout_ > 0 ? !wire_->cv.wait_for(lk, std::chrono::duration<double>(timeout_), arrived)
                     : (wire_->cv.wait(lk, arrived), false))
      throw parallel::CommError("rank 0 sent nothing within the timeout");
    if (interrupted_) throw parallel::CommError("interrupted");
    ASSERT_EQ(wire_->messages.front().size(), bytes);
    std::memcpy(buf, wire_->messages.front().data(), bytes);
    wire_->messages.pop_front();
  }
  void broadcast_idle(void* buf, size_t bytes, int root) override { broadcast(buf, bytes, root); }
  void barrier() override {}
  [[noreturn]] void abort(int) override { std::abort(); }

 private:
  std::shared_ptr<Wire> wire_;
  int rank_;
};

struct Ranks {
  std::shared_ptr<Wire> wire = std::make_shared<Wire>();
  LoopbackComm zero{wire, 0}, one{wire, 1};
};

// follow() on a thread of its own over `pool`; join() returns its error, if any. On a way out
// of the test that did not join, the object interrupts and joins it.
struct Follower {
  Ranks& ranks;
  std::exception_ptr error;
  std::thread thread;
  Follower(Ranks& r, Model& model, LatentPool& pool) : ranks(r) {
    thread = std::thread([this, &model, &pool] {
      try {
        follow(ranks.one, model, pool);
      } catch (...) {
        error = std::current_exception();
      }
    });
  }
  void join() {
    thread.join();
    if (error) std::rethrow_exception(error);
  }
  ~Follower() {
    if (!thread.joinable()) return;
    ranks.one.interrupt();
    ranks.wire->cv.notify_all();
    thread.join();
  }
};

std::unique_ptr<Model> load_model() { return Model::load(test::fixture("deepseek-v3-tiny")); }

// Every page's bytes, in page order.
std::string pool_bytes(const LatentPool& pool) {
  std::string all(size_t(pool.total_bytes()), '\0');
  for (int32_t p = 0; p < pool.num_pages(); ++p)
    pool.copy_page_out(p, reinterpret_cast<uint8_t*>(all.data()) + size_t(p) * size_t(pool.bytes_per_page()));
  return all;
}

EngineOptions small_engine() {
  EngineOptions eo;
  eo.page_size = 16;
  eo.kv_pages = 48;
  eo.max_batch_tokens = 24;  // prompts are read in chunks, beside decoding sequences
  return eo;
}

TEST(Lockstep, FollowerPoolEqualsTheEnginesPageForPageAndOutputIsUnchanged) {
  auto model = load_model(), follower_model = load_model();
  const std::vector<Request> reqs = {greedy(prompt_ids(70, 1), 6), greedy(prompt_ids(70, 1), 6),  // a shared prefix
                                     greedy(prompt_ids(33, 2), 9), greedy(prompt_ids(5, 3), 12)};
  // The same requests without a listener: the replay must not change what the engine does.
  std::vector<RequestResult> alone;
  {
    Engine plain(*model, nullptr, small_engine());
    for (const Request& r : reqs) alone.push_back(plain.generate(r));
  }

  Ranks ranks;
  LatentPool follower_pool = follower_model->make_pool(48, 16, KvDType::BF16);
  Follower follower(ranks, *follower_model, follower_pool);
  EngineOptions eo = small_engine();
  auto leader = std::make_shared<Leader>(ranks.zero, eo.kv_pages, eo.page_size, eo.kv_dtype, nullptr);
  eo.leader = leader;
  Engine engine(*model, nullptr, eo);
  std::vector<RequestResult> together(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    engine.submit(reqs[i], [&, i](const RequestEvent& e) { together[i].add(e); });
    if (i == 0) engine.run_until_idle();  // its pages go to the prefix cache before the rest arrive
  }
  engine.run_until_idle();
  leader->stop();
  follower.join();

  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i;
    EXPECT_EQ(together[i].reason, FinishReason::MaxTokens);
  }
  EXPECT_GT(engine.stats().prefix_hit_tokens, 0) << "the second request should share the first one's pages";
  EXPECT_GT(engine.stats().steps, 8) << "the prompts should be read in chunks";
  const std::string mine = pool_bytes(engine.pool()), theirs = pool_bytes(follower_pool);
  EXPECT_NE(mine, std::string(mine.size(), '\0'));
  EXPECT_TRUE(mine == theirs) << "the follower's latent pages differ from rank 0's";
}

TEST(Lockstep, HeartbeatsKeepAnIdleFollowerAndSilenceEndsItAtTheTimeout) {
  auto model = load_model(), follower_model = load_model();
  {
    Ranks ranks;
    ranks.zero.set_timeout(0.4);  // heartbeats every 0.1 s
    ranks.one.set_timeout(0.4);
    LatentPool pool = follower_model->make_pool(48, 16, KvDType::BF16);
    std::atomic<bool> returned{false};
    std::exception_ptr error;
    std::thread follower([&] {
      try {
        follow(ranks.one, *follower_model, pool);
      } catch (...) {
        error = std::current_exception();
      }
      returned = true;
    });
    EngineOptions eo = small_engine();
    auto leader = std::make_shared<Leader>(ranks.zero, eo.kv_pages, eo.page_size, eo.kv_dtype, nullptr);
    eo.leader = leader;
    Engine engine(*model, nullptr, eo);
    engine.start();
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // idle: nothing but heartbeats
    EXPECT_FALSE(returned) << "the follower gave up on an idle but live rank 0";
    EXPECT_EQ(engine.generate(greedy(prompt_ids(20, 4), 4)).tokens.size(), 4u);
    engine.stop();
    leader->stop();
    follower.join();
    EXPECT_FALSE(error) << "follow() ended with an error after a clean stop";
  }
  {
    Ranks ranks;  // rank 0 says nothing after the pool's shape
    ranks.one.set_timeout(0.3);
    LatentPool pool = follower_model->make_pool(48, 16, KvDType::BF16);
    Leader leader(ranks.zero, 48, 16, KvDType::BF16, nullptr);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_THROW(follow(ranks.one, *follower_model, pool), parallel::CommError);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  }
}

TEST(Lockstep, AFailedCollectiveEndsEveryRequestAndTellsTheServerOnce) {
  auto model = load_model();
  Ranks ranks;
  ranks.wire->fail_at = 5;  // the shape and the first pass go out; the second pass's body fails
  int failures = 0;
  std::string why;
  EngineOptions eo = small_engine();
  eo.leader = std::make_shared<Leader>(ranks.zero, eo.kv_pages, eo.page_size, eo.kv_dtype,
                                              [&](const std::string& w) { ++failures, why = w; });
  Engine engine(*model, nullptr, eo);
  std::vector<RequestResult> r(3);
  for (int i = 0; i < 3; ++i)
    engine.submit(greedy(prompt_ids(40, 10 + i), 20), [&, i](const RequestEvent& e) { r[size_t(i)].add(e); });
  engine.run_until_idle();
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(r[size_t(i)].finished);
    EXPECT_EQ(r[size_t(i)].reason, FinishReason::Cancelled) << i;
    EXPECT_NE(r[size_t(i)].message.find("expert-parallel job failed"), std::string::npos) << r[size_t(i)].message;
  }
  EXPECT_EQ(failures, 1);
  EXPECT_NE(why.find("rank 1 did not answer"), std::string::npos) << why;
  // A request after the failure ends the same way, without a pass.
  const int64_t steps = engine.stats().steps;
  const RequestResult late = engine.generate(greedy(prompt_ids(8, 20), 3));
  EXPECT_EQ(late.reason, FinishReason::Cancelled);
  EXPECT_EQ(engine.stats().steps, steps);
  EXPECT_EQ(failures, 1);
}

TEST(Lockstep, RefusesAnotherPoolShapeAndSpeculation) {
  auto model = load_model();
  {
    Ranks ranks;
    Leader leader(ranks.zero, 48, 16, KvDType::BF16, nullptr);
    LatentPool other = model->make_pool(48, 32, KvDType::BF16);
    try {
      follow(ranks.one, *model, other);
      ADD_FAILURE() << "follow() accepted a pool of another page size";
    } catch (const parallel::CommError&) {
      ADD_FAILURE() << "the wrong error";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("same options"), std::string::npos) << e.what();
    }
  }
  Ranks ranks;
  EngineOptions eo = small_engine();
  eo.leader = std::make_shared<Leader>(ranks.zero, eo.kv_pages, eo.page_size, eo.kv_dtype, nullptr);
  EngineOptions spec = eo;
  spec.speculative.enabled = true;
  EXPECT_THROW(Engine(*model, nullptr, spec), std::invalid_argument);
}

// The prompt cache's RAM tier lives on rank 0: a prefix evicted there and taken back is copied
// into rank 0's pool and sent to the follower's, which must end up the same byte for byte.
TEST(Lockstep, PagesTheRamTierCopiesInReachTheFollower) {
  auto model = load_model(), follower_model = load_model();
  Ranks ranks;
  EngineOptions eo = small_engine();
  eo.kv_pages = 24;  // the model's 256 positions are 16 pages: two prompts fill it
  LatentPool follower_pool = follower_model->make_pool(eo.kv_pages, eo.page_size, eo.kv_dtype);
  Follower follower(ranks, *follower_model, follower_pool);
  eo.prefix_tiers.ram_bytes = 64 << 20;
  auto leader = std::make_shared<Leader>(ranks.zero, eo.kv_pages, eo.page_size, eo.kv_dtype, nullptr);
  eo.leader = leader;
  Engine engine(*model, nullptr, eo);
  const Request a = greedy(prompt_ids(120, 7), 4);
  const RequestResult first = engine.generate(a);
  // Two long prompts need the pool's pages: a's cached pages move to RAM.
  engine.generate(greedy(prompt_ids(240, 8), 4));
  engine.generate(greedy(prompt_ids(240, 9), 4));
  const RequestResult again = engine.generate(a);
  leader->stop();
  follower.join();
  EXPECT_EQ(again.tokens, first.tokens);
  EXPECT_GT(engine.stats().prefix.hit_tokens[int(CacheTier::Ram)], 0) << "the prefix should come back from RAM";
  EXPECT_TRUE(pool_bytes(engine.pool()) == pool_bytes(follower_pool)) << "the follower's pages differ from rank 0's";
}

}  // namespace
}  // namespace mla
