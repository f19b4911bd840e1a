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
#include "backend/cpu/common/decode_avx512.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/formats/bf16/dpbf16_gemm.h"
#include "backend/cpu/common/gemm_blocking.h"
#include "backend/cpu/formats/bf16/fma_gemm.h"
#include "backend/cpu/common/onednn_threads.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/formats/int_group/vnni_gemm.h"

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

// The 32 source columns of a chunk in lane order, as permutex2var indices (bit 4 picks the
// second vector of 16).
struct ChunkPerm {
  __m512i a, b;
};
ChunkPerm chunk_perm(Layout l) {
  alignas(64) int32_t ia[16], ib[16];
  for (int j = 0; j < 16; ++j) {
    ia[j] = layout_col(l, j);
    ib[j] = layout_col(l, 16 + j);
  }
  return {_mm512_load_si512(ia), _mm512_load_si512(ib)};
}

inline void store_bf16x32(uint16_t* dst, __m512 a, __m512 b) {
  _mm512_storeu_si512(dst, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a)));
}

struct Scratch {
  std::vector<uint16_t> a, w, p;
  std::vector<float> c, f;
  std::vector<uint32_t> pairs;  // the paired VDPBF16PS kernel's activations (pack_activation_pairs)
};

constexpr int64_t kAmxRows = 32;

// The bytes of a pass's bf16 activations (2 K per token, in passes of a multiple of 48 tokens,
// the AMX kernel's token group), read again for every 32 weight rows. AMX: within about 1 MiB,
// half of L2: 240 tokens at K = 2048, 48 at K = 7168. Measured on 2816 x 2048 experts, one per
// thread (2 threads): 256 tokens in one pass ran 1.17 TFLOPS, 512 tokens 1.05.
constexpr int64_t kAmxPassBytes = int64_t(1) << 20;
// The VDPBF16PS kernels run at about half AMX's rate, so a group of tokens read from L3 for every
// 32 rows keeps up with them; a pass's bf16 activations may then take 8 MiB (a quarter of a Zen
// 4 / 5 L3): the whole 512-token prompt at K = 2048, two passes at K = 10944, and every weight
// read once or twice from memory instead of 3 or 11 times. Measured against the 1 MiB passes
// (in-process alternation, 2 threads, Zen 5, 4 copies of each matrix cycled from DRAM, 512
// tokens): 21888 x 2048 1.05-1.07x, 2048 x 10944 1.08-1.15x, 5632 x 2048 1.04x, 2048-row
// products at K = 2048 and 2816 1.00-1.04x.
constexpr int64_t kDpbf16PassBytes = int64_t(8) << 20;
int64_t max_pass_tokens(int64_t K, int64_t bytes) { return std::clamp<int64_t>(bytes / (2 * K) / 48 * 48, 48, 512); }

// Tokens per pass for T tokens: at most max_pass_tokens(K, bytes), the passes of equal size (a
// short last pass would read every weight again for a few tokens).
int64_t pass_tokens(int64_t T, int64_t K, int64_t bytes) {
  const int64_t most = max_pass_tokens(K, bytes), npass = (T + most - 1) / most;
  return (T + npass - 1) / npass;
}

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
  const bool direct = W.format == WeightFormat::BF16;
  // Column pairs as stored (BF16_PAIRS32): the VDPBF16PS and FMA kernels read the blocks in place.
  const bool stored_pairs = W.format == WeightFormat::BF16_PAIRS32 && !amx;
  const bool permute_f32 = fma && !direct && layout_of(W.format) != Layout::Natural;
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
        if (direct || layout_of(W.format) == Layout::Natural) {
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

namespace {

// Calls chunk(t, c, a, b) for every token t < T and chunk c of 32 columns of x, a and b the
// chunk's 32 values in layout l's column order (layout_col).
template <class Chunk>
void for_each_chunk(const float* x, int64_t T, int64_t ldx, int64_t K, Layout l, Chunk&& chunk) {
  const ChunkPerm p = chunk_perm(l);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < K / kChunk; ++c) {
      const float* src = x + t * ldx + c * kChunk;
      const __m512 lo = _mm512_loadu_ps(src), hi = _mm512_loadu_ps(src + 16);
      chunk(t, c, _mm512_permutex2var_ps(lo, p.a, hi), _mm512_permutex2var_ps(lo, p.b, hi));
    }
}

}  // namespace

void activations_bf16(const float* x, int64_t T, int64_t ldx, int64_t K, WeightFormat format, bool permute,
                      uint16_t* dst, int64_t ld) {
  for_each_chunk(x, T, ldx, K, permute ? layout_of(format) : Layout::Natural,
                 [&](int64_t t, int64_t c, __m512 a, __m512 b) { store_bf16x32(dst + t * ld + c * kChunk, a, b); });
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = K / kChunk * kChunk; k < K; ++k) dst[t * ld + k] = f32_to_bf16(x[t * ldx + k]);
}

void activations_f32_permuted(const float* x, int64_t T, int64_t ldx, int64_t K, WeightFormat format, float* dst,
                              int64_t ld) {
  for_each_chunk(x, T, ldx, K, layout_of(format), [&](int64_t t, int64_t c, __m512 a, __m512 b) {
    _mm512_storeu_ps(dst + t * ld + c * kChunk, a);
    _mm512_storeu_ps(dst + t * ld + c * kChunk + 16, b);
  });
  for (int64_t t = 0; t < T; ++t)
    std::copy(x + t * ldx + K / kChunk * kChunk, x + t * ldx + K, dst + t * ld + K / kChunk * kChunk);
}

void activations_int8(const float* x, int64_t T, int64_t ldx, int64_t K, WeightFormat format, int bias, int8_t* q,
                      int64_t ldq, float* qs, int32_t* qc, int64_t lds) {
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for_each_chunk(x, T, ldx, K, layout_of(format), [&](int64_t t, int64_t c, __m512 a, __m512 b) {
    const float m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(a, sign), _mm512_and_ps(b, sign)));
    // A chunk of zeros gets codes 0 and scale 0; otherwise |x| * 127 / m rounds to at most 127.
    const float inv = m > 0 ? 127.0f / m : 0.0f;
    const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(inv)));
    const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(inv)));
    int8_t* dst = q + t * ldq + c * kChunk;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtsepi32_epi8(qa));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), _mm512_cvtsepi32_epi8(qb));
    qs[t * lds + c] = m / 127.0f;
    qc[t * lds + c] = -bias * _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
  });
}

void dequant_rows_bf16(const MatrixView& W, int64_t n0, int64_t n1, uint16_t* dst, int64_t ld) {
  const int64_t K = W.cols, Kc = K / kChunk;
  thread_local std::vector<float> sbuf;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = static_cast<const uint8_t*>(W.data) + size_t(n) * W.row_bytes();
    uint16_t* out = dst + (n - n0) * ld;
    // The rows come from memory (a prompt's experts, read once): each decoder's prefetch runs
    // ahead as in the GEMV kernels. A 512-token FP8 prompt (mla bench) ran 479-499 tokens/s with
    // it against 408-427 without, INT4 559-570 against 506-546 (alternating runs).
    auto run = [&](const auto& dec, auto&& scale_of) {
      for (int64_t c = 0; c < Kc; ++c) {
        dec.prefetch(c);
        __m512 a, b;
        dec.decode(c, a, b);
        const __m512 s = scale_of(c);
        store_bf16x32(out + c * kChunk, _mm512_mul_ps(a, s), _mm512_mul_ps(b, s));
      }
    };
    auto run_fp8 = [&](const float* bs) {
      // The decode is 2^-120 times the value: times 2^120 exactly first, then the block scale.
      const __m512 up = _mm512_set1_ps(1329227995784915872903807060280344576.0f);  // 2^120
      const DecFP8 dec{row};
      for (int64_t c = 0; c < Kc; ++c) {
        dec.prefetch(c);
        __m512 a, b;
        dec.decode(c, a, b);
        const __m512 s = _mm512_set1_ps(bs[(c * kChunk) / 128]);
        store_bf16x32(out + c * kChunk, _mm512_mul_ps(_mm512_mul_ps(a, up), s), _mm512_mul_ps(_mm512_mul_ps(b, up), s));
      }
    };
    const __m512 one = _mm512_set1_ps(1.0f);
    auto unit = [&](int64_t) { return one; };
    switch (W.format) {
      case WeightFormat::F32: run(DecF32{reinterpret_cast<const float*>(row)}, unit); break;
      case WeightFormat::F16: run(DecF16{reinterpret_cast<const uint16_t*>(row)}, unit); break;
      case WeightFormat::BF16: run(DecBF16{reinterpret_cast<const uint16_t*>(row)}, unit); break;
      case WeightFormat::FP8_BLOCK128: {
        run_fp8(static_cast<const float*>(W.scales) + ((W.row0 + n) / 128) * W.scale_cols);
        break;
      }
      case WeightFormat::INT4_GROUP:
      case WeightFormat::INT8_GROUP: {
        if (sbuf.size() < size_t(Kc)) sbuf.resize(size_t(Kc));
        group_chunk_scales(W, n, Kc, sbuf.data());
        if (W.format == WeightFormat::INT4_GROUP) run(DecInt4{row, sbuf.data()}, unit);
        else run(DecInt8{row, sbuf.data()}, unit);
        break;
      }
      case WeightFormat::INT4_WORDS16:
      case WeightFormat::INT8_WORDS16: {  // the VNNI GEMM reads them in place; this is the bf16 GEMMs' way in
        // The row's words gathered from its block (INT8: unbiased again), then as INT4 / INT8 groups.
        const bool int8 = W.format == WeightFormat::INT8_WORDS16;
        const int64_t words_per_row = K / (int8 ? 4 : 8);
        const uint32_t bias = int8 ? 0x80808080u : 0;
        thread_local std::vector<uint32_t> words;
        words.resize(size_t(words_per_row));
        const uint32_t* block = static_cast<const uint32_t*>(W.data) + (n / 16) * 16 * words_per_row;
        for (int64_t d = 0; d < words_per_row; ++d) words[size_t(d)] = block[d * 16 + n % 16] ^ bias;
        if (sbuf.size() < size_t(Kc)) sbuf.resize(size_t(Kc));
        group_chunk_scales(W, n, Kc, sbuf.data());
        const uint8_t* codes = reinterpret_cast<const uint8_t*>(words.data());
        if (int8) run(DecInt8{codes, sbuf.data()}, unit);
        else run(DecInt4{codes, sbuf.data()}, unit);
        break;
      }
      case WeightFormat::BF16_PAIRS32: {  // the GEMMs without AMX read it in place; this is AMX's and oneDNN's way in
        const uint32_t* block = static_cast<const uint32_t*>(W.data) + (n / 32) * 16 * K;
        for (int64_t p = 0; p < K / 2; ++p) std::memcpy(out + 2 * p, block + p * 32 + n % 32, 4);
        break;
      }
    }
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
  if (is_int_group(W.format) && !fast_supported(W))
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
  const bool direct = W.format == WeightFormat::BF16;  // used in place, natural column order
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

namespace {

// Rows [n0, n0 + rows) of W and their group scales into L2.
void prefetch_rows(const MatrixView& W, int64_t n0, int64_t rows) {
  const size_t bytes = size_t(rows) * W.row_bytes(), scale_bytes = size_t(rows * W.scale_cols) * 2;
  const char* p = static_cast<const char*>(W.data) + size_t(n0) * W.row_bytes();
  for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T1);
  const char* sp = static_cast<const char*>(W.scales) + size_t(W.row0 + n0) * size_t(W.scale_cols) * 2;
  for (size_t o = 0; o < scale_bytes; o += 64) _mm_prefetch(sp + o, _MM_HINT_T1);
}

}  // namespace

void matmul_vnni(const Context& ctx, const float* x, int64_t T, int64_t ldx, const MatrixView& W, float* y,
                 int64_t ldy) {
  const int64_t N = W.rows, K = W.cols, Kc = K / kChunk;
  if (T <= 0 || N <= 0) return;
  if (!is_int_group(W.format) || !fast_supported(W))
    throw std::invalid_argument(std::string("matmul_vnni: ") + weight_format_name(W.format) + " weights, group size " +
                                std::to_string(W.group_size) + ": needs INT4 or INT8 groups of a multiple of 32");
  const int bias = vnni_weight_bias(W.format);
  struct Codes {
    std::vector<int8_t> q;
    std::vector<float> s;
    std::vector<int32_t> c;
  };
  thread_local Codes a;
  constexpr int64_t kRows = 16;
  const int64_t blocks = (N + kRows - 1) / kRows;
  // Passes of AMX's token counts, whose codes (a byte a column) stay within about 512 KiB, read
  // again for every block of rows (each pass repacks every weight).
  const int64_t pass = pass_tokens(T, K, kAmxPassBytes);
  for (int64_t t0 = 0; t0 < T; t0 += pass) {
    const int64_t tn = std::min(pass, T - t0);
    if (a.q.size() < size_t(tn * K)) a.q.resize(size_t(tn * K));
    if (a.s.size() < size_t(tn * Kc)) a.s.resize(size_t(tn * Kc)), a.c.resize(size_t(tn * Kc));
    int8_t* const q = a.q.data();  // the workers below see this thread's codes through these
    float* const qs = a.s.data();
    int32_t* const qc = a.c.data();
    parallel_region(ctx, true, [&] {
#pragma omp for schedule(static)
      for (int64_t tb = 0; tb < (tn + 15) / 16; ++tb) {
        const int64_t m0 = tb * 16, mn = std::min<int64_t>(16, tn - m0);
        activations_int8(x + (t0 + m0) * ldx, mn, ldx, K, W.format, bias, q + m0 * K, K, qs + m0 * Kc, qc + m0 * Kc, Kc);
      }
      if (is_words16(W.format)) {  // blocks of 16 rows in the kernel's order, two at a time
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b += 2) {
          const int64_t n0 = b * kRows, nr = std::min(2 * kRows, N - n0);
          if (n0 + nr < N) prefetch_rows(W, n0 + nr, std::min(2 * kRows, N - n0 - nr));
          vnni_gemm_words16(q, qs, qc, tn, K, Kc, W, n0, nr, y + t0 * ldy + n0, ldy);
        }
        return;
      }
      // Pairs of blocks (32 rows), each reordered into this thread's buffer (a last block of
      // fewer than 32 rows alone).
#pragma omp for schedule(static)
      for (int64_t b = 0; b < blocks; b += 2) {
        const int64_t n0 = b * kRows, nr = std::min(2 * kRows, N - n0);
        struct Tag;
        const size_t words = size_t(K / 4 * kRows), scales_n = size_t(Kc * kRows);
        uint32_t* const packed = thread_buffer<Tag, uint32_t>(2 * words + 2 * scales_n);
        float* const scales = reinterpret_cast<float*>(packed + 2 * words);
        vnni_pack_rows16(W, n0, std::min(kRows, nr), packed, scales);
        if (nr > kRows) vnni_pack_rows16(W, n0 + kRows, nr - kRows, packed + words, scales + scales_n);
        // The next blocks' codes and scales (contiguous) into L2 while these compute: the 16
        // rows' strided loads of the pack alone leave most of DRAM's latency exposed.
        if (n0 + nr < N) prefetch_rows(W, n0 + nr, std::min(2 * kRows, N - n0 - nr));
        float* const yb = y + t0 * ldy + n0;
        if (nr == 2 * kRows) {
          vnni_gemm_rows32(q, qs, qc, tn, K, K, Kc, packed, scales, yb, ldy);
        } else {
          vnni_gemm_rows16(q, qs, qc, tn, K, K, Kc, packed, scales, std::min(kRows, nr), yb, ldy);
          if (nr > kRows) vnni_gemm_rows16(q, qs, qc, tn, K, K, Kc, packed + words, scales + scales_n, nr - kRows,
                                           yb + kRows, ldy);
        }
      }
    });
  }
}

}  // namespace mla::cpu
