// Throughput of cpu::matmul on decode- and prompt-sized products, per weight format, against the
// limits measured in the same run: the AVX-512 read loop's bandwidth (for few tokens, where the
// weights are read once per product) and oneDNN's bf16 matmul on the same shape (for many, and
// for a prompt's share of tokens per expert).
// The weights (about 2 GB per format) are larger than the caches, so every product reads DRAM.
//
//   bench/matmul [--quick] [--threads N] [--huge 0|1] [--l2] [--prompt] [--ggml[-l2|-model] [FORMAT ...]]
//   (--l2: only the in-cache table; --prompt: only the prompt-shaped products; --ggml: only the
//   decode tables of llama.cpp's block formats, every one or those named: q4_0 .. q6_k;
//   --ggml-l2: their in-cache table alone; --ggml-model: one token through the weight products
//   of bench/ggml_model.py's model, the decode step llama-bench times on that file)
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/formats/gemm.h"
#include "backend/cpu/compute_peak.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/formats/gemv.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/precision.h"
#include "backend/cpu/repack.h"
#include "matrix_pass.h"
#include "tools/bench.h"
#include "tensor/dtype.h"
#include "tensor/ggml_blocks.h"
#include "tensor/matrix.h"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Anonymous memory, huge pages when asked and allowed, filled by `threads` threads.
uint8_t* alloc(size_t bytes, bool huge) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
  madvise(p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  return static_cast<uint8_t*>(p);
}

struct Set {
  std::vector<mla::MatrixView> views;
  size_t bytes = 0;  // weights + scales of all views
};

// `count` matrices of rows x cols in one format, random contents (valid codes). INT4_WORDS16,
// INT8_WORDS16: INT4 / INT8 groups repacked at "load" (repack.h), as Model::load leaves a model's
// weights.
Set make_set(mla::WeightFormat f, int64_t rows, int64_t cols, int count, bool huge) {
  if (mla::is_words16(f)) {
    const bool int8 = f == mla::WeightFormat::INT8_WORDS16;
    Set s = make_set(int8 ? mla::WeightFormat::INT8_GROUP : mla::WeightFormat::INT4_GROUP, rows, cols, count, huge);
    for (auto& v : s.views) mla::cpu::repack_words16(mla::cpu::Context{}, v);
    return s;
  }
  mla::MatrixView v;
  v.format = f;
  v.rows = rows;
  v.cols = cols;
  if (f == mla::WeightFormat::FP8_BLOCK128) v.scale_cols = (cols + 127) / 128;
  if (mla::is_int_group(f)) {
    v.group_size = 32;
    v.scale_cols = cols / 32;
  }
  const size_t wb = v.bytes(), sb = v.scale_bytes();
  Set s;
  uint8_t* mem = alloc((wb + sb) * size_t(count), huge);
#pragma omp parallel for
  for (int i = 0; i < count; ++i) {
    uint8_t* w = mem + (wb + sb) * size_t(i);
    // Weights like a trained model's (normal, std 0.02 / codes of such values): no denormals.
    std::mt19937 r{uint32_t(i)};
    std::normal_distribution<float> nd(0.0f, 0.02f);
    uint8_t pool[4096];
    for (size_t k = 0; k < sizeof pool; k += 2) {
      const float x = nd(r);
      const uint16_t h = mla::f32_to_bf16(x);
      if (f == mla::WeightFormat::FP8_BLOCK128) {
        pool[k] = mla::f32_to_fp8e4m3(x * 5000.0f);
        pool[k + 1] = mla::f32_to_fp8e4m3(nd(r) * 5000.0f);
      } else if (mla::is_int_group(f)) {
        pool[k] = uint8_t(r());
        pool[k + 1] = uint8_t(r());
      } else {
        std::memcpy(pool + k, &h, 2);
      }
    }
    if (mla::is_ggml_block(f))  // random codes and sub-block scales
      for (size_t k = 0; k < sizeof pool; ++k) pool[k] = uint8_t(r());
    for (size_t k = 0; k < wb; k += 1024) {
      const size_t off = (r() % 1536) * 2;
      std::memcpy(w + k, pool + off, std::min<size_t>(1024, wb - k));
    }
    if (mla::is_ggml_block(f)) {  // each block's f16 d (and dmin or m) about 1e-3
      const size_t bb = mla::ggml_block(f).bytes;
      const size_t at = f == mla::WeightFormat::Q2_K ? 80 : f == mla::WeightFormat::Q3_K ? 108
                        : f == mla::WeightFormat::Q6_K ? 208 : 0;
      const bool two = f == mla::WeightFormat::Q4_1 || f == mla::WeightFormat::Q5_1 || f == mla::WeightFormat::Q2_K ||
                       f == mla::WeightFormat::Q4_K || f == mla::WeightFormat::Q5_K;
      const uint16_t h = 0x1419;  // 0.00101
      for (size_t b = 0; b < wb; b += bb) {
        std::memcpy(w + b + at, &h, 2);
        if (two) std::memcpy(w + b + at + 2, &h, 2);
      }
    }
    if (f == mla::WeightFormat::FP8_BLOCK128)
      for (size_t k = 0; k < sb; k += 4) {
        float one = 1e-2f;
        std::memcpy(w + wb + k, &one, 4);
      }
    if (mla::is_int_group(f))
      for (size_t k = 0; k < sb; k += 2) {
        uint16_t h = mla::f32_to_bf16(1e-2f);
        std::memcpy(w + wb + k, &h, 2);
      }
  }
  for (int i = 0; i < count; ++i) {
    v.data = mem + (wb + sb) * size_t(i);
    v.scales = sb ? mem + (wb + sb) * size_t(i) + wb : nullptr;
    s.views.push_back(v);
  }
  s.bytes = (wb + sb) * size_t(count);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, huge = true, l2_only = false, prompt_only = false, ggml_only = false, ggml_l2_only = false,
       ggml_model = false;
  int threads = 0;
  const mla::WeightFormat ggml_all[] = {mla::WeightFormat::Q4_0, mla::WeightFormat::Q4_1, mla::WeightFormat::Q5_0,
                                        mla::WeightFormat::Q5_1, mla::WeightFormat::Q8_0, mla::WeightFormat::Q2_K,
                                        mla::WeightFormat::Q3_K, mla::WeightFormat::Q4_K, mla::WeightFormat::Q5_K,
                                        mla::WeightFormat::Q6_K};
  std::vector<mla::WeightFormat> ggml_formats;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--huge" && i + 1 < argc) huge = std::atoi(argv[++i]) != 0;
    else if (a == "--l2") l2_only = true;
    else if (a == "--prompt") prompt_only = true;
    else if (a == "--ggml") ggml_only = true;
    else if (a == "--ggml-l2") ggml_only = ggml_l2_only = true;
    else if (a == "--ggml-model") ggml_only = ggml_model = true;
    else if (ggml_only && std::find_if(std::begin(ggml_all), std::end(ggml_all), [&](mla::WeightFormat f) {
                            return a == mla::weight_format_name(f);
                          }) != std::end(ggml_all)) {
      for (mla::WeightFormat f : ggml_all)
        if (a == mla::weight_format_name(f)) ggml_formats.push_back(f);
    } else {
      std::fprintf(stderr, "usage: matmul [--quick] [--threads N] [--huge 0|1] [--l2] [--prompt] [--ggml [FORMAT ...]]\n");
      return 2;
    }
  }
  if (ggml_only && ggml_formats.empty()) ggml_formats.assign(std::begin(ggml_all), std::end(ggml_all));
  mla::cpu::Context base;  // precise, --threads
  base.threads = std::max(0, threads);
  auto in = [&](mla::cpu::Precision p) {
    mla::cpu::Context c = base;
    c.precision = p;
    return c;
  };
  const int reps = quick ? 2 : 5;
  const size_t target = quick ? (size_t(1) << 30) : (size_t(2) << 30);
  const double bw = l2_only || prompt_only || ggml_l2_only || ggml_model ? 0.0 : mla::bench::read_bandwidth_gbps(target, reps, base.threads);
  std::printf("threads %d, huge pages %s; read loop over %.1f GiB: %.1f GB/s\n", base.num_threads(),
              huge ? "asked" : "off", double(target) / (1 << 30), bw);

  // llama.cpp's block formats: decode-sized products on a Llama-3-8B's shapes (the FFN's gate /
  // up and down, the attention's output), as GGUF files store them (no repack), 1 and 4 tokens,
  // fast (the VNNI GEMV on int8 activations where the build has it) and precise (float32 GEMV),
  // with the kernel each ran (dispatch.h).
  // One decode step's weight products of bench/ggml_model.py's model (2 layers of Llama-3-8B's
  // shapes and a 32000-token output matrix, every matrix in one format): per layer q, k, v, o,
  // gate, up, down, then the output, one token each, in sequence as a decode step runs them.
  // GB/s of the weights streamed (what llama-bench's tg streams on that file, less its
  // embedding table, which a token reads one row of).
  if (ggml_model) {
    for (mla::WeightFormat f : ggml_formats) {
      struct Shape {
        int64_t rows, cols;
      };
      std::vector<Shape> step;
      for (int l = 0; l < 2; ++l)
        for (Shape sh : {Shape{4096, 4096}, {1024, 4096}, {1024, 4096}, {4096, 4096}, {14336, 4096}, {14336, 4096},
                         {4096, 14336}})
          step.push_back(sh);
      step.push_back({32000, 4096});
      std::vector<Set> sets;
      size_t bytes = 0;
      for (const Shape& sh : step) {
        sets.push_back(make_set(f, sh.rows, sh.cols, 1, huge));
        bytes += sets.back().bytes;
      }
      for (auto p : {mla::cpu::Precision::Fast, mla::cpu::Precision::Precise}) {
        const mla::cpu::Context ctx = in(p);
        const mla::cpu::Kernel k = mla::cpu::matmul_kernel(ctx, 1, sets[0].views[0], mla::cpu::features(ctx));
        std::vector<float> x(size_t(14336), 0.01f), y(size_t(32000));
        double best = 1e30;
        for (int r = 0; r < 3 * reps; ++r) {
          auto t = Clock::now();
          for (const Set& st : sets) mla::cpu::matmul(ctx, x.data(), 1, st.views[0], y.data());
          best = std::min(best, since(t));
        }
        std::printf("%s model step, %d threads, %s (%s): %.2f ms, %.1f steps/s, %.1f GB/s of %.1f MB\n",
                    mla::weight_format_name(f), base.num_threads(), mla::cpu::precision_name(p), mla::cpu::kernel_name(k),
                    best * 1e3, 1.0 / best, double(bytes) / best / 1e9, double(bytes) / 1e6);
        std::fflush(stdout);
      }
      for (Set& st : sets) munmap(const_cast<void*>(st.views[0].data), st.bytes);
    }
    return 0;
  }
  if (ggml_only && !ggml_l2_only) {
    std::printf("\n%-6s %-12s %3s %-8s %-12s %9s %9s %6s\n", "format", "shape", "T", "prec", "kernel", "ms/pass",
                "GB/s", "ratio");
    for (mla::WeightFormat f : ggml_formats)
      for (auto [rows, cols] : {std::pair<int64_t, int64_t>{14336, 4096}, {4096, 14336}, {4096, 4096}}) {
        mla::MatrixView probe;
        probe.format = f;
        probe.rows = rows;
        probe.cols = cols;
        const int count = int(std::max<size_t>(1, target / probe.bytes()));
        Set s = make_set(f, rows, cols, count, huge);
        for (int64_t T : {1, 4})
          for (auto p : {mla::cpu::Precision::Fast, mla::cpu::Precision::Precise}) {
            const mla::cpu::Context ctx = in(p);
            const mla::cpu::Kernel k = mla::cpu::matmul_kernel(ctx, T, probe, mla::cpu::features(ctx));
            const double t = best_pass_seconds(ctx, s.views, T, reps);
            const double gbs = double(s.bytes) / t / 1e9;
            std::printf("%-6s %5lldx%-6lld %3lld %-8s %-12s %9.2f %9.1f %6.2f\n", mla::weight_format_name(f),
                        (long long)rows, (long long)cols, (long long)T, mla::cpu::precision_name(p),
                        mla::cpu::kernel_name(k), t * 1e3, gbs, gbs / bw);
            std::fflush(stdout);
          }
        munmap(const_cast<void*>(s.views[0].data), s.bytes);
      }
  }
  if (ggml_only) {
    // The same kernels on 256 x 4096 in L2 on one thread (what a product costs in instructions,
    // away from DRAM): GB/s by the wall clock and by the thread's CPU time (the second holds
    // where other processes share the cores).
    std::printf("\nin L2, 1 thread:\n%-6s %-12s %3s %-8s %-12s %9s %9s %9s\n", "format", "shape", "T", "prec", "kernel",
                "us/pass", "GB/s", "GB/s cpu");
    for (mla::WeightFormat f : ggml_formats) {
      const int64_t rows = 256, cols = 4096;
      Set s = make_set(f, rows, cols, 1, false);
      for (int64_t T : {1, 4})
        for (auto p : {mla::cpu::Precision::Fast, mla::cpu::Precision::Precise}) {
          mla::cpu::Context ctx = in(p);
          ctx.threads = 1;
          const mla::cpu::Kernel k = mla::cpu::matmul_kernel(ctx, T, s.views[0], mla::cpu::features(ctx));
          const int inner = 100;
          std::vector<float> x(size_t(T * cols), 0.01f), y(size_t(T * rows));
          double best = 1e30, best_cpu = 1e30;
          for (int r = 0; r < 7; ++r) {
            timespec c0, c1;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
            auto t = Clock::now();
            for (int i = 0; i < inner; ++i) mla::cpu::matmul(ctx, x.data(), T, s.views[0], y.data());
            best = std::min(best, since(t) / inner);
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
            best_cpu = std::min(best_cpu, (double(c1.tv_sec - c0.tv_sec) + 1e-9 * double(c1.tv_nsec - c0.tv_nsec)) / inner);
          }
          std::printf("%-6s %5lldx%-6lld %3lld %-8s %-12s %9.2f %9.1f %9.1f\n", mla::weight_format_name(f),
                      (long long)rows, (long long)cols, (long long)T, mla::cpu::precision_name(p),
                      mla::cpu::kernel_name(k), best * 1e6, double(s.bytes) / best / 1e9, double(s.bytes) / best_cpu / 1e9);
          std::fflush(stdout);
        }
      munmap(const_cast<void*>(s.views[0].data), s.bytes);
    }
    return 0;
  }

  // Decode: an MoE expert projection (1408 x 2048) and its transpose, T = 1 and 4, and in bf16
  // the lm_head of DeepSeek-V3's vocabulary (129280 x 2048, the bench checkpoint's).
  // Both precisions: precise (float32 activations, weights decoded to float32, FMA) and fast
  // (activations rounded to bf16, weights decoded to bf16, VDPBF16PS; f32/f16 weights excepted;
  // by default only for 1 token, see cpu::Context::gemv_bf16_max_tokens: fast at T = 4 is the float32 kernel).
  std::printf("\n%-13s %-12s %3s %-8s %9s %9s %6s\n", "format", "shape", "T", "prec", "ms/pass", "GB/s", "ratio");
  // INT8_WORDS16 runs only in the fast precision (its GEMV is the VNNI one; precise would take
  // the reference).
  for (auto f : {mla::WeightFormat::BF16, mla::WeightFormat::FP8_BLOCK128, mla::WeightFormat::INT4_GROUP,
                 mla::WeightFormat::INT4_WORDS16, mla::WeightFormat::INT8_GROUP, mla::WeightFormat::INT8_WORDS16}) {
    if (l2_only || prompt_only) break;
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1408, 2048}, {2048, 1408}, {129280, 2048}}) {
      if (rows == 129280 && f != mla::WeightFormat::BF16) continue;  // the lm_head, bf16 as the checkpoints ship it
      mla::MatrixView probe;
      probe.format = f;
      probe.rows = rows;
      probe.cols = cols;
      const size_t one = probe.bytes() + (mla::is_int_group(f) ? size_t(rows * cols / 16) : 0);
      const int count = int(std::max<size_t>(1, target / one));
      Set s = make_set(f, rows, cols, count, huge);
      for (int64_t T : {1, 4})
        for (auto p : {mla::cpu::Precision::Precise, mla::cpu::Precision::Fast}) {
          if (f == mla::WeightFormat::INT8_WORDS16 && p == mla::cpu::Precision::Precise) continue;
          const double t = best_pass_seconds(in(p), s.views, T, reps);
          const double gbs = double(s.bytes) / t / 1e9;
          std::printf("%-13s %5lldx%-6lld %3lld %-8s %9.2f %9.1f %6.2f\n", mla::weight_format_name(f),
                      (long long)rows, (long long)cols, (long long)T, mla::cpu::precision_name(p), t * 1e3, gbs,
                      gbs / bw);
          std::fflush(stdout);
        }
      munmap(const_cast<void*>(s.views[0].data), s.bytes);
    }
  }

  // The same kernels on weights that stay in the L2 cache (256 x 2048, on one thread): what the
  // decode costs in instructions, away from DRAM (a kernel near the read loop's bandwidth above
  // needs this well above it per thread). Fast here runs the bf16 kernels at every T.
  if (!prompt_only) {
    std::printf("\nin L2, 1 thread:\n%-13s %-12s %3s %-8s %9s %9s\n", "format", "shape", "T", "prec", "us/pass", "GB/s");
    for (auto f : {mla::WeightFormat::BF16, mla::WeightFormat::FP8_BLOCK128, mla::WeightFormat::INT4_GROUP,
                   mla::WeightFormat::INT4_WORDS16, mla::WeightFormat::INT8_GROUP, mla::WeightFormat::INT8_WORDS16}) {
      const int64_t rows = 256, cols = 2048;
      Set s = make_set(f, rows, cols, 1, false);
      for (int64_t T : {1, 2, 4})
        for (auto p : {mla::cpu::Precision::Precise, mla::cpu::Precision::Fast}) {
          if (f == mla::WeightFormat::INT8_WORDS16 && p == mla::cpu::Precision::Precise) continue;
          mla::cpu::Context ctx = in(p);
          ctx.threads = 1;
          ctx.gemv_bf16_max_tokens = int64_t(1) << 40;
          const int inner = 200;
          std::vector<float> x(size_t(T * cols), 0.01f), y(size_t(T * rows));
          double best = 1e30;
          for (int r = 0; r < 5; ++r) {
            auto t = Clock::now();
            for (int i = 0; i < inner; ++i) mla::cpu::matmul(ctx, x.data(), T, s.views[0], y.data());
            best = std::min(best, since(t) / inner);
          }
          std::printf("%-13s %5lldx%-6lld %3lld %-8s %9.2f %9.1f\n", mla::weight_format_name(f), (long long)rows,
                      (long long)cols, (long long)T, mla::cpu::precision_name(p), best * 1e6,
                      double(s.bytes) / best / 1e9);
          std::fflush(stdout);
        }
      munmap(const_cast<void*>(s.views[0].data), s.bytes);
    }
  }

  // A prompt's routed experts: 48 tokens through each of 2816 x 2048 bf16 experts (DeepSeek-V2-
  // Lite's gate and up projections), one expert per thread, the set larger than the caches.
  // The fast path (our AMX kernel where the CPU has AMX) against oneDNN's matmul on the same
  // bf16 operands, which packs each expert's weights on every call.
  if (!l2_only && !prompt_only) {
    const int64_t T = 48, N = 2816, K = 2048;
    const int count = int(std::max<size_t>(4, target / size_t(N * K * 2)));
    Set s = make_set(mla::WeightFormat::BF16, N, K, count, huge);
    const mla::cpu::Context fast = in(mla::cpu::Precision::Fast);
    std::vector<float> x(size_t(T * K), 0.01f);
    std::vector<uint16_t> a(size_t(T * K), mla::f32_to_bf16(0.01f));
    const int nt = base.num_threads();
    std::vector<std::vector<float>> y(size_t(nt), std::vector<float>(size_t(T * N)));
    auto pass = [&](bool ours) {
      double best = 1e30;
      for (int r = 0; r < reps; ++r) {
        auto t = Clock::now();
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
        for (int e = 0; e < count; ++e) {
          float* out = y[size_t(omp_get_thread_num())].data();
          if (ours) mla::cpu::matmul(fast, x.data(), T, K, s.views[size_t(e)], out, N);
          else mla::cpu::gemm_bf16_nt(fast, a.data(), T, K, static_cast<const uint16_t*>(s.views[size_t(e)].data), N, K, K, out, N);
        }
        best = std::min(best, since(t));
      }
      return best;
    };
    const double ours = pass(true), onednn = pass(false);
    std::printf("\nexperts: %d of %lldx%lld bf16, %lld tokens each, one per thread: fast path %.1f ms (%.1f GB/s, %.0f "
                "GFLOPS), oneDNN %.1f ms (%.1f GB/s); ours / oneDNN time %.2f\n",
                count, (long long)N, (long long)K, (long long)T, ours * 1e3, double(s.bytes) / ours / 1e9,
                2.0 * T * N * K * count / ours / 1e9, onednn * 1e3, double(s.bytes) / onednn / 1e9, ours / onednn);
    munmap(const_cast<void*>(s.views[0].data), s.bytes);
  }

  // The same 48 tokens through 2816 x 2048 INT4 experts (groups of 32) on the fast precision's
  // kernel for them (the VNNI GEMM where the CPU has no AMX), row-major and repacked at load
  // (INT4_WORDS16), against the peak of that kernel's instruction on the same threads.
  if (!l2_only && !prompt_only) {
    const int64_t T = 48, N = 2816, K = 2048;
    mla::MatrixView probe;
    probe.format = mla::WeightFormat::INT4_GROUP;
    probe.rows = N;
    probe.cols = K;
    const int count = int(std::max<size_t>(4, target / (probe.bytes() + size_t(N * K / 16))));
    const mla::cpu::Context fast = in(mla::cpu::Precision::Fast);
    const mla::cpu::PeakPath path = mla::cpu::prompt_peak_path(fast, true);
    const double peak = mla::cpu::peak_gflops(path, fast.num_threads(), 3, mla::cpu::peak_iters(path, 50));
    std::vector<float> x(size_t(T * K), 0.01f);
    const int nt = base.num_threads();
    std::vector<std::vector<float>> y(size_t(nt), std::vector<float>(size_t(T * N)));
    for (auto f : {mla::WeightFormat::INT4_GROUP, mla::WeightFormat::INT4_WORDS16}) {
      Set s = make_set(f, N, K, count, huge);
      double best = 1e30;
      for (int r = 0; r < reps; ++r) {
        auto t = Clock::now();
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
        for (int e = 0; e < count; ++e)
          mla::cpu::matmul(fast, x.data(), T, K, s.views[size_t(e)], y[size_t(omp_get_thread_num())].data(), N);
        best = std::min(best, since(t));
      }
      const double gops = 2.0 * T * N * K * count / best / 1e9;
      std::printf("%sexperts: %d of %lldx%lld %s, %lld tokens each, one per thread: %.1f ms (%.1f GB/s), %.0f GOPS, "
                  "%.2f of %s's %.0f\n",
                  f == mla::WeightFormat::INT4_GROUP ? "\n" : "", count, (long long)N, (long long)K,
                  mla::weight_format_name(f), (long long)T, best * 1e3, double(s.bytes) / best / 1e9, gops,
                  gops / peak, mla::cpu::peak_path_name(path), peak);
      munmap(const_cast<void*>(s.views[0].data), s.bytes);
    }
  }

  // A 512-token prompt's bf16 products in DeepSeek-V2-Lite's shapes, the weights repacked as at
  // load where the fast precision reads them so (BF16_PAIRS32), against the peak of the prompt
  // path's instruction on the same threads: the dense MLP (gate and up fused, down), the shared
  // experts, the query projection and o_proj.
  if (!l2_only) {
    const int64_t T = 512;
    struct Shape {
      const char* name;
      int64_t rows, cols;
    };
    const Shape shapes[] = {{"dense gate+up", 21888, 2048}, {"dense down", 2048, 10944},
                            {"shared gate+up", 5632, 2048}, {"shared down", 2048, 2816},
                            {"q_proj", 3072, 2048},          {"o_proj", 2048, 2048}};
    const mla::cpu::Context fast = in(mla::cpu::Precision::Fast);
    const mla::cpu::PeakPath path = mla::cpu::prompt_peak_path(fast);
    const double peak = mla::cpu::peak_gflops(path, fast.num_threads(), 3, mla::cpu::peak_iters(path, 50));
    std::printf("\nprompt of %lld tokens, bf16 weights%s, fast precision; ratio to %s's %.0f GFLOPS\n",
                (long long)T, mla::cpu::reads_pairs32(fast) ? " repacked as column pairs" : "",
                mla::cpu::peak_path_name(path), peak);
    for (const Shape& sh : shapes) {
      // Enough matrices that a pass reads them from DRAM, as a prompt's layers do.
      const int count = int(std::max<int64_t>(2, (int64_t(96) << 20) / (sh.rows * sh.cols * 2)));
      Set s = make_set(mla::WeightFormat::BF16, sh.rows, sh.cols, count, huge);
      if (mla::cpu::reads_pairs32(fast))
        for (auto& v : s.views) mla::cpu::repack_pairs32(fast, v);
      const double best = best_pass_seconds(fast, s.views, T, reps + 1) / double(s.views.size());
      const double gflops = 2.0 * T * sh.rows * sh.cols / best / 1e9;
      std::printf("  %-15s %6lld x %5lld: %7.2f ms, %4.0f GFLOPS, %.2f of the peak\n", sh.name, (long long)sh.rows,
                  (long long)sh.cols, best * 1e3, gflops, gflops / peak);
      munmap(const_cast<void*>(s.views[0].data), s.bytes);
    }
  }

  // Prompt: 512 tokens through a 2048 x 2048 bf16 matrix, fast (AMX) and precise.
  if (!l2_only) {
    const int64_t T = 512, N = 2048, K = 2048;
    Set s = make_set(mla::WeightFormat::BF16, N, K, 8, huge);
    for (auto p : {mla::cpu::Precision::Fast, mla::cpu::Precision::Precise}) {
      const double best = best_pass_seconds(in(p), s.views, T, reps + 1) / double(s.views.size());
      std::printf("\nprompt %lldx%lldx%lld bf16 weights, %s: %.2f ms, %.0f GFLOPS", (long long)T, (long long)N,
                  (long long)K, mla::cpu::precision_name(p), best * 1e3, 2.0 * T * N * K / best / 1e9);
    }
    // oneDNN alone on bf16 operands of the same shape (the limit of the fast path).
    std::vector<uint16_t> a(size_t(T * K), mla::f32_to_bf16(0.01f));
    std::vector<float> c(size_t(T * N));
    double best = 1e30;
    for (int r = 0; r < reps + 1; ++r) {
      auto t = Clock::now();
      for (const auto& v : s.views)
        mla::cpu::gemm_bf16_nt(base, a.data(), T, K, static_cast<const uint16_t*>(v.data), N, K, K, c.data(), N);
      best = std::min(best, since(t) / double(s.views.size()));
    }
    std::printf("\noneDNN bf16 matmul alone: %.2f ms, %.0f GFLOPS\n", best * 1e3, 2.0 * T * N * K / best / 1e9);
  }
  return 0;
}
