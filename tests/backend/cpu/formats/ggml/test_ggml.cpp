// llama.cpp's block formats (formats/ggml/): each format's float32 decoder, read back through the
// GEMV, equals the reference (tensor/ggml_blocks.h) bit for bit; the decode GEMVs of 1 to 16
// tokens (float32, and on int8 activations) and the prompt's bf16 GEMMs match W x in double over
// odd row counts and columns of several blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/formats/bf16/dpbf16_gemm.h"
#include "backend/cpu/formats/gemm.h"
#include "backend/cpu/formats/gemv.h"
#include "backend/cpu/formats/matrices.h"
#include "backend/cpu/formats/registry.h"
#include "tensor/ggml_blocks.h"

namespace {

using namespace mla::test;
using mla::MatrixView;
using mla::WeightFormat;

const WeightFormat kGgml[] = {WeightFormat::Q4_0, WeightFormat::Q4_1, WeightFormat::Q5_0, WeightFormat::Q5_1,
                              WeightFormat::Q8_0, WeightFormat::Q2_K, WeightFormat::Q3_K, WeightFormat::Q4_K,
                              WeightFormat::Q5_K, WeightFormat::Q6_K};

// Row lengths of one block, a few, and many (17 blocks of 32: not a multiple of 16 blocks).
std::vector<int64_t> cols_of(WeightFormat f) {
  if (mla::ggml_block(f).values == 32) return {32, 96, 544};
  return {256, 768, 1280};
}

std::string name_of(WeightFormat f, int64_t rows, int64_t cols, int64_t T) {
  return std::string(mla::weight_format_name(f)) + " " + std::to_string(rows) + "x" + std::to_string(cols) +
         " T=" + std::to_string(T);
}

TEST(Ggml, Float32DecodersEqualTheReference) {
  // Token t's activations are the unit vector e_{k0 + t}: each output of the float32 GEMV is then
  // one decoded weight times 1 among FMAs of zeros (exact), which must equal dequant_row's.
  std::mt19937 rng(41);
  for (WeightFormat f : kGgml) {
    const int64_t rows = 5, cols = cols_of(f)[1], T = 16;
    ASSERT_EQ(mla::cpu::gemv_kernel(kPrecise, T, MatrixView{f, rows, cols}, mla::cpu::host_features()),
              mla::cpu::Kernel::GemvF32);
    Owned m = random_matrix(f, rows, cols, rng);
    std::vector<float> ref(size_t(rows * cols));
    for (int64_t n = 0; n < rows; ++n) m.view.dequant_row(n, ref.data() + n * cols);
    for (int64_t k0 = 0; k0 < cols; k0 += T) {
      std::vector<float> x(size_t(T * cols), 0.0f), y(size_t(T * rows));
      for (int64_t t = 0; t < T; ++t) x[size_t(t * cols + k0 + t)] = 1.0f;
      mla::cpu::gemv(kPrecise, x.data(), T, cols, m.view, y.data(), rows);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t n = 0; n < rows; ++n)
          ASSERT_EQ(y[size_t(t * rows + n)], ref[size_t(n * cols + k0 + t)])
              << mla::weight_format_name(f) << " row " << n << " column " << k0 + t;
    }
  }
}

TEST(Ggml, GemvMatchesReference) {
  // The float32 GEMV of any token count: decoded weights exact (above), each output summed in 32
  // chains of cols / 32 FMAs (a lane of a chunk's two halves), the halves added and the 16
  // lanes summed in 5 more: at most (cols / 32 + 5) roundings, (cols / 32 + 8) 2^-24 of the sum
  // of the terms' magnitudes against W x in double.
  std::mt19937 rng(43);
  for (WeightFormat f : kGgml)
    for (int64_t rows : {1, 3, 7, 33, 130})
      for (int64_t cols : cols_of(f)) {
        Owned m = random_matrix(f, rows, cols, rng);
        for (int64_t T = 1; T <= 16; ++T) {
          const int64_t ldx = cols + 3, ldy = rows + 5;
          auto x = random_vec(size_t(T * ldx), rng);
          std::vector<float> y(size_t(T * ldy), -1.0f);
          mla::cpu::gemv(kPrecise, x.data(), T, ldx, m.view, y.data(), ldy);
          expect_close_bf16(m.view, x.data(), T, ldx, y, ldy, (double(cols) / 32 + 8) * std::ldexp(1.0, -24), 1e-30,
                            false, name_of(f, rows, cols, T), false);
          for (int64_t t = 0; t < T; ++t)
            for (int64_t n = rows; n < ldy; ++n) ASSERT_EQ(y[size_t(t * ldy + n)], -1.0f) << "wrote past the rows";
        }
      }
}

TEST(Ggml, PromptGemmsMatchReference) {
  // The prompt's bf16 GEMMs on rows decoded through row_bf16 (Bf16Weights::Decoded): the decoded
  // weights rounded to bf16 are the reference's rounded (the float32 decoders are exact), so the
  // bounds of test_matmul.cpp's prompt-sized products hold: VDPBF16PS (cols / 16 + 16) 2^-24 of
  // the terms on bf16 activations, its paired kernel and the FMA kernel (cols + 16) 2^-24 (FMA:
  // float32 activations); AMX tiles, where the CPU has them, (cols / 2 + 16) 2^-24.
  std::mt19937 rng(47);
  for (auto vg : {mla::cpu::Context::VectorGemm::Vdpbf16ps, mla::cpu::Context::VectorGemm::Fma}) {
    mla::cpu::Context ctx = kFastBf16;
    ctx.vector_gemm = vg;
    for (WeightFormat f : kGgml)
      for (int64_t rows : {33, 77})
        for (int64_t cols : cols_of(f))
          for (int64_t T : {13, 17, 40, 70}) {
            Owned m = random_matrix(f, rows, cols, rng);
            const int64_t ldx = cols + 3, ldy = rows + 5;
            auto x = random_vec(size_t(T * ldx), rng);
            std::vector<float> y(size_t(T * ldy), -1.0f);
            mla::cpu::matmul_bf16(ctx, x.data(), T, ldx, m.view, y.data(), ldy);
            const mla::cpu::Kernel k = mla::cpu::gemm_bf16_kernel(T, m.view, mla::cpu::features(ctx));
            const bool fma = k == mla::cpu::Kernel::FmaGemm;
            const bool pairs = k == mla::cpu::Kernel::Dpbf16Gemm && T >= mla::cpu::kDpbf16PairsMinTokens;
            const double per_column = fma || pairs ? 1.0 : k == mla::cpu::Kernel::AmxGemm ? 0.5 : 1.0 / 16;
            expect_close_bf16(m.view, x.data(), T, ldx, y, ldy, (double(cols) * per_column + 16) * std::ldexp(1.0, -24),
                              0.0, true, name_of(f, rows, cols, T) + " on " + mla::cpu::kernel_name(k), !fma);
            for (int64_t t = 0; t < T; ++t)
              for (int64_t n = rows; n < ldy; ++n) ASSERT_EQ(y[size_t(t * ldy + n)], -1.0f) << "wrote past the rows";
          }
  }
}

// The activations as the VNNI GEMV quantizes them (formats/ggml/vnni.h: per block of B columns,
// s = amax / 127 and q = round(x * (127 / amax)) in float32, to nearest even), as s * q, and s.
struct Quantized {
  std::vector<double> xq;    // s * q per column
  std::vector<double> half;  // s / 2 per column: the most |x - s q| can be (see below)
};
Quantized quantize(const float* x, int64_t K, int64_t B) {
  Quantized r{std::vector<double>(size_t(K)), std::vector<double>(size_t(K))};
  for (int64_t b = 0; b < K; b += B) {
    float amax = 0;
    for (int64_t k = b; k < b + B; ++k) amax = std::max(amax, std::fabs(x[k]));
    const float inv = amax > 0 ? 127.0f / amax : 0.0f, s = amax / 127.0f;
    for (int64_t k = b; k < b + B; ++k) {
      const float p = x[k] * inv;
      r.xq[size_t(k)] = double(s) * std::nearbyint(p);
      r.half[size_t(k)] = double(s) / 2;
    }
  }
  return r;
}

// The bytes of a block that hold its codes, and the byte that makes every code 0 as the VNNI
// kernels read them (unsigned; Q8_0's q + 128): the block then holds only its offsets (or mins).
struct CodeBytes {
  size_t begin, end;
  uint8_t zero;
};
CodeBytes code_bytes(WeightFormat f) {
  switch (f) {
    case WeightFormat::Q4_0: return {2, 18, 0};
    case WeightFormat::Q4_1: return {4, 20, 0};
    case WeightFormat::Q5_0: return {2, 22, 0};
    case WeightFormat::Q5_1: return {4, 24, 0};
    case WeightFormat::Q8_0: return {2, 34, 0x80};
    case WeightFormat::Q2_K: return {16, 80, 0};
    case WeightFormat::Q3_K: return {0, 96, 0};
    case WeightFormat::Q4_K: return {16, 144, 0};
    case WeightFormat::Q5_K: return {16, 176, 0};
    default: return {0, 192, 0};  // Q6_K
  }
}

// The VNNI GEMV (fast precision, int8 activations) of T tokens against two references.
// (1) W times the activations quantized as the kernel does them (quantize, above), in double:
// the kernel's integer sums are exact, so its error is float32 rounding alone: per output lane a
// chain of one FMA per super-block (two with mins) or pair of blocks, plus per term the scale
// products (d times the token's scale, the block's scale times its sum), a conversion and the 4
// steps of the horizontal sum, all within (cols / 32 + 16) 2^-24 of the magnitude of what it
// sums. That magnitude counts each weight's parts apart, w = a - o with o the offset or min
// (the weight its block gives code 0) and a = w + o (the code's part), as the kernel adds
// d s sum(u q) and subtracts the offsets' d s sum(q) separately: sum_k (|a_k| + |o_k|) |s q_k|.
// (2) W x in double on the unquantized activations: the activation quantization error, at most
// half a scale a column, |x - s q| <= s / 2 (1 + 1e-4): q rounds fl(x fl(127 / amax)) to nearest,
// and the float32 roundings of 127 / amax, of x times it and of amax / 127 move it by a few
// hundred 2^-24 of s at most; so |y - W x| <= sum_k |w_k| s_k / 2 (1 + 1e-4) + (1)'s bound.
void check_vnni(const MatrixView& W, const float* x, int64_t T, int64_t ldx, const std::vector<float>& y, int64_t ldy,
                const std::string& what) {
  const int64_t K = W.cols, B = mla::ggml_block(W.format).values;
  const mla::GgmlBlock blk = mla::ggml_block(W.format);
  const CodeBytes cb = code_bytes(W.format);
  std::vector<float> row(static_cast<size_t>(K)), offs(static_cast<size_t>(K));
  std::vector<uint8_t> zeroed(W.row_bytes());
  int bad = 0;
  for (int64_t n = 0; n < W.rows; ++n) {
    W.dequant_row(n, row.data());
    std::memcpy(zeroed.data(), static_cast<const uint8_t*>(W.data) + size_t(n) * W.row_bytes(), zeroed.size());
    for (size_t o = 0; o < zeroed.size(); o += blk.bytes) std::fill(&zeroed[o + cb.begin], &zeroed[o + cb.end], cb.zero);
    mla::ggml_dequantize(W.format, zeroed.data(), K, offs.data());
    for (int64_t t = 0; t < T; ++t) {
      const Quantized q = quantize(x + t * ldx, K, B);
      double ref_q = 0, mag_q = 0, ref = 0, quant = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double w = row[size_t(k)], o = -double(offs[size_t(k)]);
        ref_q += w * q.xq[size_t(k)];
        mag_q += (std::fabs(w + o) + std::fabs(o)) * std::fabs(q.xq[size_t(k)]);
        ref += w * x[t * ldx + k];
        quant += std::fabs(w) * q.half[size_t(k)];
      }
      const double a = y[size_t(t * ldy + n)], round = (double(K) / 32 + 16) * std::ldexp(1.0, -24) * mag_q + 1e-30;
      if (!(std::fabs(a - ref_q) <= round) && bad++ < 5)
        ADD_FAILURE() << what << " row " << n << " token " << t << ": " << a << " vs " << ref_q
                      << " on the quantized activations (error " << std::fabs(a - ref_q) << ", bound " << round << ")";
      if (!(std::fabs(a - ref) <= quant * (1 + 1e-4) + round) && bad++ < 5)
        ADD_FAILURE() << what << " row " << n << " token " << t << ": " << a << " vs " << ref << " (error "
                      << std::fabs(a - ref) << ", quantization bound " << quant << ")";
    }
  }
}

TEST(Ggml, VnniGemvMatchesReference) {
  std::mt19937 rng(53);
  for (WeightFormat f : kGgml) {
    if (!mla::cpu::format_kernels(f).gemv_vnni) continue;  // built without GFNI: the float32 GEMV
    for (int64_t rows : {1, 3, 7, 33, 130})
      for (int64_t cols : cols_of(f)) {
        Owned m = random_matrix(f, rows, cols, rng);
        for (int64_t T = 1; T <= 16; ++T) {
          ASSERT_EQ(mla::cpu::gemv_kernel(kFast, T, m.view, mla::cpu::host_features()), mla::cpu::Kernel::GemvVnni);
          const int64_t ldx = cols + 3, ldy = rows + 5;
          auto x = random_vec(size_t(T * ldx), rng);
          if (T == 3)  // a block of zeros (scale 0) and one of a single large value
            for (int64_t k = 0; k < std::min<int64_t>(cols, 64); ++k) x[size_t(ldx + k)] = k == 40 ? 1e3f : k < 32 ? 0.0f : x[size_t(ldx + k)];
          std::vector<float> y(size_t(T * ldy), -1.0f);
          mla::cpu::gemv(kFast, x.data(), T, ldx, m.view, y.data(), ldy);
          check_vnni(m.view, x.data(), T, ldx, y, ldy, "vnni " + name_of(f, rows, cols, T));
          for (int64_t t = 0; t < T; ++t)
            for (int64_t n = rows; n < ldy; ++n) ASSERT_EQ(y[size_t(t * ldy + n)], -1.0f) << "wrote past the rows";
        }
      }
  }
}

TEST(Ggml, VnniGemvBatchAcrossThreads) {
  // Every format in one gemv_batch call (each job's activations quantized into its own span),
  // beside an INT4 job on another kernel, large enough to split across threads, in work units
  // that start mid-matrix.
  std::mt19937 rng(59);
  mla::cpu::Context ctx = kFast;
  ctx.threads = 4;
  std::vector<Owned> mats;
  std::vector<std::vector<float>> ys;
  std::vector<mla::cpu::GemvJob> jobs;
  const int64_t K = 2048, T = 2;
  auto x = random_vec(size_t(T * K), rng);
  for (WeightFormat f : kGgml) mats.push_back(random_matrix(f, 301, K, rng));
  mats.push_back(random_matrix(WeightFormat::INT4_GROUP, 301, K, rng));
  for (auto& m : mats) {
    ys.emplace_back(size_t(T * 301), -1.0f);
    jobs.push_back({x.data(), T, K, m.view, ys.back().data(), 301});
  }
  mla::cpu::gemv_batch(ctx, jobs);
  for (size_t i = 0; i < mats.size(); ++i) {
    const MatrixView& W = mats[i].view;
    const std::string what = std::string("batch ") + mla::weight_format_name(W.format);
    if (mla::cpu::gemv_kernel(ctx, T, W, mla::cpu::host_features()) == mla::cpu::Kernel::GemvVnni) {
      check_vnni(W, x.data(), T, K, ys[i], 301, what);
    } else {
      std::vector<float> ref(size_t(T * 301));
      mla::cpu::gemv_reference(x.data(), T, K, W, ref.data(), 301);
      expect_close(W, x.data(), T, K, ys[i], ref, 301, 1e-5, what);
    }
  }
}

}  // namespace
