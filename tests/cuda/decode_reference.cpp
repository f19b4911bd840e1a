// Reference MLA decode attention and test-problem builder (see decode_reference.h).
#include "decode_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>

#include "tensor/dtype.h"

namespace mla::test {

namespace {

// Counter-based random numbers, so generation parallelises and stays deterministic.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// About normal (sum of four uniforms), mean 0, standard deviation 1.
float noise(uint64_t seed, uint64_t i) {
  uint64_t h = mix(seed * 0x100000001b3ull ^ mix(i));
  float s = 0;
  for (int k = 0; k < 4; ++k) s += float((h >> (16 * k)) & 0xffff) / 65535.0f;
  return (s - 2.0f) * 1.7320508f;
}

}  // namespace

void encode_fp8_row(const float* row, uint8_t* out) {
  for (int b = 0; b < kLatent / 128; ++b) {
    float amax = 0;
    for (int i = b * 128; i < (b + 1) * 128; ++i) amax = std::max(amax, std::fabs(row[i]));
    float scale = amax > 0 ? amax / 448.0f : 1.0f, inv = 1.0f / scale;
    std::memcpy(out + kLatent + 4 * b, &scale, 4);
    for (int i = b * 128; i < (b + 1) * 128; ++i) out[i] = f32_to_fp8e4m3(row[i] * inv);
  }
  for (int i = 0; i < kRope; ++i) {
    uint16_t h = f32_to_bf16(row[kLatent + i]);
    std::memcpy(out + kLatent + 16 + 2 * i, &h, 2);
  }
}

void decode_fp8_row(const uint8_t* in, float* row) {
  for (int i = 0; i < kLatent; ++i) {
    float scale;
    std::memcpy(&scale, in + kLatent + 4 * (i / 128), 4);
    row[i] = fp8e4m3_to_f32(in[i]) * scale;
  }
  for (int i = 0; i < kRope; ++i) {
    uint16_t h;
    std::memcpy(&h, in + kLatent + 16 + 2 * i, 2);
    row[kLatent + i] = bf16_to_f32(h);
  }
}

DecodeProblem make_decode_problem(const std::vector<int32_t>& lengths, int s_q, int h_q, bool fp8, uint64_t seed,
                                  int page_size, int extra_pages) {
  if (lengths.empty() || s_q < 1 || h_q < 1 || page_size < 1 || extra_pages < 1)
    throw std::invalid_argument("make_decode_problem: bad shape");
  DecodeProblem p;
  p.batch = int(lengths.size());
  p.s_q = s_q;
  p.h_q = h_q;
  p.page_size = page_size;
  p.fp8 = fp8;
  p.scale = 1.0f / std::sqrt(192.0f);  // DeepSeek-V3's 1/sqrt(qk_nope + qk_rope)
  p.lengths = lengths;
  int needed = 0;
  for (int32_t l : lengths) {
    if (l < 0) throw std::invalid_argument("make_decode_problem: negative length");
    int n = (l + page_size - 1) / page_size;
    needed += n;
    p.max_pages = std::max(p.max_pages, n);
  }
  p.max_pages = std::max(p.max_pages, 1) + 1;  // one spare column, pointing at a NaN page
  p.num_pages = needed + extra_pages;

  std::mt19937_64 rng(seed);
  std::vector<int32_t> order(size_t(p.num_pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const int32_t nan_page = order[size_t(needed)];  // never written: all NaN
  p.block_table.assign(size_t(p.batch) * p.max_pages, nan_page);
  int next = 0;
  for (int b = 0; b < p.batch; ++b) {
    int n = (lengths[size_t(b)] + page_size - 1) / page_size;
    for (int i = 0; i < n; ++i) p.block_table[size_t(b) * p.max_pages + i] = order[size_t(next++)];
  }

  const size_t nq = size_t(p.batch) * s_q * h_q * kDim;
  p.q.resize(nq);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(nq); ++i) p.q[size_t(i)] = f32_to_bf16(noise(seed ^ 0x5151, uint64_t(i)));

  // 0xff bytes: NaN as bf16, as e4m3, as a float32 scale.
  const int64_t rb = p.row_bytes();
  p.cache.assign(size_t(p.num_pages) * page_size * rb, 0xff);
  for (int b = 0; b < p.batch; ++b) {
    const int len = lengths[size_t(b)];
#pragma omp parallel for schedule(static)
    for (int t = 0; t < len; ++t) {
      float row[kDim];
      const uint64_t base = (uint64_t(b) << 40) + uint64_t(t) * kDim;
      for (int i = 0; i < kDim; ++i) row[i] = noise(seed ^ 0xcace, base + uint64_t(i));
      const int32_t page = p.block_table[size_t(b) * p.max_pages + t / page_size];
      uint8_t* dst = p.cache.data() + (int64_t(page) * page_size + t % page_size) * rb;
      if (fp8) {
        encode_fp8_row(row, dst);
      } else {
        for (int i = 0; i < kDim; ++i) {
          uint16_t h = f32_to_bf16(row[i]);
          std::memcpy(dst + 2 * i, &h, 2);
        }
      }
    }
  }
  return p;
}

void cache_row(const DecodeProblem& p, int b, int t, float* row) {
  const int32_t page = p.block_table[size_t(b) * p.max_pages + t / p.page_size];
  const uint8_t* src = p.cache.data() + (int64_t(page) * p.page_size + t % p.page_size) * p.row_bytes();
  if (p.fp8) {
    decode_fp8_row(src, row);
  } else {
    for (int i = 0; i < kDim; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      row[i] = bf16_to_f32(h);
    }
  }
}

void reference_attend(const float* q, const float* keys, int len, int k0, int k1, int s_q, int h_q, float scale,
                      float* out, float* lse) {
  const int rows = s_q * h_q;
  k0 = std::max(k0, 0);
  k1 = std::min(k1, len);
#pragma omp parallel for schedule(dynamic)
  for (int r = 0; r < rows; ++r) {
    const int i = r / h_q;
    const int end = std::min(k1, len - s_q + i + 1);  // keys [k0, end) are visible
    float* o = out + int64_t(r) * kLatent;
    if (end <= k0) {
      std::fill(o, o + kLatent, 0.0f);
      lse[r] = -std::numeric_limits<float>::infinity();
      continue;
    }
    const float* qr = q + int64_t(r) * kDim;
    std::vector<double> s(size_t(end - k0));
    double mx = -std::numeric_limits<double>::infinity();
    for (int k = k0; k < end; ++k) {
      const float* kr = keys + int64_t(k) * kDim;
      double acc[4] = {0, 0, 0, 0};
      for (int d = 0; d < kDim; d += 4)
        for (int u = 0; u < 4; ++u) acc[u] += double(qr[d + u]) * double(kr[d + u]);
      s[size_t(k - k0)] = (acc[0] + acc[1] + acc[2] + acc[3]) * double(scale);
      mx = std::max(mx, s[size_t(k - k0)]);
    }
    double sum = 0;
    std::vector<double> acc(kLatent, 0.0);
    for (int k = k0; k < end; ++k) {
      const double w = std::exp(s[size_t(k - k0)] - mx);
      sum += w;
      const float* kr = keys + int64_t(k) * kDim;
      for (int d = 0; d < kLatent; ++d) acc[size_t(d)] += w * double(kr[d]);
    }
    for (int d = 0; d < kLatent; ++d) o[d] = float(acc[size_t(d)] / sum);
    lse[r] = float(mx + std::log(sum));
  }
}

void reference_decode(const DecodeProblem& p, std::vector<float>& out, std::vector<float>& lse) {
  const int rows = p.rows();
  out.assign(size_t(p.batch) * rows * kLatent, 0.0f);
  lse.assign(size_t(p.batch) * rows, 0.0f);
  std::vector<float> q(size_t(rows) * kDim), row_lse(static_cast<size_t>(rows));
  for (int b = 0; b < p.batch; ++b) {
    const int len = p.lengths[size_t(b)];
    std::vector<float> keys(size_t(std::max(len, 1)) * kDim);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < len; ++t) cache_row(p, b, t, keys.data() + int64_t(t) * kDim);
    for (size_t i = 0; i < q.size(); ++i) q[i] = bf16_to_f32(p.q[size_t(b) * rows * kDim + i]);
    reference_attend(q.data(), keys.data(), len, 0, len, p.s_q, p.h_q, p.scale,
                     out.data() + size_t(b) * rows * kLatent, row_lse.data());
    for (int r = 0; r < rows; ++r) {
      const int i = r / p.h_q, h = r % p.h_q;
      float v = row_lse[size_t(r)];
      if (v == -std::numeric_limits<float>::infinity()) v = std::numeric_limits<float>::infinity();
      lse[(size_t(b) * p.h_q + h) * p.s_q + i] = v;
    }
  }
}

}  // namespace mla::test
