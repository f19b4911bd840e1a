// A Kimi-K2-sized expert projection with INT4 weights (compressed-tensors: 4 bits per value and
// a bf16 scale per 32, dequantized inside the kernel) against the same projection in bf16:
// gate/up [2048 x 7168] and down [7168 x 2048], one token (decode) and a batch of 16. Enough
// copies of each matrix are cycled through that every product reads DRAM (L3 here is 480 MiB).
// Prints time per product, effective GB/s of weight read (scales included), the INT4 / bf16
// speed ratio, and each figure against the AVX-512 read loop measured in the same run.
//
//   bench/int4_expert [--quick] [--threads N]
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/precision.h"
#include "matrix_pass.h"
#include "tools/bench.h"
#include "tensor/dtype.h"
#include "tensor/matrix.h"

namespace {

struct Set {
  std::vector<mla::MatrixView> views;
  size_t bytes = 0;
  void* mem = nullptr;
  size_t len = 0;
  ~Set() {
    if (mem) munmap(mem, len);
  }
};

// `count` copies of a rows x cols matrix in bf16 or INT4 (group 32), values like trained weights.
void fill(Set& s, mla::WeightFormat f, int64_t rows, int64_t cols, int count) {
  mla::MatrixView v;
  v.format = f;
  v.rows = rows;
  v.cols = cols;
  if (f == mla::WeightFormat::INT4_GROUP) {
    v.group_size = 32;
    v.scale_cols = cols / 32;
  }
  const size_t wb = v.bytes(), sb = v.scale_bytes(), one = wb + sb;
  s.len = one * size_t(count);
  s.mem = mmap(nullptr, s.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (s.mem == MAP_FAILED) throw std::runtime_error("mmap failed");
  madvise(s.mem, s.len, MADV_HUGEPAGE);
  uint8_t* base = static_cast<uint8_t*>(s.mem);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  uint8_t pool[8192];
  for (size_t k = 0; k < sizeof pool; k += 2) {
    const uint16_t h = mla::f32_to_bf16(nd(rng));
    if (f == mla::WeightFormat::BF16) std::memcpy(pool + k, &h, 2);
    else pool[k] = uint8_t(rng()), pool[k + 1] = uint8_t(rng());
  }
  const uint16_t scale = mla::f32_to_bf16(0.003f);
#pragma omp parallel for
  for (int i = 0; i < count; ++i) {
    uint8_t* w = base + one * size_t(i);
    for (size_t k = 0; k < wb; k += 2048) std::memcpy(w + k, pool + (k / 2048 * 64) % 4096, std::min<size_t>(2048, wb - k));
    for (size_t k = 0; k < sb; k += 2) std::memcpy(w + wb + k, &scale, 2);
  }
  for (int i = 0; i < count; ++i) {
    v.data = base + one * size_t(i);
    v.scales = sb ? base + one * size_t(i) + wb : nullptr;
    s.views.push_back(v);
  }
  s.bytes = s.len;
}

// Seconds per product: best of `reps` passes over every copy.
double per_product(const mla::cpu::Context& ctx, const Set& s, int64_t T, int reps) {
  return best_pass_seconds(ctx, s.views, T, reps) / double(s.views.size());
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  mla::cpu::Context ctx;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--threads" && i + 1 < argc) ctx.threads = std::max(0, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: int4_expert [--quick] [--threads N]\n");
      return 2;
    }
  }
  const int reps = quick ? 2 : 5;
  const size_t target = quick ? (size_t(1) << 30) : (size_t(3) << 29);  // bytes per set
  const double bw = mla::bench::read_bandwidth_gbps(size_t(2) << 30, reps, ctx.threads);
  std::printf("Kimi-K2 expert projection, INT4 (group 32, bf16 scales) vs bf16; %d threads\n", ctx.num_threads());
  std::printf("read loop (AVX-512, 2 GiB): %.1f GB/s\n\n", bw);
  std::printf("%-11s %-9s %-8s %10s %8s %9s %12s\n", "shape", "tokens", "format", "us/product", "GB/s", "vs loop",
              "int4 speedup");
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{2048, 7168}, {7168, 2048}}) {
    Set bf, q4;
    const int nbf = int(std::max<size_t>(4, target / size_t(rows * cols * 2)));
    const int nq4 = int(std::max<size_t>(4, target / size_t(rows * cols / 2 + rows * cols / 16)));
    fill(bf, mla::WeightFormat::BF16, rows, cols, nbf);
    fill(q4, mla::WeightFormat::INT4_GROUP, rows, cols, nq4);
    struct Case {
      int64_t T;
      mla::cpu::Precision p;
      const char* name;
    };
    for (const Case& c : {Case{1, mla::cpu::Precision::Precise, "1"}, Case{16, mla::cpu::Precision::Fast, "16 fast"},
                          Case{16, mla::cpu::Precision::Precise, "16 precise"}}) {
      ctx.precision = c.p;
      const double tb = per_product(ctx, bf, c.T, reps), tq = per_product(ctx, q4, c.T, reps);
      const double gb_bf = double(bf.bytes) / double(bf.views.size()) / tb / 1e9;
      const double gb_q4 = double(q4.bytes) / double(q4.views.size()) / tq / 1e9;
      char shape[32];
      std::snprintf(shape, sizeof shape, "%lldx%lld", (long long)rows, (long long)cols);
      std::printf("%-11s %-9s %-8s %10.1f %8.1f %9.2f\n", shape, c.name, "bf16", tb * 1e6, gb_bf, gb_bf / bw);
      std::printf("%-11s %-9s %-8s %10.1f %8.1f %9.2f %12.2f\n", shape, c.name, "int4", tq * 1e6, gb_q4, gb_q4 / bw,
                  tb / tq);
    }
  }
  return 0;
}
