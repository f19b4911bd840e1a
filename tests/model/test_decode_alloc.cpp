// A decode step allocates nothing once its buffers have grown: the forward pass keeps its
// activations and working lists between passes (model.h), the kernels keep theirs per thread.
// Counted through a replacement of the global operator new for this test program (not under the
// sanitizers, which replace it themselves).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/precision.h"
#include "model/model.h"
#include "test_util.h"

#if defined(__SANITIZE_ADDRESS__)
#define MLA_COUNT_NEW 0
#else
#define MLA_COUNT_NEW 1
namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_news{0};
}  // namespace
void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif

namespace {

using namespace mla;

TEST(Model, DecodeStepsAllocateNothing) {
#if !MLA_COUNT_NEW
  GTEST_SKIP() << "the sanitizers replace operator new";
#else
  const auto saved = cpu::precision();
  const int saved_threads = cpu::num_threads();
  cpu::set_num_threads(2);  // the workers' buffers too
  for (const char* name : {"deepseek-v3-tiny", "deepseek-v3-fp8-tiny", "kimi-k2.5-int4-tiny", "deepseek-v2-lite-tiny"})
    for (auto precision : {cpu::Precision::Fast, cpu::Precision::Precise}) {
      cpu::set_precision(precision);
      auto model = Model::load(test::fixture(name));
      // Steps within one cache page: a step that opens a page grows the sequence's page table.
      LatentPool pool = model->make_pool(4, 64);
      PageTable seq;
      std::vector<int32_t> prompt = {5, 17, 3, 11, 7}, next = {9};
      std::vector<float> logits;
      SeqSlice s{&seq, prompt};
      model->forward(std::span<SeqSlice>(&s, 1), pool, {}, logits);
      s = {&seq, next};
      for (int i = 0; i < 3; ++i) model->forward(std::span<SeqSlice>(&s, 1), pool, {}, logits);  // warm-up
      g_news = 0;
      g_counting = true;
      for (int i = 0; i < 5; ++i) model->forward(std::span<SeqSlice>(&s, 1), pool, {}, logits);
      g_counting = false;
      EXPECT_EQ(g_news.load(), 0) << name << " " << cpu::precision_name(precision) << ": allocations in 5 decode steps";
      EXPECT_EQ(model->last_path(), AttnPath::Absorb) << name;
    }
  cpu::set_precision(saved);
  cpu::set_num_threads(saved_threads);
#endif
}

TEST(Model, BatchedDecodeStepsAllocateNothing) {
#if !MLA_COUNT_NEW
  GTEST_SKIP() << "the sanitizers replace operator new";
#else
  // Three sequences of different lengths decoding together, as the scheduler batches them.
  const int saved_threads = cpu::num_threads();
  cpu::set_num_threads(2);
  auto model = Model::load(test::fixture("deepseek-v3-fp8-tiny"));
  LatentPool pool = model->make_pool(8, 64);
  PageTable seqs[3];
  std::vector<std::vector<int32_t>> prompts = {{5, 17, 3}, {11, 7, 2, 9, 4, 6}, {8}};
  std::vector<int32_t> next[3] = {{9}, {1}, {2}};
  std::vector<float> logits;
  for (int b = 0; b < 3; ++b) {
    SeqSlice s{&seqs[b], prompts[size_t(b)]};
    model->forward(std::span<SeqSlice>(&s, 1), pool, {}, logits);
  }
  SeqSlice batch[3] = {{&seqs[0], next[0]}, {&seqs[1], next[1]}, {&seqs[2], next[2]}};
  for (int i = 0; i < 3; ++i) model->forward(std::span<SeqSlice>(batch, 3), pool, {}, logits);  // warm-up
  g_news = 0;
  g_counting = true;
  for (int i = 0; i < 5; ++i) model->forward(std::span<SeqSlice>(batch, 3), pool, {}, logits);
  g_counting = false;
  EXPECT_EQ(g_news.load(), 0) << "allocations in 5 batched decode steps";
  EXPECT_EQ(seqs[1].length, 6 + 8);
  cpu::set_num_threads(saved_threads);
#endif
}

}  // namespace
