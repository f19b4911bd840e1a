// The scheduler alone (no model): which tokens each pass carries when a long prompt is read
// while other sequences decode. A pass's latents are "written" here by advancing the page
// table, as the model's forward pass does.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "engine/scheduler.h"

namespace mla {
namespace {

struct Bench {
  LatentPool pool{1, 8, 4, 2048, 64};
  std::vector<std::unique_ptr<Sequence>> seqs;

  Sequence* add(Scheduler& sched, int64_t prompt) {
    seqs.push_back(std::make_unique<Sequence>());
    Sequence* s = seqs.back().get();
    s->id = int64_t(seqs.size());
    s->tokens.assign(size_t(prompt), 7);
    s->prompt_len = prompt;
    sched.add(s);
    return s;
  }

  // Runs one pass: every part's tokens get latents; a sequence that has read its prompt
  // "samples" one more token.
  Batch pass(Scheduler& sched) {
    Batch b = sched.schedule();
    for (const BatchPart& p : b.parts) p.seq->table.length += p.n;
    for (const BatchPart& p : b.parts)
      if (p.seq->pending() == 0) p.seq->tokens.push_back(7);
    return b;
  }
};

double pairs(int64_t p, int64_t n) { return double(n) * (double(p) + 0.5) + 0.5 * double(n) * double(n); }

TEST(Scheduler, LongPromptChunksShrinkWhileOthersDecodeAndEveryPassCarriesTheirTokens) {
  Bench bench;
  SchedulerOptions opt;
  opt.max_batch_tokens = 512;
  opt.chunk_depth = 4096;
  Scheduler sched(bench.pool, nullptr, opt);
  Sequence* a = bench.add(sched, 100);
  Sequence* b = bench.add(sched, 100);
  bench.pass(sched);  // both prompts in one pass
  ASSERT_EQ(a->pending(), 1);
  ASSERT_EQ(b->pending(), 1);
  Sequence* longp = bench.add(sched, 100000);

  const double bound = double(opt.max_batch_tokens) * double(opt.chunk_depth);
  int64_t passes = 0, smallest = 1 << 30;
  while (longp->pending() > 1) {
    const int64_t a_before = a->table.length, long_pending = longp->pending();
    Batch batch = sched.schedule();
    double work = 0;
    int64_t chunk = 0;
    for (const BatchPart& p : batch.parts) {
      work += pairs(p.seq->table.length, p.n);
      if (p.seq == longp) chunk = p.n;
    }
    for (const BatchPart& p : batch.parts) p.seq->table.length += p.n;
    for (const BatchPart& p : batch.parts)
      if (p.seq->pending() == 0) p.seq->tokens.push_back(7);
    ++passes;
    // The decoding sequences get a token in every pass.
    ASSERT_EQ(a->table.length, a_before + 1) << "pass " << passes;
    ASSERT_GT(chunk, 0) << "pass " << passes;
    // The pass's attention stays within the bound, unless the chunk is at its floor.
    if (chunk > opt.max_batch_tokens / 8) {
      EXPECT_LE(work, bound * (1 + 1e-12)) << "pass " << passes;
    }
    EXPECT_LE(chunk, opt.max_batch_tokens - 2);
    if (chunk < long_pending) smallest = std::min(smallest, chunk);  // not the prompt's last piece
  }
  // Deep in the prompt the chunks are at the floor (max_batch_tokens / 8), not 510 tokens.
  EXPECT_EQ(smallest, opt.max_batch_tokens / 8);
  // Early on the chunks use the whole token budget (510 = 512 - the two decode tokens).
  EXPECT_LT(passes, 100000 / 64 + 1);
  EXPECT_GT(passes, 100000 / 510 + 1);
}

TEST(Scheduler, ALongPromptAloneRunsInFullChunksAtAnyDepth) {
  Bench bench;
  SchedulerOptions opt;
  opt.max_batch_tokens = 512;
  opt.chunk_depth = 1024;
  Scheduler sched(bench.pool, nullptr, opt);
  Sequence* s = bench.add(sched, 40000);
  while (s->pending() > 512) {
    Batch batch = bench.pass(sched);
    ASSERT_EQ(batch.parts.size(), 1u);
    EXPECT_EQ(batch.parts[0].n, 512);
  }
}

TEST(Scheduler, NoBoundWithChunkDepthZero) {
  Bench bench;
  SchedulerOptions opt;
  opt.max_batch_tokens = 256;
  opt.chunk_depth = 0;
  Scheduler sched(bench.pool, nullptr, opt);
  Sequence* a = bench.add(sched, 10);
  bench.pass(sched);
  Sequence* longp = bench.add(sched, 50000);
  while (longp->pending() > 1000) {
    Batch batch = bench.pass(sched);
    ASSERT_EQ(batch.parts.size(), 2u);
    EXPECT_EQ(batch.parts[0].seq, a);
    EXPECT_EQ(batch.parts[1].n, 255);
  }
  EXPECT_THROW(Scheduler(bench.pool, nullptr, SchedulerOptions{512, 64, -1}), std::invalid_argument);
}

}  // namespace
}  // namespace mla
