// AVX-512 helpers of the CPU kernels. Internal to src/backend/cpu.
// - exp on 16 float lanes, for the element-wise parts of the forward pass: SiLU and the attention
//   softmax, tens of millions of exponentials per prompt. Cody-Waite reduction x = n ln2 + r
//   (|r| <= ln2/2, ln2 split in two so r is exact to float rounding), a degree-6 polynomial for
//   e^r (Cephes' expf coefficients), and 2^n applied by vscalefps, which also gives +inf above
//   ~88.7 and 0 / subnormals below. Within 2 ulp of expf over the float range
//   (tests/backend/test_vec_math.cpp checks it against std::exp).
// - The maximum of a row (the attention's softmax).
// - FlushDenormals, a scoped FTZ/DAZ for the attention's softmax.
// - A 16 x 16 float transpose (the AMX kernel's packing and results, the attention's values).
#pragma once
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on _mm512_undefined_ps() (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>

namespace mla::cpu::vec {

inline __m512 exp(__m512 x) {
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 ln2_hi = _mm512_set1_ps(0.693359375f), ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
  // Beyond these the result is inf or 0 anyway; clamping keeps n in scalef's range.
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-110.0f)), _mm512_set1_ps(89.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, ln2_hi, x);
  r = _mm512_fnmadd_ps(n, ln2_lo, r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// The largest of x[0..n), n >= 1, 16 lanes at a time (a NaN may be passed over, as
// std::max_element passes it over after the first element).
inline float max_of(const float* x, int64_t n) {
  __m512 m = _mm512_set1_ps(x[0]);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
  if (i < n) m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, __mmask16((1u << (n - i)) - 1), x + i));
  return _mm512_reduce_max_ps(m);
}

// x[i] <- exp(x[i] - m) for i < n; returns their sum (sixteen float32 lane sums, added in
// double: the rows of a softmax are at most a context long).
inline double exp_shifted(float* x, int64_t n, float m) {
  const __m512 mv = _mm512_set1_ps(m);
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = exp(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
    _mm512_storeu_ps(x + i, e);
    acc = _mm512_add_ps(acc, e);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc);
  double s = 0;
  for (float v : lanes) s += v;
  for (; i < n; ++i) s += (x[i] = std::exp(x[i] - m));
  return s;
}

// Flush-to-zero and denormals-are-zero (MXCSR) for the calling thread while in scope. A softmax
// over widely spread scores makes probabilities below 2^-126: as subnormal floats each costs a
// microcode assist in every instruction that touches it (a 512-token prompt's attention ran 2.5x
// slower on the development VM with FP8 weights); flushed, they are 0, as the AMX products read
// subnormal bf16 anyway. Such values are far below the rounding of the softmax's sums (at least 1).
class FlushDenormals {
 public:
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040); }  // FTZ | DAZ
  ~FlushDenormals() { _mm_setcsr(saved_); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned saved_;
};

// out[j] = column j of the 16 x 16 block in (rows ld floats apart; rows from `rows` on read as
// zero), in four rounds of AVX-512 shuffles.
inline void transpose16(const float* in, int64_t ld, int64_t rows, __m512 out[16]) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_loadu_ps(in + ld * i) : _mm512_setzero_ps();
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int j = 0; j < 4; ++j) {
    r[4 * j + 0] = _mm512_shuffle_ps(t[4 * j], t[4 * j + 2], 0x44);
    r[4 * j + 1] = _mm512_shuffle_ps(t[4 * j], t[4 * j + 2], 0xEE);
    r[4 * j + 2] = _mm512_shuffle_ps(t[4 * j + 1], t[4 * j + 3], 0x44);
    r[4 * j + 3] = _mm512_shuffle_ps(t[4 * j + 1], t[4 * j + 3], 0xEE);
  }
  for (int i : {0, 1, 2, 3, 8, 9, 10, 11}) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
  }
  for (int i = 0; i < 8; ++i) {
    out[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    out[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
  }
}

}  // namespace mla::cpu::vec
