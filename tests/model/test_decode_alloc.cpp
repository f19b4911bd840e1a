// A decode step allocates nothing once its buffers have grown: the forward pass keeps its
// activations and working lists between passes (model.h), the kernels keep theirs per thread.
// Counted on every path to the heap of this test program: every replaceable operator new
// (plain, array, nothrow, aligned) and the C allocation functions (malloc, calloc, realloc,
// aligned_alloc, posix_memalign, memalign, valloc, pvalloc), defined here and forwarding to
// glibc's own allocator (__libc_malloc and its kin), so the libraries the program links
// (libstdc++, libgomp, oneDNN) allocate through them too. Not under AddressSanitizer, which
// replaces them itself.
// Allocations from inside libdnnl are tallied apart, by the allocating code's address: oneDNN's
// sgemm allocates its packing workspace on every call (posix_memalign). A decode step (one token
// per sequence) calls none: the absorb attention's products of up to 128 query rows are
// backend/cpu/small_gemm.h's, products of up to 16 tokens the GEMV. There the count must be zero
// in both precisions, libdnnl included.
// Only the precise precision's products past the GEMV (LargeBatch: 20 tokens) still go through
// sgemm, on row blocks dequantized to float32 (ops.cpp matmul, Kernel::DequantSgemm / Sgemm):
// that is the float32 reference mode, where oneDNN's sgemm is the trusted product, so its
// allocations are counted apart there (and printed); every other allocation must be zero.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "backend/cpu/context.h"
#include "model/model.h"
#include "test_util.h"

#if defined(__SANITIZE_ADDRESS__)
#define MLA_COUNT_ALLOC 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer) || __has_feature(thread_sanitizer)
#define MLA_COUNT_ALLOC 0
#endif
#endif
#ifndef MLA_COUNT_ALLOC
#define MLA_COUNT_ALLOC 1
#endif

#if MLA_COUNT_ALLOC
#include <execinfo.h>
#include <link.h>
#include <unistd.h>

extern "C" {
void* __libc_malloc(size_t n);
void* __libc_calloc(size_t n, size_t size);
void* __libc_realloc(void* p, size_t n);
void* __libc_memalign(size_t align, size_t n);
void* __libc_valloc(size_t n);
void* __libc_pvalloc(size_t n);
void __libc_free(void* p);
}

namespace {
// Allocations while counting, by path: operator new (every overload), the C functions.
std::atomic<bool> g_counting{false};
std::atomic<long> g_new{0}, g_c{0}, g_dnnl{0};
// The executable segments of libdnnl (found once, before counting starts).
uintptr_t g_dnnl_lo[4] = {}, g_dnnl_hi[4] = {};
int g_dnnl_segments = 0;
bool from_dnnl(const void* caller) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(caller);
  for (int i = 0; i < g_dnnl_segments; ++i)
    if (a >= g_dnnl_lo[i] && a < g_dnnl_hi[i]) return true;
  return false;
}
void find_dnnl() {
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void*) {
        if (!info->dlpi_name || !std::strstr(info->dlpi_name, "libdnnl")) return 0;
        for (int i = 0; i < info->dlpi_phnum && g_dnnl_segments < 4; ++i) {
          const auto& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
          g_dnnl_lo[g_dnnl_segments] = info->dlpi_addr + ph.p_vaddr;
          g_dnnl_hi[g_dnnl_segments++] = info->dlpi_addr + ph.p_vaddr + ph.p_memsz;
        }
        return 0;
      },
      nullptr);
}
// MLA_ALLOC_TRACE=1: a backtrace of each counted allocation on standard error, to find it.
bool g_trace = false;
thread_local bool t_in_trace = false;
void trace() {
  if (t_in_trace) return;
  t_in_trace = true;
  void* frames[32];
  const int n = backtrace(frames, 32);
  static const char line[] = "---- allocation while counting:\n";
  (void)!write(STDERR_FILENO, line, sizeof line - 1);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  t_in_trace = false;
}
inline void count(std::atomic<long>& c, const void* caller) {
  if (!g_counting.load(std::memory_order_relaxed)) return;
  (from_dnnl(caller) ? g_dnnl : c).fetch_add(1, std::memory_order_relaxed);
  if (g_trace) trace();
}
#define MLA_COUNT(c) count(c, __builtin_return_address(0))
inline bool power_of_two(size_t a) { return a != 0 && (a & (a - 1)) == 0; }

void* new_impl(size_t n, const void* caller) {
  count(g_new, caller);
  for (;;) {
    if (void* p = __libc_malloc(n ? n : 1)) return p;
    std::new_handler h = std::get_new_handler();
    if (!h) throw std::bad_alloc();
    h();
  }
}
void* new_aligned_impl(size_t n, std::align_val_t al, const void* caller) {
  count(g_new, caller);
  const size_t a = std::max(size_t(al), sizeof(void*));
  for (;;) {
    if (void* p = __libc_memalign(a, n ? n : 1)) return p;
    std::new_handler h = std::get_new_handler();
    if (!h) throw std::bad_alloc();
    h();
  }
}
}  // namespace

// ---- the C allocation functions -------------------------------------------------------------
extern "C" {
void* malloc(size_t n) {
  MLA_COUNT(g_c);
  return __libc_malloc(n);
}
void* calloc(size_t n, size_t size) {
  MLA_COUNT(g_c);
  return __libc_calloc(n, size);
}
void* realloc(void* p, size_t n) {
  MLA_COUNT(g_c);
  return __libc_realloc(p, n);
}
void free(void* p) { __libc_free(p); }
void* memalign(size_t align, size_t n) {
  MLA_COUNT(g_c);
  return __libc_memalign(align, n);
}
void* aligned_alloc(size_t align, size_t n) {
  MLA_COUNT(g_c);
  return __libc_memalign(align, n);
}
int posix_memalign(void** out, size_t align, size_t n) {
  MLA_COUNT(g_c);
  if (!power_of_two(align) || align % sizeof(void*) != 0) return EINVAL;
  void* p = __libc_memalign(align, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
void* valloc(size_t n) {
  MLA_COUNT(g_c);
  return __libc_valloc(n);
}
void* pvalloc(size_t n) {
  MLA_COUNT(g_c);
  return __libc_pvalloc(n);
}
}

// ---- every replaceable operator new and delete ------------------------------------------------
void* operator new(size_t n) { return new_impl(n, __builtin_return_address(0)); }
void* operator new[](size_t n) { return new_impl(n, __builtin_return_address(0)); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try {
    return new_impl(n, __builtin_return_address(0));
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  try {
    return new_impl(n, __builtin_return_address(0));
  } catch (...) {
    return nullptr;
  }
}
void* operator new(size_t n, std::align_val_t a) { return new_aligned_impl(n, a, __builtin_return_address(0)); }
void* operator new[](size_t n, std::align_val_t a) { return new_aligned_impl(n, a, __builtin_return_address(0)); }
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return new_aligned_impl(n, a, __builtin_return_address(0));
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return new_aligned_impl(n, a, __builtin_return_address(0));
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { __libc_free(p); }
void operator delete[](void* p) noexcept { __libc_free(p); }
void operator delete(void* p, size_t) noexcept { __libc_free(p); }
void operator delete[](void* p, size_t) noexcept { __libc_free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { __libc_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { __libc_free(p); }
void operator delete(void* p, std::align_val_t) noexcept { __libc_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { __libc_free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { __libc_free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { __libc_free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { __libc_free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { __libc_free(p); }
#endif

namespace {

using namespace mla;

#if MLA_COUNT_ALLOC
// Allocations made by f, on any path, by any thread.
template <class F>
long allocations(F&& f) {
  static const bool trace_on = [] {
    const char* v = std::getenv("MLA_ALLOC_TRACE");
    if (!v || std::string(v) == "0") return false;
    void* frames[2];
    backtrace(frames, 2);  // loads the unwinder now, not while counting
    return true;
  }();
  static const bool found = (find_dnnl(), true);
  (void)found;
  g_trace = trace_on;
  g_new = 0;
  g_c = 0;
  g_dnnl = 0;
  g_counting = true;
  f();
  g_counting = false;
  return g_new.load() + g_c.load();
}

// Keeps p alive in the compiler's eyes (an allocation and its free may otherwise be dropped).
inline void escape(void* p) { asm volatile("" : : "g"(p) : "memory"); }
#endif

TEST(Model, AllocationCountSeesEveryPath) {
#if !MLA_COUNT_ALLOC
  GTEST_SKIP() << "the sanitizers replace the allocation functions";
#else
  // Each path once, counted once.
  const auto one = [](auto&& alloc_free) { return allocations(alloc_free); };
  EXPECT_EQ(one([] { void* p = ::operator new(24); escape(p); ::operator delete(p); }), 1);
  EXPECT_EQ(one([] { void* p = ::operator new[](24); escape(p); ::operator delete[](p); }), 1);
  EXPECT_EQ(one([] { void* p = ::operator new(24, std::nothrow); escape(p); ::operator delete(p); }), 1);
  EXPECT_EQ(one([] { void* p = ::operator new[](24, std::nothrow); escape(p); ::operator delete[](p); }), 1);
  uintptr_t where = 1;
  EXPECT_EQ(one([&] {
              void* p = ::operator new(24, std::align_val_t(256));
              escape(p);
              where = reinterpret_cast<uintptr_t>(p);
              ::operator delete(p, std::align_val_t(256));
            }),
            1);
  EXPECT_EQ(where % 256, 0u);
  EXPECT_EQ(one([] {
              void* p = ::operator new[](24, std::align_val_t(128), std::nothrow);
              escape(p);
              ::operator delete[](p, std::align_val_t(128));
            }),
            1);
  EXPECT_EQ(one([] { void* p = std::malloc(24); escape(p); std::free(p); }), 1);
  EXPECT_EQ(one([] { void* p = std::calloc(3, 8); escape(p); std::free(p); }), 1);
  EXPECT_EQ(one([] {
              void* p = std::malloc(8);
              escape(p);
              p = std::realloc(p, 4096);
              escape(p);
              std::free(p);
            }),
            2);
  EXPECT_EQ(one([] { void* p = std::aligned_alloc(64, 128); escape(p); std::free(p); }), 1);
  int rc = -1;
  EXPECT_EQ(one([&] {
              void* p = nullptr;
              rc = posix_memalign(&p, 4096, 100);
              escape(p);
              where = reinterpret_cast<uintptr_t>(p);
              std::free(p);
            }),
            1);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(where % 4096, 0u);
  EXPECT_EQ(one([] { std::vector<float> v(100); escape(v.data()); }), 1);
  EXPECT_EQ(one([] { std::string s(100, 'x'); escape(s.data()); }), 1);
  EXPECT_EQ(one([] { char* s = strdup("a string"); escape(s); std::free(s); }), 1) << "libc's own calls";
#endif
}

TEST(Model, DecodeStepsAllocateNothing) {
#if !MLA_COUNT_ALLOC
  GTEST_SKIP() << "the sanitizers replace the allocation functions";
#else
  for (const char* name : {"deepseek-v3-tiny", "deepseek-v3-fp8-tiny", "kimi-k2.5-int4-tiny", "deepseek-v2-lite-tiny"})
    for (auto precision : {cpu::Precision::Fast, cpu::Precision::Precise}) {
      cpu::Context ctx;
      ctx.precision = precision;
      ctx.threads = 2;  // the workers' buffers too
      auto model = Model::load(test::fixture(name), ctx);
      // Steps within one cache page: a step that opens a page grows the sequence's page table.
      LatentPool pool = model->make_pool(4, 64);
      PageTable seq;
      std::vector<int32_t> prompt = {5, 17, 3, 11, 7}, next = {9};
      std::vector<float> logits;
      SeqSlice s{&seq, prompt};
      model->forward(std::span<SeqSlice>(&s, 1), pool, {}, logits);
      s = {&seq, next};
      for (int i = 0; i < 3; ++i) model->forward(std::span<SeqSlice>(&s, 1), pool, {}, logits);  // warm-up
      const long n = allocations([&] {
        for (int i = 0; i < 5; ++i) model->forward(std::span<SeqSlice>(&s, 1), pool, {}, logits);
      });
      EXPECT_EQ(n, 0) << name << " " << cpu::precision_name(precision) << ": allocations in 5 decode steps ("
                      << g_new.load() << " operator new, " << g_c.load() << " malloc family)";
      EXPECT_EQ(g_dnnl.load(), 0) << name << " " << cpu::precision_name(precision)
                                  << ": allocations inside oneDNN in 5 decode steps";
      EXPECT_EQ(model->last_path(), AttnPath::Absorb) << name;
    }
#endif
}

TEST(Model, BatchedDecodeStepsAllocateNothing) {
#if !MLA_COUNT_ALLOC
  GTEST_SKIP() << "the sanitizers replace the allocation functions";
#else
  // Three sequences of different lengths decoding together, as the scheduler batches them.
  cpu::Context ctx;
  ctx.threads = 2;
  auto model = Model::load(test::fixture("deepseek-v3-fp8-tiny"), ctx);
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
  const long n = allocations([&] {
    for (int i = 0; i < 5; ++i) model->forward(std::span<SeqSlice>(batch, 3), pool, {}, logits);
  });
  EXPECT_EQ(n, 0) << "allocations in 5 batched decode steps (" << g_new.load() << " operator new, " << g_c.load()
                  << " malloc family)";
  EXPECT_EQ(g_dnnl.load(), 0) << "allocations inside oneDNN in 5 batched decode steps";
  EXPECT_EQ(seqs[1].length, 6 + 8);
#endif
}

}  // namespace

namespace {

using namespace mla;

// Twenty sequences decoding together: 20 tokens per product, past the GEMV (16 tokens at most),
// so the projections run on the GEMM paths (AMX or oneDNN's bf16 matmul in the fast precision,
// which allocate nothing here; dequantized blocks and sgemm in the precise one).
TEST(Model, LargeBatchDecodeStepsAllocateNothing) {
#if !MLA_COUNT_ALLOC
  GTEST_SKIP() << "the sanitizers replace the allocation functions";
#else
  constexpr int kSeqs = 20;
  for (const char* name : {"deepseek-v3-tiny", "deepseek-v3-fp8-tiny", "kimi-k2.5-int4-tiny"})
    for (auto precision : {cpu::Precision::Fast, cpu::Precision::Precise})
      for (int threads : {1, 2}) {
      cpu::Context ctx;
      ctx.precision = precision;
      ctx.threads = threads;
      auto model = Model::load(test::fixture(name), ctx);
      LatentPool pool = model->make_pool(2 * kSeqs, 64);
      std::vector<PageTable> seqs(kSeqs);
      std::vector<std::vector<int32_t>> prompts, next;
      std::vector<SeqSlice> batch;
      std::vector<float> logits;
      for (int b = 0; b < kSeqs; ++b) {
        prompts.push_back(std::vector<int32_t>(size_t(1 + b % 5), int32_t(3 + b)));
        next.push_back({int32_t(7 + b)});
      }
      for (int b = 0; b < kSeqs; ++b) {
        SeqSlice s{&seqs[size_t(b)], prompts[size_t(b)]};
        model->forward(std::span<SeqSlice>(&s, 1), pool, {}, logits);
      }
      for (int b = 0; b < kSeqs; ++b) batch.push_back({&seqs[size_t(b)], next[size_t(b)]});
      // Warm-up: the routed experts' share of the tokens changes from step to step, and with it
      // the kernels' job lists; these steps reach the largest of the counted ones.
      for (int i = 0; i < 8; ++i) model->forward(batch, pool, {}, logits);
      const long n = allocations([&] {
        for (int i = 0; i < 5; ++i) model->forward(batch, pool, {}, logits);
      });
      EXPECT_EQ(n, 0) << name << " " << cpu::precision_name(precision) << ", " << threads
                      << " threads: allocations in 5 decode steps of " << kSeqs << " sequences (" << g_new.load() << " operator new, " << g_c.load()
                      << " malloc family)";
      if (precision == cpu::Precision::Fast)
        EXPECT_EQ(g_dnnl.load(), 0) << name << " fast, " << threads << " threads: allocations inside oneDNN";
      else  // the float32 reference mode's sgemm (see the top of this file)
        std::printf("%s precise, %d threads, %d sequences: oneDNN's sgemm allocated %ld times in 5 decode steps\n",
                    name, threads, kSeqs, g_dnnl.load());
    }
#endif
}

}  // namespace
