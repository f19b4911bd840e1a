// bf16 GEMMs on oneDNN's matmul primitive (see gemm.h). The activations are converted once per
// call into a zero-padded bf16 block of M_pad rows (M bucketed, so the number of distinct
// primitive shapes stays small: creating one takes milliseconds, running a cached one does not),
// the result lands in a float32 block and is copied to y.
#include "backend/cpu/formats/gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/common/amx.h"
#include "backend/cpu/common/avx512.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/formats/bf16/dpbf16_gemm.h"
#include "backend/cpu/common/gemm_blocking.h"
#include "backend/cpu/formats/bf16/fma_gemm.h"
#include "backend/cpu/common/onednn_threads.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/formats/registry.h"
#include "backend/cpu/formats/rows_bf16.h"
#include "tensor/dtype.h"

namespace mla::cpu {

namespace {

using namespace avx512;

// Output columns per GEMM call: bounds the float32 result block (M_pad x kBlockN).
constexpr int64_t kBlockN = 8192;
// Rows dequantized per block for non-bf16 weights (bf16 copy of 1024 x K stays in L3).
constexpr int64_t kDequantRows = 1024;

// Padded row counts: a multiple of 16 up to 256 (an expert's share of a prompt lands anywhere
// in there, and padding 65 rows to 128 would double its work), coarser above.
int64_t bucket_rows(int64_t M) {
  if (M <= 256) return (M + 15) / 16 * 16;
  if (M <= 1024) return (M + 63) / 64 * 64;
  return (M + 255) / 256 * 256;
}

// Primitives by shape, with the scratchpad each needs: user-managed and reused (left to oneDNN,
// the packed copy of B would be allocated and page-faulted in again on every call).
struct Prim {
  dnnl::matmul prim;
  size_t scratch_bytes = 0;
};
struct Dnnl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  std::mutex mu;
  // By (M, N, K, lda, ldb, ldc, threads): oneDNN blocks a primitive for the threads it will run on.
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int>, std::unique_ptr<Prim>> prims;
};
Dnnl& dnnl_state() {
  static Dnnl d;
  return d;
}


struct Scratch {
  std::vector<uint16_t> a, w, p;
  std::vector<float> c, f;
  std::vector<uint32_t> pairs;  // the paired VDPBF16PS kernel's activations (pack_activation_pairs)
};

constexpr int64_t kAmxRows = 32;


// The AMX, VDPBF16PS and FMA paths of matmul_bf16, the weight rows split across the threads 32
// at a time. bf16 weights are read where they lie; other formats are decoded to bf16 32 rows at
// a time into a per-thread buffer (a short last block is padded). The activations, per pass of
// tokens: converted to bf16 (and packed into B tiles for amx_gemm_rows32, into column pairs per
// token group for the paired VDPBF16PS kernel; dpbf16_gemm_rows32 reads them row-major), or for
// fma_gemm_rows32 left in float32, permuted into the decoded rows' column order where that
// differs (INT4).
void matmul_packed(const Context& ctx, const float* x, int64_t T, int64_t ldx, const MatrixView& W, float* y,
                   int64_t ldy, Kernel kernel, Scratch& s) {
  const bool amx = kernel == Kernel::AmxGemm, fma = kernel == Kernel::FmaGemm;
  const bool dpbf16 = kernel == Kernel::Dpbf16Gemm;
  const int64_t N = W.rows, K = W.cols;
  const FormatKernels& fk = format_kernels(W.format);
  const bool direct = fk.bf16_weights == Bf16Weights::InPlace;
  // Column pairs as stored (BF16_PAIRS32): the VDPBF16PS and FMA kernels read the blocks in place.
  const bool stored_pairs = fk.bf16_weights == Bf16Weights::Pairs32 && !amx;
  const bool permute_f32 = fma && !direct && fk.layout != Layout::Natural;
  const int64_t blocks = (N + kAmxRows - 1) / kAmxRows;
  const int64_t pass = pass_tokens(T, K, dpbf16 ? kDpbf16PassBytes : kAmxPassBytes);
  for (int64_t t0 = 0; t0 < T; t0 += pass) {
    const int64_t tn = std::min(pass, T - t0);
    const bool pairs = dpbf16 && (tn >= kDpbf16PairsMinTokens || stored_pairs);
    if (!fma && !pairs && s.a.size() < size_t(tn * K)) s.a.resize(size_t(tn * K));
    if (amx && s.p.size() < size_t(amx_packed_size(tn, K))) s.p.resize(size_t(amx_packed_size(tn, K)));
    if (permute_f32 && s.f.size() < size_t(tn * K)) s.f.resize(size_t(tn * K));
    if (pairs && s.pairs.size() < size_t(tn * K / 2)) s.pairs.resize(size_t(tn * K / 2));
    const uint16_t* xa = s.a.data();
    const uint16_t* xp = s.p.data();
    const float* xf = permute_f32 ? s.f.data() : x + t0 * ldx;
    const int64_t ldf = permute_f32 ? K : ldx;
    parallel_region(ctx, true, [&] {
    // The paired kernel's activations: each token group converted to bf16 and packed as column
    // pairs in one pass (through this thread's buffer where the weights' columns are permuted),
    // the groups split across the threads.
    if (pairs) {
#pragma omp for schedule(static)
      for (int64_t g = 0; g < token_group_count(tn, kDpbf16PairsTokens); ++g) {
        const TokenGroup tg = token_group(tn, kDpbf16PairsTokens, g);
        uint32_t* const out = s.pairs.data() + tg.t0 * (K / 2);
        if (direct || fk.layout == Layout::Natural) {
          pack_activation_pair_group(x + (t0 + tg.t0) * ldx, tg.n, K, ldx, out);
          continue;
        }
        struct Tag;
        uint16_t* const rows = thread_buffer<Tag, uint16_t>(size_t(tg.n * K));
        activations_bf16(x + (t0 + tg.t0) * ldx, tg.n, ldx, K, W.format, true, rows, K);
        pack_activation_pair_group(rows, tg.n, K, K, out);
      }
    } else if (!fma || permute_f32) {
      // Otherwise to bf16 (and packed), or permuted, 16 tokens (one token tile) per iteration.
#pragma omp for schedule(static)
      for (int64_t tb = 0; tb < (tn + 15) / 16; ++tb) {
        const int64_t m0 = tb * 16, mn = std::min<int64_t>(16, tn - m0);
        if (fma) {
          activations_f32_permuted(x + (t0 + m0) * ldx, mn, ldx, K, W.format, s.f.data() + m0 * K, K);
          continue;
        }
        activations_bf16(x + (t0 + m0) * ldx, mn, ldx, K, W.format, !direct, s.a.data() + m0 * K, K);
        if (amx) amx_pack_activations(s.a.data() + m0 * K, mn, K, K, s.p.data() + m0 * K);
      }
    }
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t n0 = b * kAmxRows, nr = std::min(kAmxRows, N - n0);
      thread_local std::vector<uint16_t> rows;  // decoded or padded rows
      const uint16_t* w = static_cast<const uint16_t*>(W.data) + n0 * K;
      float* yb = y + t0 * ldy + n0;
      if (stored_pairs) {  // whole blocks of 32 rows
        const uint32_t* p = reinterpret_cast<const uint32_t*>(w);
        if (fma) fma_gemm_packed_rows32(xf, tn, K, ldf, p, nr, yb, ldy);
        else dpbf16_gemm_packed_rows32(s.pairs.data(), tn, K, p, b + 1 < blocks ? p + 16 * K : nullptr, nr, yb, ldy);
        continue;
      }
      if (!direct || nr < kAmxRows) {
        if (rows.size() < size_t(kAmxRows * K)) rows.resize(size_t(kAmxRows * K));
        if (direct) std::copy(w, w + nr * K, rows.data());
        else dequant_rows_bf16(W, n0, n0 + nr, rows.data(), K);
        std::fill(rows.begin() + nr * K, rows.begin() + kAmxRows * K, uint16_t(0));
        w = rows.data();
      }
      const bool prefetch = direct && nr == kAmxRows;
      if (amx) amx_gemm_rows32(xp, tn, K, w, K, nr, prefetch, yb, ldy);
      else if (fma) fma_gemm_rows32(xf, tn, K, ldf, w, K, nr, yb, ldy);
      else if (pairs) dpbf16_gemm_pairs_rows32(s.pairs.data(), tn, K, w, K, nr, prefetch, yb, ldy);
      else dpbf16_gemm_rows32(xa, tn, K, K, w, K, nr, prefetch, yb, ldy);
    }
    });
  }
}

}  // namespace



void dequant_rows_bf16(const MatrixView& W, int64_t n0, int64_t n1, uint16_t* dst, int64_t ld) {
  const int64_t K = W.cols, Kc = K / kChunk;
  const FormatKernels& fk = format_kernels(W.format);
  thread_local std::vector<float> scales;  // the row's group scales per chunk (INT4, INT8)
  if (scales.size() < size_t(Kc)) scales.resize(size_t(Kc));
  for (int64_t n = n0; n < n1; ++n) {
    uint16_t* out = dst + (n - n0) * ld;
    fk.row_bf16(W, n, out, scales.data());
    for (int64_t k = Kc * kChunk; k < K; ++k) out[k] = f32_to_bf16(element(W, n, k));
  }
}

void gemm_bf16_nt(const Context& ctx, const uint16_t* A, int64_t M, int64_t lda, const uint16_t* B, int64_t N,
                  int64_t ldb, int64_t K, float* C, int64_t ldc) {
  using dnnl::memory;
  using dt = memory::data_type;
  Dnnl& d = dnnl_state();
  const OneDnnThreads threads(ctx);  // for the primitive's creation and its run
  const auto key = std::make_tuple(M, N, K, lda, ldb, ldc, omp_in_parallel() ? 1 : ctx.num_threads());
  Prim* prim;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    auto& slot = d.prims[key];
    if (!slot) {
      memory::desc a_md({M, K}, dt::bf16, {lda, 1});
      memory::desc b_md({K, N}, dt::bf16, {1, ldb});
      memory::desc c_md({M, N}, dt::f32, {ldc, 1});
      try {
        dnnl::primitive_attr attr;
        attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
        dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, d.eng);
        slot = std::make_unique<Prim>(Prim{dnnl::matmul(pd), pd.scratchpad_desc().get_size()});
      } catch (const dnnl::error& e) {
        throw std::runtime_error("oneDNN bf16 matmul " + std::to_string(M) + "x" + std::to_string(N) + "x" +
                                 std::to_string(K) + ": " + e.what());
      }
    }
    prim = slot.get();
  }
  memory::desc a_md({M, K}, dt::bf16, {lda, 1});
  memory::desc b_md({K, N}, dt::bf16, {1, ldb});
  memory::desc c_md({M, N}, dt::f32, {ldc, 1});
  memory am(a_md, d.eng, const_cast<uint16_t*>(A)), bm(b_md, d.eng, const_cast<uint16_t*>(B)), cm(c_md, d.eng, C);
  thread_local std::vector<uint8_t> scratch;
  if (scratch.size() < prim->scratch_bytes) scratch.resize(prim->scratch_bytes);
  memory sm(memory::desc({int64_t(prim->scratch_bytes)}, dt::u8, {1}), d.eng, scratch.data());
  prim->prim.execute(d.strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sm}});
  d.strm.wait();
}

void matmul_bf16(const Context& ctx, const float* x, int64_t T, int64_t ldx, const MatrixView& W, float* y,
                 int64_t ldy) {
  const int64_t N = W.rows, K = W.cols;
  if (T <= 0 || N <= 0) return;
  if (!fused_kernels(W))
    throw std::invalid_argument(std::string("matmul_bf16: ") + weight_format_name(W.format) + " group size " + std::to_string(W.group_size) +
                                " is not a multiple of 32");
  thread_local Scratch s;
  // Our AMX kernel for up to 127 tokens (an expert's share of a prompt or of a batch; dispatch.h),
  // oneDNN's matmul above: on one 2816 x 2048 bf16 matrix split over 2 threads, ours ran 796,
  // 932 and 935 GFLOPS at 64, 128 and 256 tokens against oneDNN's 820, 1006 and 1213; on 186
  // experts of that shape read from DRAM, 48 tokens each, one per thread (bench/matmul), ours
  // read 19.9 GB/s of weights and oneDNN, which packs the weights on every call, 14.3.
  // Without AMX (or with ctx.amx false) every product with K % 32 == 0 runs on VDPBF16PS, so
  // that path's figures are its own (oneDNN would pick AMX on a machine that has it).
  if (const Kernel k = gemm_bf16_kernel(T, W, features(ctx)); k == Kernel::AmxGemm || k == Kernel::Dpbf16Gemm || k == Kernel::FmaGemm) {
    matmul_packed(ctx, x, T, ldx, W, y, ldy, k, s);
    return;
  }
  const bool direct = format_kernels(W.format).bf16_weights == Bf16Weights::InPlace;  // natural column order
  // 128 tokens and more, or no AMX, or K not a multiple of 32: oneDNN's matmul on bf16
  // operands, bf16 weights as they are stored, other formats dequantized a block of rows at a
  // time.
  const int64_t Mp = bucket_rows(T);
  if (s.a.size() < size_t(Mp * K)) s.a.resize(size_t(Mp * K));
  uint16_t* const a = s.a.data();  // the workers below see this thread's scratch through these
  // The conversion and the copy of the result run on every thread: a prompt makes dozens of
  // these calls, and on one thread they left the others idle for milliseconds each.
  parallel_for(ctx, (T + 15) / 16, T >= 64, [&](int64_t i) {
    const int64_t t0 = i * 16;
    activations_bf16(x + t0 * ldx, std::min<int64_t>(16, T - t0), ldx, K, W.format, !direct, a + t0 * K, K);
  });
  std::fill(a + T * K, a + Mp * K, uint16_t(0));
  const int64_t nb = direct ? kBlockN : std::min(kBlockN, kDequantRows);
  // When no rows were padded, oneDNN writes y itself.
  const bool in_place = Mp == T;
  if (!in_place && s.c.size() < size_t(Mp * std::min(N, nb))) s.c.resize(size_t(Mp * std::min(N, nb)));
  float* const c = s.c.data();
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int64_t bn = std::min(nb, N - n0);
    const uint16_t* B;
    if (direct) {
      B = static_cast<const uint16_t*>(W.data) + n0 * K;
    } else {
      if (s.w.size() < size_t(bn * K)) s.w.resize(size_t(bn * K));
      uint16_t* w = s.w.data();
      parallel_for(ctx, (bn + 15) / 16, true, [&](int64_t i) {
        const int64_t r = i * 16;
        dequant_rows_bf16(W, n0 + r, std::min(bn, r + 16) + n0, w + r * K, K);
      });
      B = w;
    }
    if (in_place) {
      gemm_bf16_nt(ctx, a, Mp, K, B, bn, K, K, y + n0, ldy);
      continue;
    }
    gemm_bf16_nt(ctx, a, Mp, K, B, bn, K, K, c, bn);
    parallel_for(ctx, T, T >= 64, [&](int64_t t) { std::copy(c + t * bn, c + (t + 1) * bn, y + t * ldy + n0); });
  }
}



}  // namespace mla::cpu
