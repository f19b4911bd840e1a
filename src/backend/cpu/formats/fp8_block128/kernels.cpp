// The kernels of FP8_BLOCK128 weights (decode.h has the layout and the scaling) and their
// registry entry: the float32 and bf16 GEMVs over the tile walk (gemv_rows.h), the rows of one
// 128-row block at a time (they share their scales); the GEMV of 2 to 16 tokens on AMX tiles
// (amx.h); and a row as bf16 for the prompt GEMMs.
#include <algorithm>

#include "backend/cpu/common/amx.h"
#include "backend/cpu/formats/fp8_block128/decode.h"
#include "backend/cpu/formats/gemv_rows.h"
#include "backend/cpu/formats/registry.h"
#include "backend/cpu/formats/rows_bf16.h"

namespace mla::cpu {

namespace avx512 {
namespace {

// Float32 activations: a block's scales folded into the activations (times 2^64).
void fp8_rows_f32(const GemvRows& job, int64_t n0, int64_t n1) {
  const MatrixView& W = job.W;
  const int64_t T = job.T, Kc = job.Kc;
  GemvScratch& sc = gemv_scratch();
  const int64_t width = Kc * kChunk;
  if (sc.xs.size() < size_t(T * width)) sc.xs.resize(size_t(T * width));
  const float* bs = static_cast<const float*>(W.scales);
  for (int64_t s = n0; s < n1;) {
    const int64_t blk = (W.row0 + s) / 128;
    const int64_t e = std::min(n1, (blk + 1) * 128 - W.row0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < Kc; ++c) {
        const __m512 f = _mm512_set1_ps(bs[blk * W.scale_cols + (c * kChunk) / 128] * kFp8XScale);
        const float* src = job.xp + t * width + c * kChunk;
        float* dst = sc.xs.data() + t * width + c * kChunk;
        _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_loadu_ps(src), f));
        _mm512_storeu_ps(dst + 16, _mm512_mul_ps(_mm512_loadu_ps(src + 16), f));
      }
    job.segment<DecFP8>(s, e, sc.xs.data(), kFp8YScale);
    s = e;
  }
}

// bf16 activations: the block's scales multiply the partial sums of their 128 columns.
void fp8_rows_bf16(const GemvFastRows& job, int64_t n0, int64_t n1) {
  const MatrixView* W = job.W;
  const float* scales = static_cast<const float*>(W->scales);
  for (int64_t s = n0; s < n1;) {  // the rows of one 128-row block share their scales
    const int64_t blk = (W->row0 + s) / 128;
    const int64_t e = std::min(n1, (blk + 1) * 128 - W->row0);
    job.segment<BfDecFP8>(s, e, scales + blk * W->scale_cols, kFp8FastPost);
    s = e;
  }
}

// The FP8 rows [n0, n1) on AMX, in tiles of up to 16 rows within one 128-row block.
void fp8_rows_amx(const GemvFastRows& job, int64_t n0, int64_t n1) {
  const MatrixView* W = job.W;
  const int64_t T = job.T, S = job.S, ldy = job.ldy;
  const uint16_t* xp = job.xp;
  float* y = job.y;
  const uint8_t* base = static_cast<const uint8_t*>(W->data);
  const int64_t rb = W->row_bytes();
  alignas(64) float c[kAmxGemvRows * kAmxGemvTokens], fix[kAmxGemvRows * kAmxGemvTokens];
  const float* scales = nullptr;
  // nr rows n, n + gap, ... of one 128-row block.
  auto tile = [&](int64_t n, int64_t gap, int64_t nr) {
    std::fill_n(fix, nr * T, 0.0f);
    amx_gemv_fp8_rows16(base + n * rb, gap * rb, nr, S, T, xp, scales, kAmxGemvRows * gap * rb, c, fix);
    for (int64_t r = 0; r < nr; ++r)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t row = n + r * gap;
        y[t * ldy + row] = job.add_tail<BfDecFP8>(c[r * T + t] * kFp8FastPost + fix[r * T + t] * kFp8FastFix, row, t);
      }
  };
  amx_gemv_begin(T);
  for (int64_t s = n0; s < n1;) {
    const int64_t blk = (W->row0 + s) / 128;
    const int64_t e = std::min(n1, (blk + 1) * 128 - W->row0);
    scales = static_cast<const float*>(W->scales) + blk * W->scale_cols;
    for_each_tile<kAmxGemvRows>(
        s, e, rb, [&](int64_t n, int64_t gap) { tile(n, gap, kAmxGemvRows); },
        [&](int64_t n) { tile(n, 1, e - n); });
    s = e;
  }
  amx_gemv_end();
}

void fp8_row_bf16(const MatrixView& W, int64_t n, uint16_t* out, float*) {
  const int64_t Kc = W.cols / kChunk;
  const float* bs = static_cast<const float*>(W.scales) + ((W.row0 + n) / 128) * W.scale_cols;
  // The decode is 2^-120 times the value: times 2^120 exactly first, then the block scale.
  const __m512 up = _mm512_set1_ps(1329227995784915872903807060280344576.0f);  // 2^120
  const DecFP8 dec{row_bytes_of(W, n)};
  for (int64_t c = 0; c < Kc; ++c) {
    dec.prefetch(c);
    __m512 a, b;
    dec.decode(c, a, b);
    const __m512 s = _mm512_set1_ps(bs[(c * kChunk) / 128]);
    store_bf16x32(out + c * kChunk, _mm512_mul_ps(_mm512_mul_ps(a, up), s), _mm512_mul_ps(_mm512_mul_ps(b, up), s));
  }
}

}  // namespace
}  // namespace avx512

using namespace avx512;

// The registry's entries (formats/registry.cpp).
extern const FormatKernels kFp8Block128Format{.format = WeightFormat::FP8_BLOCK128, .name = "fp8-block128",
    .layout64 = Layout64::Fp8Unpack, .element = fp8_element, .gemv_f32 = fp8_rows_f32, .gemv_bf16 = fp8_rows_bf16,
    .bf16_x_scale = kFp8FastXScale, .gemv_amx = fp8_rows_amx, .row_bf16 = fp8_row_bf16};

}  // namespace mla::cpu
