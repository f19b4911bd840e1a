// Tests of the CUDA MLA decode kernel. Always: the split-KV schedule, the CPU reference
// (against the engine's absorb attention, a hand-computed case and the LSE merge of split
// ranges), the FP8 row layout against kv/latent_pool and the NaN-poisoned problem builder.
// With a Hopper GPU: the kernel against the reference over the batch / s_q / length / h_q /
// cache-dtype grid; otherwise those tests are skipped with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cuda/decode_schedule.h"
#include "decode_reference.h"
#include "kv/latent_pool.h"
#include "tensor/dtype.h"

#if MLA_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/mla_decode.h"
#endif

namespace {

using mla::cuda::DecodePiece;
using mla::cuda::DecodeSchedule;
using mla::cuda::schedule_decode;
using namespace mla::test;
constexpr float kInf = std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------
// Schedule

void check_schedule(const std::vector<int32_t>& lengths, int s_q, int h_q, int num_sms) {
  SCOPED_TRACE("batch " + std::to_string(lengths.size()) + " s_q " + std::to_string(s_q) + " h_q " +
               std::to_string(h_q) + " sms " + std::to_string(num_sms));
  const int batch = int(lengths.size());
  const int cost = 4;
  DecodeSchedule s = schedule_decode(lengths.data(), batch, s_q, h_q, num_sms, 64, cost);
  ASSERT_EQ(s.rows, s_q * h_q);
  EXPECT_GE(s.tile_rows * s.num_m_tiles, s.rows);
  EXPECT_LT(s.tile_rows * (s.num_m_tiles - 1), s.rows);
  EXPECT_LE(s.num_parts * s.num_m_tiles, std::max(num_sms, s.num_m_tiles));
  ASSERT_EQ(int(s.part_begin.size()), s.num_parts + 1);
  EXPECT_EQ(s.part_begin.front(), 0);
  EXPECT_EQ(s.part_begin.back(), int(s.pieces.size()));
  for (int p = 0; p < s.num_parts; ++p) EXPECT_LE(s.part_begin[size_t(p)], s.part_begin[size_t(p) + 1]);

  // Every block of every sequence exactly once, in order; an empty sequence has one empty piece.
  std::vector<int32_t> next(size_t(batch), 0), pieces(size_t(batch), 0);
  int64_t total = 0;
  for (int b = 0; b < batch; ++b) total += (lengths[size_t(b)] + 63) / 64 + cost;
  const double target = std::max(double(total) / s.num_parts + cost, double(cost + 1));
  std::vector<int> slot_seen(size_t(s.num_slots), 0);
  for (int p = 0; p < s.num_parts; ++p) {
    int64_t part_cost = 0;
    for (int i = s.part_begin[size_t(p)]; i < s.part_begin[size_t(p) + 1]; ++i) {
      const DecodePiece& pc = s.pieces[size_t(i)];
      ASSERT_GE(pc.batch, 0);
      ASSERT_LT(pc.batch, batch);
      EXPECT_EQ(pc.block_begin, next[size_t(pc.batch)]);
      EXPECT_LE(pc.block_begin, pc.block_end);
      next[size_t(pc.batch)] = pc.block_end;
      ++pieces[size_t(pc.batch)];
      part_cost += pc.block_end - pc.block_begin + cost;
      if (s.num_splits[size_t(pc.batch)] > 1) {
        ASSERT_GE(pc.slot, s.split_begin[size_t(pc.batch)]);
        ASSERT_LT(pc.slot, s.split_begin[size_t(pc.batch)] + s.num_splits[size_t(pc.batch)]);
        ++slot_seen[size_t(pc.slot)];
        EXPECT_LT(pc.block_begin, pc.block_end) << "a split piece without blocks";
      } else {
        EXPECT_EQ(pc.slot, -1);
      }
    }
    EXPECT_LE(double(part_cost), target + 2 * cost + 2) << "part " << p << " is overloaded";
  }
  for (int b = 0; b < batch; ++b) {
    EXPECT_EQ(next[size_t(b)], (lengths[size_t(b)] + 63) / 64) << "sequence " << b;
    EXPECT_EQ(pieces[size_t(b)], s.num_splits[size_t(b)]);
    EXPECT_GE(s.num_splits[size_t(b)], 1);
  }
  for (int c : slot_seen) EXPECT_EQ(c, 1);
}

TEST(MlaDecodeSchedule, CoversEveryBlockOnceAndBalances) {
  std::mt19937 rng(7);
  for (int sms : {1, 3, 78, 132}) {
    for (int s_q : {1, 2, 4})
      for (int h_q : {1, 16, 24, 64, 128}) {
        check_schedule({1}, s_q, h_q, sms);
        check_schedule({0}, s_q, h_q, sms);
        check_schedule({4096}, s_q, h_q, sms);
        check_schedule({0, 20, 0, 140, 65}, s_q, h_q, sms);
      }
    for (int batch : {2, 6, 64, 128}) {
      std::vector<int32_t> lengths(static_cast<size_t>(batch));
      for (int32_t& l : lengths) l = int32_t(rng() % 9000);
      lengths[0] = 0;
      check_schedule(lengths, 2, 128, sms);
      check_schedule(lengths, 1, 16, sms);
    }
  }
}

TEST(MlaDecodeSchedule, SplitsLongSequencesAcrossSms) {
  std::vector<int32_t> one = {8192};
  DecodeSchedule s = schedule_decode(one.data(), 1, 1, 16, 132);
  EXPECT_EQ(s.tile_rows, 16);
  EXPECT_EQ(s.num_parts, 132);
  EXPECT_GT(s.num_splits[0], 64) << "one long sequence should spread over most SMs";
  std::vector<int32_t> many(128, 4096);
  s = schedule_decode(many.data(), 128, 2, 128, 132);
  EXPECT_EQ(s.tile_rows, 64);
  EXPECT_EQ(s.num_m_tiles, 4);
  EXPECT_EQ(s.num_parts, 33);
}

TEST(MlaDecodeSchedule, RejectsBadInput) {
  std::vector<int32_t> l = {5, -1};
  EXPECT_THROW(schedule_decode(l.data(), 2, 1, 16, 132), std::invalid_argument);
  EXPECT_THROW(schedule_decode(l.data(), 1, 0, 16, 132), std::invalid_argument);
  EXPECT_THROW(schedule_decode(l.data(), 1, 5, 16, 132), std::invalid_argument);
  EXPECT_THROW(schedule_decode(l.data(), 1, 1, 129, 132), std::invalid_argument);
  EXPECT_THROW(schedule_decode(l.data(), 1, 1, 0, 132), std::invalid_argument);
  EXPECT_THROW(schedule_decode(l.data(), 0, 1, 16, 132), std::invalid_argument);
  EXPECT_THROW(schedule_decode(l.data(), 1, 1, 16, 0), std::invalid_argument);
  EXPECT_THROW(schedule_decode(nullptr, 1, 1, 16, 132), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// CPU reference

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(MlaDecodeReference, MatchesEngineAbsorbAttention) {
  for (int len : {1, 3, 64, 200})
    for (int s_q : {1, 2, 3})
      for (int h_q : {1, 5, 16}) {
        SCOPED_TRACE("len " + std::to_string(len) + " s_q " + std::to_string(s_q) + " h_q " + std::to_string(h_q));
        const int rows = s_q * h_q;
        std::vector<float> q = random_floats(size_t(rows) * kDim, 11u + uint32_t(len));
        std::vector<float> keys = random_floats(size_t(len) * kDim, 23u + uint32_t(h_q));
        const float scale = 0.07f;
        std::vector<float> out(size_t(rows) * kLatent), lse(static_cast<size_t>(rows));
        reference_attend(q.data(), keys.data(), len, 0, len, s_q, h_q, scale, out.data(), lse.data());

        std::vector<float> q_lat(size_t(rows) * kLatent);
        for (int r = 0; r < rows; ++r)
          std::copy(q.begin() + r * kDim, q.begin() + r * kDim + kLatent, q_lat.begin() + r * kLatent);
        mla::cpu::AbsorbArgs a;
        a.q_lat = q_lat.data();
        a.q_pe = q.data() + kLatent;
        a.ld_qpe = int64_t(h_q) * kDim;
        a.head_stride_qpe = kDim;
        a.latent = keys.data();
        a.T = s_q;
        a.S = len;
        a.H = h_q;
        a.kv_lora = kLatent;
        a.rope = kRope;
        a.q_pos0 = len - s_q;
        a.k_pos0 = 0;
        a.scale = scale;
        std::vector<float> eout(size_t(rows) * kLatent), else_(static_cast<size_t>(rows));
        mla::cpu::attention_absorb(mla::cpu::Context{}, a, eout.data(), else_.data());
        // The engine sums in float32 through its GEMM, the reference in double: 2e-5 covers
        // float32 rounding of sums of up to 576 unit-size products.
        for (int r = 0; r < rows; ++r) {
          if (std::isinf(else_[size_t(r)])) {
            EXPECT_EQ(lse[size_t(r)], -kInf) << "row " << r;
          } else {
            EXPECT_NEAR(lse[size_t(r)], else_[size_t(r)], 2e-5f * std::max(1.0f, std::fabs(else_[size_t(r)])))
                << "row " << r;
          }
          for (int d = 0; d < kLatent; ++d)
            ASSERT_NEAR(out[size_t(r) * kLatent + d], eout[size_t(r) * kLatent + d], 2e-5f) << "row " << r << " d " << d;
        }
      }
}

TEST(MlaDecodeReference, HandComputedCase) {
  // Two keys, two query rows (s_q 2, one head): row 0 sees key 0 only, row 1 sees both.
  std::vector<float> q(2 * kDim, 0.0f), keys(2 * kDim, 0.0f);
  q[0] = 1.0f;                   // row 0 . key = key[0]
  q[kDim + 0] = 2.0f;            // row 1 . key = 2 key[0] + 3 key[kLatent] (rope part)
  q[kDim + kLatent] = 3.0f;
  keys[0] = 0.5f;                // key 0: latent[0] = 0.5, latent[1] = 1
  keys[1] = 1.0f;
  keys[kDim + 0] = -1.0f;        // key 1: latent[0] = -1, latent[1] = 4, rope[0] = 1
  keys[kDim + 1] = 4.0f;
  keys[kDim + kLatent] = 1.0f;
  std::vector<float> out(2 * kLatent), lse(2);
  reference_attend(q.data(), keys.data(), 2, 0, 2, 2, 1, 0.5f, out.data(), lse.data());
  EXPECT_NEAR(lse[0], 0.25f, 1e-6f);  // one key: lse = its score 0.5 * 0.5
  EXPECT_NEAR(out[0], 0.5f, 1e-6f);
  EXPECT_NEAR(out[1], 1.0f, 1e-6f);
  const double s0 = 0.5 * (2 * 0.5), s1 = 0.5 * (2 * -1.0 + 3 * 1.0);  // 0.5 and 0.5
  const double w0 = std::exp(s0) / (std::exp(s0) + std::exp(s1)), w1 = 1 - w0;
  EXPECT_NEAR(lse[1], float(std::log(std::exp(s0) + std::exp(s1))), 1e-6f);
  EXPECT_NEAR(out[kLatent + 0], float(w0 * 0.5 + w1 * -1.0), 1e-6f);
  EXPECT_NEAR(out[kLatent + 1], float(w0 * 1.0 + w1 * 4.0), 1e-6f);
  for (int d = 2; d < kLatent; ++d) EXPECT_EQ(out[kLatent + d], 0.0f);
  // No visible key: output 0, lse -inf (the kernel reports +inf for a whole row).
  reference_attend(q.data(), keys.data(), 1, 0, 1, 2, 1, 0.5f, out.data(), lse.data());
  EXPECT_EQ(lse[0], -kInf);
  EXPECT_EQ(out[0], 0.0f);
}

TEST(MlaDecodeReference, SplitRangesMergeToWhole) {
  const int len = 300, s_q = 2, h_q = 4, rows = s_q * h_q;
  std::vector<float> q = random_floats(size_t(rows) * kDim, 5), keys = random_floats(size_t(len) * kDim, 6);
  std::vector<float> whole(size_t(rows) * kLatent), whole_lse(static_cast<size_t>(rows));
  reference_attend(q.data(), keys.data(), len, 0, len, s_q, h_q, 0.08f, whole.data(), whole_lse.data());
  for (int cut : {1, 64, 150, 299}) {
    SCOPED_TRACE("cut " + std::to_string(cut));
    std::vector<float> acc(whole.size()), acc_lse(static_cast<size_t>(rows)), part(whole.size()), part_lse(static_cast<size_t>(rows));
    reference_attend(q.data(), keys.data(), len, 0, cut, s_q, h_q, 0.08f, acc.data(), acc_lse.data());
    reference_attend(q.data(), keys.data(), len, cut, len, s_q, h_q, 0.08f, part.data(), part_lse.data());
    if (cut == 299) {
      EXPECT_EQ(part_lse[0], -kInf) << "row 0 sees keys up to 298 only";
    }
    mla::cpu::merge_partial(acc.data(), acc_lse.data(), part.data(), part_lse.data(), rows, kLatent);
    for (int r = 0; r < rows; ++r) {
      EXPECT_NEAR(acc_lse[size_t(r)], whole_lse[size_t(r)], 1e-5f);
      for (int d = 0; d < kLatent; ++d) ASSERT_NEAR(acc[size_t(r) * kLatent + d], whole[size_t(r) * kLatent + d], 1e-5f);
    }
  }
}

TEST(MlaDecodeReference, Fp8RowIsTheLatentPoolLayout) {
  ASSERT_EQ(mla::latent_row_bytes(kLatent, kRope, mla::KvDType::FP8), kFp8Row);
  mla::LatentPool pool(1, kLatent, kRope, 2, 64, mla::KvDType::FP8);
  mla::PageTable seq;
  ASSERT_TRUE(pool.reserve(seq, 3));
  for (int t = 0; t < 3; ++t) {
    std::vector<float> row = random_floats(kDim, 100u + uint32_t(t));
    if (t == 2) std::fill(row.begin(), row.begin() + 128, 0.0f);  // an all-zero scale block
    pool.write(0, seq, t, row.data(), row.data() + kLatent);
    std::vector<float> from_pool(kDim), ours(kDim);
    pool.gather(0, seq, t, 1, from_pool.data());
    uint8_t bytes[kFp8Row];
    encode_fp8_row(row.data(), bytes);
    decode_fp8_row(bytes, ours.data());
    for (int i = 0; i < kDim; ++i) ASSERT_EQ(ours[size_t(i)], from_pool[size_t(i)]) << "token " << t << " value " << i;
  }
}

TEST(MlaDecodeReference, ProblemPagesArePermutedAndPoisoned) {
  for (bool fp8 : {false, true}) {
    DecodeProblem p = make_decode_problem({70, 0, 130, 1}, 2, 3, fp8, 42, 64, 3);
    ASSERT_EQ(p.num_pages, 2 + 0 + 3 + 1 + 3);
    std::vector<int> used(size_t(p.num_pages), 0);
    for (int b = 0; b < p.batch; ++b)
      for (int i = 0; i < (p.lengths[size_t(b)] + 63) / 64; ++i) ++used[size_t(p.block_table[size_t(b) * p.max_pages + i])];
    int identity = 0, pages = 0;
    for (int b = 0, next = 0; b < p.batch; ++b)
      for (int i = 0; i < (p.lengths[size_t(b)] + 63) / 64; ++i, ++next, ++pages)
        identity += p.block_table[size_t(b) * p.max_pages + i] == next;
    EXPECT_LT(identity, pages) << "pages should not be in order";
    for (int pg = 0; pg < p.num_pages; ++pg) {
      ASSERT_LE(used[size_t(pg)], 1) << "page " << pg << " used twice";
      if (used[size_t(pg)]) continue;
      const uint8_t* bytes = p.cache.data() + int64_t(pg) * p.page_size * p.row_bytes();
      for (int64_t i = 0; i < p.page_size * p.row_bytes(); ++i) ASSERT_EQ(bytes[i], 0xff) << "unused page " << pg;
    }
    // Valid tokens are finite; the tail of the last page reads as NaN.
    float row[kDim];
    for (int t = 0; t < 70; ++t) {
      cache_row(p, 0, t, row);
      for (float v : row) ASSERT_TRUE(std::isfinite(v));
    }
    p.lengths[0] = 71;  // pretend one more token: its slot is poison
    cache_row(p, 0, 70, row);
    EXPECT_TRUE(std::isnan(row[0]));
    EXPECT_TRUE(std::isnan(row[kDim - 1]));
  }
}

// ---------------------------------------------------------------------------------------------
// GPU

#if MLA_HAVE_CUDA

// Empty string when the kernel can run here, else why not.
std::string gpu_unavailable() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return "no CUDA device";
  }
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "cannot query the CUDA device";
  if (prop.major != 9) return std::string("the kernel is built for sm_90a; device is ") + prop.name;
  return "";
}

#define SKIP_WITHOUT_GPU()                                   \
  do {                                                       \
    const std::string why = gpu_unavailable();               \
    if (!why.empty()) GTEST_SKIP() << "GPU test: " << why;   \
  } while (0)

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

template <typename T>
struct DeviceArray {
  T* ptr = nullptr;
  explicit DeviceArray(size_t n) { cuda_ok(cudaMalloc(reinterpret_cast<void**>(&ptr), std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc"); }
  DeviceArray(const std::vector<T>& v) : DeviceArray(v.size()) {
    cuda_ok(cudaMemcpy(ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  std::vector<T> get(size_t n) const {
    std::vector<T> v(n);
    cuda_ok(cudaMemcpy(v.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return v;
  }
};

// Runs the kernel on the problem; out as float32 and lse, both initially poisoned with NaN.
void run_gpu(const DecodeProblem& p, std::vector<float>& out, std::vector<float>& lse, int num_sms = 0) {
  const size_t n_out = size_t(p.batch) * p.rows() * kLatent, n_lse = size_t(p.batch) * p.rows();
  DeviceArray<uint16_t> q(p.q), o(std::vector<uint16_t>(n_out, 0x7fc0));
  DeviceArray<uint8_t> cache(p.cache);
  DeviceArray<int32_t> bt(p.block_table);
  DeviceArray<float> l(std::vector<float>(n_lse, std::numeric_limits<float>::quiet_NaN()));
  mla::cuda::DecodePlan plan = mla::cuda::plan_decode(p.lengths.data(), p.batch, p.s_q, p.h_q,
                                                      num_sms > 0 ? num_sms : mla::cuda::device_sm_count());
  mla::cuda::DecodeArgs a;
  a.q = q.ptr;
  a.cache = cache.ptr;
  a.cache_dtype = p.fp8 ? mla::cuda::CacheDType::FP8 : mla::cuda::CacheDType::BF16;
  a.page_size = p.page_size;
  a.block_table = bt.ptr;
  a.block_table_stride = p.max_pages;
  a.softmax_scale = p.scale;
  a.out = o.ptr;
  a.lse = l.ptr;
  mla::cuda::run_decode(plan, a, nullptr);
  cuda_ok(cudaDeviceSynchronize(), "decode kernel");
  std::vector<uint16_t> ob = o.get(n_out);
  out.resize(n_out);
  for (size_t i = 0; i < n_out; ++i) out[i] = mla::bf16_to_f32(ob[i]);
  lse = l.get(n_lse);
}

// The kernel against the reference with FlashMLA's tolerances: out |d| <= 8e-4 or relative
// <= 2.01/128 (two bf16 ulps of the output); lse |d| <= 1e-6 or relative <= 8.01/65536.
void expect_matches_reference(const DecodeProblem& p, int num_sms = 0) {
  std::vector<float> out, lse, ref_out, ref_lse;
  run_gpu(p, out, lse, num_sms);
  reference_decode(p, ref_out, ref_lse);
  int bad = 0;
  for (size_t i = 0; i < out.size() && bad < 10; ++i) {
    const float d = std::fabs(out[i] - ref_out[i]);
    if (!(d <= 8e-4f || d <= 2.01f / 128 * std::fabs(ref_out[i]))) {
      ADD_FAILURE() << "out[" << i << "] (sequence " << i / (size_t(p.rows()) * kLatent) << ") = " << out[i]
                    << ", reference " << ref_out[i];
      ++bad;
    }
  }
  for (size_t i = 0; i < lse.size() && bad < 20; ++i) {
    if (std::isinf(ref_lse[i])) {
      if (lse[i] != ref_lse[i]) {
        ADD_FAILURE() << "lse[" << i << "] = " << lse[i] << ", reference " << ref_lse[i];
        ++bad;
      }
      continue;
    }
    const float d = std::fabs(lse[i] - ref_lse[i]);
    if (!(d <= 1e-6f || d <= 8.01f / 65536 * std::fabs(ref_lse[i]))) {
      ADD_FAILURE() << "lse[" << i << "] = " << lse[i] << ", reference " << ref_lse[i];
      ++bad;
    }
  }
}

struct GridCase {
  bool fp8;
  int s_q, h_q;
};

class MlaDecodeGpu : public ::testing::TestWithParam<GridCase> {};

TEST_P(MlaDecodeGpu, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const GridCase c = GetParam();
  std::mt19937 rng(uint32_t(c.h_q * 10 + c.s_q + (c.fp8 ? 1000 : 0)));
  for (int batch : {1, 2, 6, 64}) {
    std::vector<std::vector<int32_t>> length_sets;
    for (int len : {1, 20, 140, 4096}) length_sets.push_back(std::vector<int32_t>(size_t(batch), len));
    std::vector<int32_t> var(static_cast<size_t>(batch));
    for (int32_t& l : var) l = int32_t(rng() % 1200);
    if (batch > 1) var[1] = 0;  // an empty sequence among the others
    var[0] = std::max<int32_t>(var[0], 1);
    length_sets.push_back(var);
    for (size_t k = 0; k < length_sets.size(); ++k) {
      SCOPED_TRACE("batch " + std::to_string(batch) + (k < 4 ? " length " + std::to_string(length_sets[k][0])
                                                             : std::string(" variable lengths")));
      DecodeProblem p = make_decode_problem(length_sets[k], c.s_q, c.h_q, c.fp8, rng());
      expect_matches_reference(p);
      if (HasFailure()) return;
    }
  }
}

std::vector<GridCase> grid() {
  std::vector<GridCase> g;
  for (bool fp8 : {false, true})
    for (int s_q : {1, 2})
      for (int h_q : {1, 16, 64, 128}) g.push_back({fp8, s_q, h_q});
  return g;
}

INSTANTIATE_TEST_SUITE_P(Grid, MlaDecodeGpu, ::testing::ValuesIn(grid()), [](const auto& info) {
  return std::string(info.param.fp8 ? "fp8" : "bf16") + "_sq" + std::to_string(info.param.s_q) + "_hq" +
         std::to_string(info.param.h_q);
});

TEST(MlaDecodeGpuExtra, OddShapesPageSizesAndSmCounts) {
  SKIP_WITHOUT_GPU();
  // h_q not a multiple of 16, s_q up to 4, page sizes other than the kernel's block, and
  // schedules forced to split (few SMs) or not (one SM).
  struct Case {
    std::vector<int32_t> lengths;
    int s_q, h_q, page_size, sms;
    bool fp8;
  };
  const std::vector<Case> cases = {
      {{3, 1, 2, 4}, 4, 3, 64, 0, false},     {{500, 77}, 3, 40, 16, 0, true},
      {{1000, 0, 333}, 2, 128, 128, 5, false}, {{2000}, 1, 1, 64, 1, true},
      {{129, 64, 65}, 4, 32, 32, 0, false},   {{5000, 10}, 1, 24, 64, 132, true},
  };
  uint64_t seed = 99;
  for (const Case& c : cases) {
    SCOPED_TRACE("s_q " + std::to_string(c.s_q) + " h_q " + std::to_string(c.h_q) + " page " +
                 std::to_string(c.page_size) + " sms " + std::to_string(c.sms));
    DecodeProblem p = make_decode_problem(c.lengths, c.s_q, c.h_q, c.fp8, seed++, c.page_size);
    expect_matches_reference(p, c.sms);
  }
}

TEST(MlaDecodeGpuExtra, RunRejectsBadArguments) {
  SKIP_WITHOUT_GPU();
  std::vector<int32_t> lengths = {100};
  mla::cuda::DecodePlan plan = mla::cuda::plan_decode(lengths.data(), 1, 1, 16, 132);
  mla::cuda::DecodeArgs a;  // nothing set
  EXPECT_THROW(mla::cuda::run_decode(plan, a, nullptr), std::invalid_argument);
  EXPECT_THROW(mla::cuda::run_decode(mla::cuda::DecodePlan{}, a, nullptr), std::invalid_argument);
}

#else

TEST(MlaDecodeGpu, MatchesReference) { GTEST_SKIP() << "GPU test: this build has no CUDA (MLA_CUDA off)"; }

#endif

}  // namespace
