// The decode GEMVs' driver (see gemv.h): each job's activations prepared once per call on this
// thread (permuted into its format's lane layout for the float32 kernels, rounded to bf16 for the
// VDPBF16PS and AMX ones, quantized to int8 for VPDPBUSD; formats/registry.h says which layout),
// then the rows of all jobs split across the threads by weight bytes in work units, each running
// its format's rows kernel (formats/gemv_rows.h, formats/<format>/kernels.cpp).
//
// In the fast precision (Context::precision == Fast) bf16, FP8 and INT4 weights take the bf16
// kernels: the activations are rounded to bf16 once per call (round to nearest even, permuted
// into the format's word layout), each 64-column step of a row is decoded to bf16 in registers
// (exactly: the weights' values, times 2^-120 for FP8, before the INT4 group scale) and dotted by
// VDPBF16PS, whose products of two bf16 are exact in float32 and summed in float32. F32, F16 and
// INT8 weights keep the float32 kernels in both precisions, and so do products of more tokens
// than Context::gemv_bf16_max_tokens (1 by default), except FP8 products of 2 to 16 tokens where
// the CPU has AMX: those run on tiles of 16 rows (amx.h). Where int8 activations are on, INT4 and
// INT8 repacked at load (INT4_WORDS16, INT8_WORDS16) run on VPDPBUSD over int8 activations, as
// the prompt's VNNI GEMM does, and so do llama.cpp's block formats, on activations quantized in
// their own blocks (FormatKernels::vnni_x, formats/ggml/vnni.h). dispatch.h's gemv_kernel
// decides, per product.
#include "backend/cpu/formats/gemv.h"

#include <omp.h>

#include <algorithm>
#include <span>
#include <vector>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/formats/activations.h"
#include "backend/cpu/formats/gemv_rows.h"
#include "backend/cpu/formats/registry.h"

namespace mla::cpu {

namespace {

using namespace avx512;

// Below this many weights a product runs on the calling thread alone: a parallel region costs a
// few microseconds of fork and barrier (far more when the cores are shared), which is what
// streaming 256K weights takes.
constexpr int64_t kSerialWork = int64_t(1) << 18;
// Weight bytes per dynamically scheduled work unit: a quarter of a thread's share of the call,
// within these bounds. Each unit starts its row streams cold (nothing prefetched ahead of its
// first rows), so larger units read faster: mla bench decode (2 threads, batch 1) with units up
// to 1 MiB against a fixed 192 KiB: fp8 24.7-25.1 against 22.2-22.8 tokens/s, bf16 17.7 against
// 15.9-16.4, int4 21.2-22.5 against 20.3-20.5 (alternating runs); up to 2 MiB, fp8 24.1-24.3.
constexpr double kMinUnitBytes = 192 * 1024, kMaxUnitBytes = 1024 * 1024;

// The kernels of a job: the float32 GEMV (GemvRows), the bf16 ones (GemvFastRows: VDPBF16PS, AMX
// FP8 tiles), the VNNI GEMV of the WORDS16 formats (GemvVnniRows).
enum class Family { F32, Bf16, Vnni };

struct Unit {
  Family family;
  size_t job;
  int64_t n0, n1;
};

// x [T, cols] (row stride ldx) times mul, rounded to bf16 and permuted into the layout of each
// step of 64 columns: out [T, S * 64].
void prepare_bf16(const float* x, int64_t T, int64_t ldx, int64_t S, Layout64 layout, float mul, uint16_t* out) {
  // Each quarter (16 words) of a step draws on one half (32 columns) of the step's activations.
  alignas(64) int32_t idx[4][16];
  bool upper[4];
  for (int q = 0; q < 4; ++q) {
    upper[q] = layout64_col(layout, 16 * q) >= 32;
    for (int l = 0; l < 16; ++l) idx[q][l] = layout64_col(layout, 16 * q + l) - (upper[q] ? 32 : 0);
  }
  __m512i iv[4];
  for (int q = 0; q < 4; ++q) iv[q] = _mm512_load_si512(idx[q]);
  const __m512 f = _mm512_set1_ps(mul);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < S; ++s) {
      const float* src = x + t * ldx + s * kStep;
      const __m512 h[4] = {_mm512_loadu_ps(src), _mm512_loadu_ps(src + 16), _mm512_loadu_ps(src + 32),
                           _mm512_loadu_ps(src + 48)};
      __m512 q[4];
      for (int k = 0; k < 4; ++k)
        q[k] = _mm512_mul_ps(_mm512_permutex2var_ps(h[upper[k] ? 2 : 0], iv[k], h[upper[k] ? 3 : 1]), f);
      uint16_t* dst = out + t * S * kStep + s * kStep;
      _mm512_storeu_si512(dst, (__m512i)_mm512_cvtne2ps_pbh(q[1], q[0]));
      _mm512_storeu_si512(dst + 32, (__m512i)_mm512_cvtne2ps_pbh(q[3], q[2]));
    }
}

// prepare_bf16's values as amx_gemv_fp8_rows16's B tiles: out[s * 64T + p * 2T + 2t + i] holds
// word 2p + i of step s for token t (pair p of the step's 32; pairs 0-15 make the first tile).
// tmp: scratch of T * S * 64 values (unused for one token, whose layouts coincide).
void prepare_amx(const float* x, int64_t T, int64_t ldx, int64_t S, Layout64 layout, float mul, uint16_t* tmp,
                 uint16_t* out) {
  if (T == 1) {
    prepare_bf16(x, T, ldx, S, layout, mul, out);
    return;
  }
  prepare_bf16(x, T, ldx, S, layout, mul, tmp);
  const int64_t pairs = S * kStep / 2;
  const uint32_t* src = reinterpret_cast<const uint32_t*>(tmp);
  uint32_t* dst = reinterpret_cast<uint32_t*>(out);
  for (int64_t p = 0; p < pairs; ++p)
    for (int64_t t = 0; t < T; ++t) dst[p * T + t] = src[t * pairs + p];
}

}  // namespace

void gemv_reference(const float* x, int64_t T, int64_t ldx, const MatrixView& W, float* y, int64_t ldy) {
  std::vector<float> row(static_cast<size_t>(W.cols));
  for (int64_t n = 0; n < W.rows; ++n) {
    W.dequant_row(n, row.data());
    for (int64_t t = 0; t < T; ++t) {
      float s = 0;
      for (int64_t k = 0; k < W.cols; ++k) s += row[size_t(k)] * x[t * ldx + k];
      y[t * ldy + n] = s;
    }
  }
}

void gemv_batch(const Context& ctx, std::span<const GemvJob> jobs) {
  // Jobs without a fast kernel run on the reference; the rest are prepared (activations permuted
  // into the format's lane layout, on this thread; in the fast precision rounded to bf16 for the
  // formats with a bf16 kernel, quantized to int8 for the VNNI GEMV) and split across the
  // threads by weight bytes.
  thread_local std::vector<float> prepared;
  thread_local std::vector<uint16_t> prepared16;
  thread_local std::vector<uint16_t> amx_tmp;
  thread_local std::vector<int8_t> codes;     // the VNNI GEMV's activations: int8 codes,
  thread_local std::vector<float> code_scales;  // a scale per token and chunk,
  thread_local std::vector<int32_t> code_fix;   // and the bias's correction
  thread_local std::vector<uint8_t> own_codes;  // or the format's own (FormatKernels::vnni_x)
  thread_local std::vector<GemvRows> rows;
  thread_local std::vector<GemvFastRows> frows;
  thread_local std::vector<GemvVnniRows> vrows;
  thread_local std::vector<double> cum;  // weight bytes before each fast job
  thread_local std::vector<std::pair<Family, size_t>> order;  // (kernel family, index) of each job in cum
  thread_local std::vector<Unit> units;
  const CpuFeatures feats = features(ctx);
  auto kernel_of = [&](const GemvJob& j) { return gemv_kernel(ctx, j.T, j.W, feats); };
  size_t need = 0, need16 = 0, need8 = 0, need_chunks = 0, need_own = 0;
  for (const auto& j : jobs) {
    if (j.T <= 0 || j.W.rows <= 0) continue;
    const Kernel k = kernel_of(j);
    if (k == Kernel::GemvReference) continue;
    const size_t words = size_t(j.T * (j.W.cols / kStep) * kStep);
    const FormatKernels& fk = format_kernels(j.W.format);
    if (k == Kernel::GemvAmxFp8 || k == Kernel::GemvBf16) need16 += words;
    else if (k == Kernel::GemvVnni && fk.vnni_x) need_own += size_t(j.T) * fk.vnni_x_bytes(j.W.cols);
    else if (k == Kernel::GemvVnni) need8 += size_t(j.T * j.W.cols), need_chunks += size_t(j.T * (j.W.cols / kChunk));
    else need += size_t(j.T * (j.W.cols / kChunk) * kChunk);
  }
  if (prepared.size() < need) prepared.resize(need);
  if (prepared16.size() < need16) prepared16.resize(need16);
  if (codes.size() < need8) codes.resize(need8);
  if (code_scales.size() < need_chunks) code_scales.resize(need_chunks), code_fix.resize(need_chunks);
  if (own_codes.size() < need_own + 64) own_codes.resize(need_own + 64);
  uint8_t* const own_base = own_codes.data() + (-reinterpret_cast<uintptr_t>(own_codes.data()) & 63);
  rows.clear();
  frows.clear();
  vrows.clear();
  cum.clear();
  order.clear();
  double total = 0;
  int64_t weights = 0;
  size_t off = 0, off16 = 0, off8 = 0, off_chunks = 0, off_own = 0;
  for (const auto& j : jobs) {
    if (j.T <= 0 || j.W.rows <= 0) continue;
    const Kernel k = kernel_of(j);
    const FormatKernels& fk = format_kernels(j.W.format);
    if (k == Kernel::GemvReference) {
      gemv_reference(j.x, j.T, j.ldx, j.W, j.y, j.ldy);
      continue;
    }
    if (k == Kernel::GemvVnni && fk.vnni_x) {
      const size_t stride = fk.vnni_x_bytes(j.W.cols);
      uint8_t* xb = own_base + off_own;
      off_own += size_t(j.T) * stride;
      fk.vnni_x(j.x, j.T, j.ldx, j.W.cols, xb);
      order.push_back({Family::Vnni, vrows.size()});
      vrows.push_back(GemvVnniRows{&j.W, nullptr, nullptr, nullptr, j.T, j.y, j.ldy, fk.gemv_vnni, xb, int64_t(stride)});
    } else if (k == Kernel::GemvVnni) {
      const int64_t K = j.W.cols, Kc = K / kChunk;
      int8_t* q = codes.data() + off8;
      float* qs = code_scales.data() + off_chunks;
      int32_t* qc = code_fix.data() + off_chunks;
      off8 += size_t(j.T * K);
      off_chunks += size_t(j.T * Kc);
      activations_int8(j.x, j.T, j.ldx, K, j.W.format, fk.vnni_bias, q, K, qs, qc, Kc);
      order.push_back({Family::Vnni, vrows.size()});
      vrows.push_back(GemvVnniRows{&j.W, q, qs, qc, j.T, j.y, j.ldy, fk.gemv_vnni});
    } else if (k == Kernel::GemvAmxFp8) {
      const int64_t S = j.W.cols / kStep, n = j.T * S * kStep;
      uint16_t* xp = prepared16.data() + off16;
      off16 += size_t(n);
      if (amx_tmp.size() < size_t(n)) amx_tmp.resize(size_t(n));
      prepare_amx(j.x, j.T, j.ldx, S, fk.layout64, fk.bf16_x_scale, amx_tmp.data(), xp);
      order.push_back({Family::Bf16, frows.size()});
      frows.push_back(GemvFastRows{&j.W, j.x, j.ldx, xp, j.T, S, j.W.cols / kChunk, j.y, j.ldy, fk.gemv_amx});
    } else if (k == Kernel::GemvBf16) {
      const int64_t S = j.W.cols / kStep;
      uint16_t* xp = prepared16.data() + off16;
      off16 += size_t(j.T * S * kStep);
      prepare_bf16(j.x, j.T, j.ldx, S, fk.layout64, fk.bf16_x_scale, xp);
      order.push_back({Family::Bf16, frows.size()});
      frows.push_back(GemvFastRows{&j.W, j.x, j.ldx, xp, j.T, S, j.W.cols / kChunk, j.y, j.ldy, fk.gemv_bf16});
    } else {
      const int64_t Kc = j.W.cols / kChunk, width = Kc * kChunk;
      float* xp = prepared.data() + off;
      off += size_t(j.T * width);
      const Layout layout = fk.layout;
      alignas(64) int32_t ia[16], ib[16];
      for (int l = 0; l < 16; ++l) {
        ia[l] = layout_col(layout, l);
        ib[l] = layout_col(layout, 16 + l);
      }
      const __m512i pa = _mm512_load_si512(ia), pb = _mm512_load_si512(ib);
      for (int64_t t = 0; t < j.T; ++t)
        for (int64_t c = 0; c < Kc; ++c) {
          const float* src = j.x + t * j.ldx + c * kChunk;
          const __m512 lo = _mm512_loadu_ps(src), hi = _mm512_loadu_ps(src + 16);
          _mm512_storeu_ps(xp + t * width + c * kChunk, _mm512_permutex2var_ps(lo, pa, hi));
          _mm512_storeu_ps(xp + t * width + c * kChunk + 16, _mm512_permutex2var_ps(lo, pb, hi));
        }
      order.push_back({Family::F32, rows.size()});
      rows.push_back(GemvRows{j.W, j.x, j.ldx, xp, j.T, Kc, j.y, j.ldy, fk.gemv_f32});
    }
    cum.push_back(total);
    total += double(j.W.rows) * double(j.W.row_bytes() + (j.W.scale_bytes() + j.W.rows - 1) / j.W.rows);
    weights += j.W.rows * j.W.cols;
  }
  if (order.empty()) return;
  cum.push_back(total);
  // The workers read this thread's lists (thread_local names would be their own).
  const std::vector<GemvRows>& all = rows;
  const std::vector<GemvFastRows>& fall = frows;
  const std::vector<GemvVnniRows>& vall = vrows;
  // Rows [n0, n1) of job k of family f on its format's rows kernel.
  auto run = [&](Family f, size_t k, int64_t n0, int64_t n1) {
    if (n0 >= n1) return;
    switch (f) {
      case Family::F32: all[k].kernel(all[k], n0, n1); break;
      case Family::Bf16: fall[k].kernel(fall[k], n0, n1); break;
      case Family::Vnni: vall[k].kernel(vall[k], n0, n1); break;
    }
  };
  auto weight_of = [&](Family f, size_t k) -> const MatrixView& {
    return f == Family::F32 ? all[k].W : f == Family::Bf16 ? *fall[k].W : *vall[k].W;
  };
  const int threads = ctx.num_threads();
  const bool serial = weights < kSerialWork || omp_in_parallel() || threads == 1;
  if (serial) {
    for (const auto& [f, k] : order) run(f, k, 0, weight_of(f, k).rows);
    return;
  }
  // Work units of about unit_bytes of weights (whole multiples of 16 rows: AMX tiles and the
  // WORDS16 formats' blocks; of 32 for BF16_PAIRS32's blocks), handed out
  // dynamically: a thread that is descheduled for a while (shared cores) holds up one unit, not
  // half of the product.
  units.clear();
  const double unit_bytes = std::clamp(total / (4.0 * threads), kMinUnitBytes, kMaxUnitBytes);
  for (size_t i = 0; i < order.size(); ++i) {
    const auto [f, k] = order[i];
    const MatrixView& W = weight_of(f, k);
    const int64_t N = W.rows;
    const double row_bytes = (cum[i + 1] - cum[i]) / double(N);
    const int64_t align = std::max<int64_t>(16, format_kernels(W.format).row_block);
    const int64_t step = std::max<int64_t>(align, int64_t(unit_bytes / std::max(1.0, row_bytes)) / align * align);
    for (int64_t n = 0; n < N; n += step) units.push_back({f, k, n, std::min(N, n + step)});
  }
  const std::vector<Unit>& work = units;
  const int64_t nunits = int64_t(work.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t u = 0; u < nunits; ++u) {
    const Unit& w = work[size_t(u)];
    run(w.family, w.job, w.n0, w.n1);
  }
}

void gemv(const Context& ctx, const float* x, int64_t T, int64_t ldx, const MatrixView& W, float* y, int64_t ldy) {
  const GemvJob job{x, T, ldx, W, y, ldy};
  gemv_batch(ctx, std::span<const GemvJob>(&job, 1));
}

}  // namespace mla::cpu
