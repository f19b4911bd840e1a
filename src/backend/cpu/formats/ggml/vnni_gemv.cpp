// The decode GEMV of the ggml block formats on int8 activations and the quantizers of those
// activations (vnni.h), for their registry entries (kernels.cpp).
#include "backend/cpu/formats/ggml/kernels.h"

#ifdef MLA_GGML_VNNI
#include "backend/cpu/formats/ggml/vnni.h"

namespace mla::cpu::ggml {

namespace {

using avx512::GemvVnniRows;

template <class F>
void kquant_rows(const GemvVnniRows& job, int64_t n0, int64_t n1) {
  const int64_t K = job.W->cols;
  const XLayout L = x_layout(K, 256);
  vnni_rows(job, n0, n1, [&](auto tn, auto r, const uint8_t* row, size_t gap, const uint8_t* x, float* y, int64_t ygap) {
    kquant_tile<F, decltype(tn)::value, decltype(r)::value>(row, gap, K, x, job.xstride, L, y, job.ldy, ygap);
  });
}

template <class F>
void block32_rows(const GemvVnniRows& job, int64_t n0, int64_t n1) {
  const int64_t K = job.W->cols;
  const XLayout L = x_layout(K, 32);
  vnni_rows(job, n0, n1, [&](auto tn, auto r, const uint8_t* row, size_t gap, const uint8_t* x, float* y, int64_t ygap) {
    block32_tile<F, decltype(tn)::value, decltype(r)::value>(row, gap, K, x, job.xstride, L, y, job.ldy, ygap);
  });
}

}  // namespace

void q4_0_rows_vnni(const GemvVnniRows& job, int64_t n0, int64_t n1) { block32_rows<BQ4_0>(job, n0, n1); }
void q4_1_rows_vnni(const GemvVnniRows& job, int64_t n0, int64_t n1) { block32_rows<BQ4_1>(job, n0, n1); }
void q5_0_rows_vnni(const GemvVnniRows& job, int64_t n0, int64_t n1) { block32_rows<BQ5_0>(job, n0, n1); }
void q5_1_rows_vnni(const GemvVnniRows& job, int64_t n0, int64_t n1) { block32_rows<BQ5_1>(job, n0, n1); }
void q8_0_rows_vnni(const GemvVnniRows& job, int64_t n0, int64_t n1) { block32_rows<BQ8_0>(job, n0, n1); }
void q2_k_rows_vnni(const GemvVnniRows& job, int64_t n0, int64_t n1) { kquant_rows<KQ2>(job, n0, n1); }
void q3_k_rows_vnni(const GemvVnniRows& job, int64_t n0, int64_t n1) { kquant_rows<KQ3>(job, n0, n1); }
void q4_k_rows_vnni(const GemvVnniRows& job, int64_t n0, int64_t n1) { kquant_rows<KQ4>(job, n0, n1); }
void q5_k_rows_vnni(const GemvVnniRows& job, int64_t n0, int64_t n1) { kquant_rows<KQ5>(job, n0, n1); }
void q6_k_rows_vnni(const GemvVnniRows& job, int64_t n0, int64_t n1) { kquant_rows<KQ6>(job, n0, n1); }

size_t block32_x_bytes(int64_t K) { return size_t(x_layout(K, 32).bytes); }
void block32_x(const float* x, int64_t T, int64_t ldx, int64_t K, uint8_t* out) { quantize_x<32>(x, T, ldx, K, out); }
size_t kquant_x_bytes(int64_t K) { return size_t(x_layout(K, 256).bytes); }
void kquant_x(const float* x, int64_t T, int64_t ldx, int64_t K, uint8_t* out) { quantize_x<256>(x, T, ldx, K, out); }
void q2_k_x(const float* x, int64_t T, int64_t ldx, int64_t K, uint8_t* out) {
  quantize_x<256, Order::Q2>(x, T, ldx, K, out);
}
void kquant_x_k4(const float* x, int64_t T, int64_t ldx, int64_t K, uint8_t* out) {
  quantize_x<256, Order::K4>(x, T, ldx, K, out);
}

}  // namespace mla::cpu::ggml

#endif  // MLA_GGML_VNNI
