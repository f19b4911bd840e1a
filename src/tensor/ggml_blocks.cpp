// The reference dequantizers of llama.cpp's block formats (ggml_blocks.h), written from ggml's
// block layouts (ggml-common.h) and its dequantize_row_* order of operations. Built with
// -ffp-contract=off (CMakeLists.txt): ggml's reference and gguf-py's numpy round each product
// and difference to float32, and a fused multiply-add would not.
#include "tensor/ggml_blocks.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "tensor/dtype.h"

namespace mla {

namespace {

constexpr int64_t kQK = 32;   // values per block of Q4_0 .. Q8_0
constexpr int64_t kQKK = 256;  // values per super-block of the K-quants

float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Q4_0: f16 d, 16 bytes of nibbles; value j (low nibble of byte j) and j + 16 (high nibble).
void q4_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = float((qs[j] & 0xF) - 8) * d;
    y[j + 16] = float((qs[j] >> 4) - 8) * d;
  }
}

// Q4_1: f16 d, f16 m, 16 bytes of nibbles; value q d + m.
void q4_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = float(qs[j] & 0xF) * d + m;
    y[j + 16] = float(qs[j] >> 4) * d + m;
  }
}

// Q5_0: f16 d, 32 fifth bits (qh, little-endian word), 16 bytes of nibbles; value (q - 16) d.
void q5_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int x0 = int((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10)) - 16;
    const int x1 = int((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
    y[j] = float(x0) * d;
    y[j + 16] = float(x1) * d;
  }
}

// Q5_1: f16 d, f16 m, qh, nibbles; value q d + m.
void q5_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int x0 = int((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10));
    const int x1 = int((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10));
    y[j] = float(x0) * d + m;
    y[j + 16] = float(x1) * d + m;
  }
}

// Q8_0: f16 d, 32 int8.
void q8_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = float(qs[j]) * d;
}

// Q2_K: 16 bytes of 4-bit scale | 4-bit min (one per 16 values), 64 bytes of 2-bit codes, f16 d,
// f16 dmin; value d (sc & 15) q - dmin (sc >> 4).
void q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  const float d = half_at(b + 80), dmin = half_at(b + 82);
  int is = 0;
  for (int n = 0; n < kQKK; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half = 0; half < 2; ++half) {
        const uint8_t sc = scales[is++];
        const float dl = d * float(sc & 0xF), ml = dmin * float(sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * float((q[l + 16 * half] >> shift) & 3) - ml;
      }
    }
    q += 32;
  }
}

// Q3_K: 32 bytes of high bits (hmask), 64 bytes of 2-bit codes, 12 bytes of sixteen 6-bit scales,
// f16 d; value d (scale - 32) (q - (high bit clear ? 4 : 0)).
void q3_k(const uint8_t* b, float* y) {
  const uint8_t* hm = b;
  const uint8_t* q = b + 32;
  const float d_all = half_at(b + 108);
  uint32_t aux[4];
  std::memcpy(aux, b + 96, 12);
  constexpr uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
  const uint32_t tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
  aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
  int8_t scales[16];
  std::memcpy(scales, aux, 16);
  int is = 0;
  uint8_t m = 1;
  for (int n = 0; n < kQKK; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half = 0; half < 2; ++half) {
        const float dl = d_all * float(scales[is++] - 32);
        for (int l = 16 * half; l < 16 * half + 16; ++l)
          *y++ = dl * float(int((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
      }
      m = uint8_t(m << 1);
    }
    q += 32;
  }
}

// The 6-bit scale and min of sub-block j of Q4_K and Q5_K (12 bytes for 8 sub-blocks).
void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q4_K: f16 d, f16 dmin, 12 bytes of scales and mins, 128 bytes of nibbles: 64 values per 32
// bytes (low nibbles, then high); value d sc q - dmin m.
void q4_k(const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int j = 0, is = 0; j < kQKK; j += 64, is += 2, q += 32) {
    uint8_t sc, m;
    scale_min_k4(is, scales, sc, m);
    const float d1 = d * float(sc), m1 = dmin * float(m);
    scale_min_k4(is + 1, scales, sc, m);
    const float d2 = d * float(sc), m2 = dmin * float(m);
    for (int l = 0; l < 32; ++l) *y++ = d1 * float(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * float(q[l] >> 4) - m2;
  }
}

// Q5_K: Q4_K with a fifth bit per value in 32 bytes of qh (bit 2i and 2i + 1 for the i-th 64).
void q5_k(const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0, is = 0; j < kQKK; j += 64, is += 2, ql += 32) {
    uint8_t sc, m;
    scale_min_k4(is, scales, sc, m);
    const float d1 = d * float(sc), m1 = dmin * float(m);
    scale_min_k4(is + 1, scales, sc, m);
    const float d2 = d * float(sc), m2 = dmin * float(m);
    for (int l = 0; l < 32; ++l) *y++ = d1 * float((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * float((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    u1 = uint8_t(u1 << 2);
    u2 = uint8_t(u2 << 2);
  }
}

// Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales (one per 16 values),
// f16 d; value d scale (q - 32).
void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  for (int n = 0; n < kQKK; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = int((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = int((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * float(sc[is]) * float(q1);
      y[l + 32] = d * float(sc[is + 2]) * float(q2);
      y[l + 64] = d * float(sc[is + 4]) * float(q3);
      y[l + 96] = d * float(sc[is + 6]) * float(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

}  // namespace

GgmlBlock ggml_block(WeightFormat f) {
  switch (f) {
    case WeightFormat::Q4_0: return {kQK, 18};
    case WeightFormat::Q4_1: return {kQK, 20};
    case WeightFormat::Q5_0: return {kQK, 22};
    case WeightFormat::Q5_1: return {kQK, 24};
    case WeightFormat::Q8_0: return {kQK, 34};
    case WeightFormat::Q2_K: return {kQKK, 84};
    case WeightFormat::Q3_K: return {kQKK, 110};
    case WeightFormat::Q4_K: return {kQKK, 144};
    case WeightFormat::Q5_K: return {kQKK, 176};
    case WeightFormat::Q6_K: return {kQKK, 210};
    default: return {0, 0};
  }
}

void ggml_dequantize(WeightFormat f, const void* blocks, int64_t n, float* out) {
  const GgmlBlock blk = ggml_block(f);
  if (blk.values == 0 || n % blk.values)
    throw std::invalid_argument(std::string("ggml_dequantize: ") + weight_format_name(f) + ", " + std::to_string(n) +
                                " values: not a whole number of blocks of a ggml block format");
  void (*one)(const uint8_t*, float*) = nullptr;
  switch (f) {
    case WeightFormat::Q4_0: one = q4_0; break;
    case WeightFormat::Q4_1: one = q4_1; break;
    case WeightFormat::Q5_0: one = q5_0; break;
    case WeightFormat::Q5_1: one = q5_1; break;
    case WeightFormat::Q8_0: one = q8_0; break;
    case WeightFormat::Q2_K: one = q2_k; break;
    case WeightFormat::Q3_K: one = q3_k; break;
    case WeightFormat::Q4_K: one = q4_k; break;
    case WeightFormat::Q5_K: one = q5_k; break;
    case WeightFormat::Q6_K: one = q6_k; break;
    default: break;
  }
  const uint8_t* b = static_cast<const uint8_t*>(blocks);
  for (int64_t i = 0; i < n / blk.values; ++i) one(b + size_t(i) * blk.bytes, out + i * blk.values);
}

}  // namespace mla
