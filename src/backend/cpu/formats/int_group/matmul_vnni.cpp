// The INT4 / INT8 prompt GEMM on int8 activations (see vnni_gemm.h): per pass of tokens the
// activations quantized to int8, then the weight rows 32 at a time across the threads, the
// WORDS16 formats' blocks read in place, row-major groups reordered into the kernel's order first.
#include <omp.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/common/avx512.h"
#include "backend/cpu/common/gemm_blocking.h"
#include "backend/cpu/formats/activations.h"
#include "backend/cpu/formats/int_group/vnni_gemm.h"
#include "backend/cpu/formats/registry.h"
#include "backend/cpu/parallel.h"

namespace mla::cpu {

using avx512::kChunk;

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
  if (format_kernels(W.format).vnni_bias == 0 || !fused_kernels(W))
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
