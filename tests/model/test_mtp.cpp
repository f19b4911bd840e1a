// The MTP module (model/mtp.h) against the numpy reference (reference/mtp_reference.py): its
// logits for a fixture sequence, batched and row by row, the chained second draft, every KV
// cache format; the reference reproducing its committed golden files; and the one-token kernel
// context (cpu::Context::one_token_kernels) computing every row of a pass as a 1-token product.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>

#include "backend/cpu/ops.h"
#include "model/model.h"
#include "model/mtp.h"
#include "test_util.h"

namespace mla {
namespace {

// float32 compute against the float64 reference: the fixture README's tolerance.
constexpr float kTol = 1e-3f;

std::string source_dir() {
  std::string s = MLA_SHARED_DIR;  // "<checkout>/../shared"
  const std::string tail = "/../shared";
  return s.substr(0, s.size() - tail.size());
}

std::string golden_path(const std::string& fixture) { return source_dir() + "/reference/golden/mtp-" + fixture + ".safetensors"; }

struct Golden {
  std::vector<int32_t> ids;
  std::vector<float> logits, chain_logits;
  int32_t chain_token;
};

Golden read_golden(const std::string& fixture) {
  SafetensorsFile f(golden_path(fixture));
  Golden g;
  g.ids = test::read_ids(*f.find("ids"));
  g.logits = test::read_f32(*f.find("logits"));
  g.chain_logits = test::read_f32(*f.find("chain_logits"));
  g.chain_token = test::read_ids(*f.find("chain_token"))[0];
  return g;
}

Model& model(const std::string& fixture) {
  static std::map<std::string, std::unique_ptr<Model>> cache;
  auto& m = cache[fixture];
  if (!m) m = Model::load(test::fixture(fixture), {}, false, /*with_mtp=*/true);
  return *m;
}

// The main model's final-norm rows of the whole sequence.
std::vector<float> main_hidden(Model& m, const std::vector<int32_t>& ids) {
  LatentPool pool = m.make_pool(8, 16, KvDType::F32);
  PageTable t;
  std::vector<SeqSlice> b{{&t, ids}};
  std::vector<float> logits, hidden;
  ForwardOptions fo;
  fo.final_hidden = &hidden;
  m.forward(b, pool, fo, logits);
  return hidden;
}

class Mtp : public ::testing::TestWithParam<std::string> {};

TEST_P(Mtp, LoadsOnlyWhenAsked) {
  EXPECT_TRUE(model(GetParam()).has_mtp());
  EXPECT_EQ(model(GetParam()).config().num_nextn_predict_layers, 1);
  auto plain = Model::load(test::fixture(GetParam()));
  EXPECT_FALSE(plain->has_mtp());
  EXPECT_EQ(plain->weights().layers.size(), size_t(plain->config().num_hidden_layers));
  EXPECT_EQ(model(GetParam()).weights().layers.size(), size_t(plain->config().num_hidden_layers));
}

TEST_P(Mtp, LogitsMatchReferenceBatchedAndRowByRow) {
  Model& m = model(GetParam());
  const Golden g = read_golden(GetParam());
  const int64_t T = int64_t(g.ids.size()), D = m.config().hidden_size, V = m.config().vocab_size;
  const std::vector<float> h = main_hidden(m, g.ids);
  const std::vector<int32_t> next(g.ids.begin() + 1, g.ids.end());
  for (KvDType dt : {KvDType::F32, KvDType::BF16, KvDType::FP8}) {
    // All rows in one pass.
    LatentPool pool = m.make_mtp_pool(8, 4, dt);
    PageTable t;
    std::vector<MtpSlice> b{{&t, next, h.data(), 0}};
    std::vector<float> logits, hn;
    m.mtp_forward(b, pool, false, logits, &hn);
    ASSERT_EQ(logits.size(), size_t((T - 1) * V));
    // f32: per element. bf16 and fp8 caches round the latents and these random tiny models
    // route on near-ties (one flipped expert moves a logit by its own scale): their mean error
    // is bounded at 0.1 as test_batch.cpp's Fp8CacheErrorIsBounded bounds the main model's.
    auto check = [&](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
      if (dt == KvDType::F32) {
        EXPECT_LE(test::max_abs_diff(got, want), kTol) << what;
        return;
      }
      ASSERT_EQ(got.size(), want.size());
      double sum = 0;
      for (size_t i = 0; i < got.size(); ++i) sum += std::fabs(got[i] - want[i]);
      EXPECT_LE(sum / double(got.size()), 0.1) << kv_dtype_name(dt) << " " << what;
    };
    check(logits, g.logits, "rows");
    EXPECT_EQ(t.length, T - 1);
    // The chained step: the argmax of the last row with that row's shared_head.norm output.
    std::vector<int32_t> d{g.chain_token};
    std::vector<MtpSlice> c{{&t, d, hn.data() + (T - 2) * D, T - 1}};
    std::vector<float> chain;
    m.mtp_forward(c, pool, true, chain);
    check(chain, g.chain_logits, "chained");
  }
  // Row by row (a decode step each), as the engine drafts; pages of 4 rows cross boundaries.
  LatentPool pool = m.make_mtp_pool(8, 4, KvDType::F32);
  PageTable t;
  std::vector<float> rows;
  for (int64_t i = 0; i + 1 < T; ++i) {
    std::vector<int32_t> one{next[size_t(i)]};
    std::vector<MtpSlice> b{{&t, one, h.data() + i * D, i}};
    std::vector<float> logits;
    m.mtp_forward(b, pool, true, logits);
    rows.insert(rows.end(), logits.begin(), logits.end());
  }
  EXPECT_LE(test::max_abs_diff(rows, g.logits), kTol);
}

TEST_P(Mtp, TwoSequencesInOneBatchMatchAlone) {
  Model& m = model(GetParam());
  const Golden g = read_golden(GetParam());
  const int64_t T = int64_t(g.ids.size()), V = m.config().vocab_size;
  const std::vector<float> h = main_hidden(m, g.ids);
  const std::vector<int32_t> next(g.ids.begin() + 1, g.ids.end());
  LatentPool pool = m.make_mtp_pool(16, 4, KvDType::F32);
  PageTable a, b;
  const std::vector<int32_t> head(next.begin(), next.begin() + 5);
  std::vector<MtpSlice> batch{{&a, next, h.data(), 0}, {&b, head, h.data(), 0}};
  std::vector<float> logits;
  m.mtp_forward(batch, pool, true, logits);
  ASSERT_EQ(logits.size(), size_t(2 * V));
  std::vector<float> last(g.logits.end() - V, g.logits.end()), fifth(g.logits.begin() + 4 * V, g.logits.begin() + 5 * V);
  EXPECT_LE(test::max_abs_diff(std::vector<float>(logits.begin(), logits.begin() + V), last), kTol);
  EXPECT_LE(test::max_abs_diff(std::vector<float>(logits.begin() + V, logits.end()), fifth), kTol);
  EXPECT_EQ(a.length, T - 1);
  EXPECT_EQ(b.length, 5);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Mtp, ::testing::Values("deepseek-v3-tiny", "glm-4.7-flash-tiny"));

TEST(MtpReference, PythonReproducesCommittedGolden) {
  const auto r = test::run_command("/usr/bin/python3 '" + source_dir() + "/reference/mtp_reference.py' --check", true);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("max |recomputed - committed|"), std::string::npos) << r.output;
}

TEST(MtpReference, CheckpointsWithoutTheModuleLoadWithout) {
  auto m = Model::load(test::fixture("kimi-k2-tiny"), {}, false, true);
  EXPECT_FALSE(m->has_mtp());
}

// Every row of a product under one_token_kernels equals a 1-token product of that row, bit
// for bit, for every weight format the fixtures hold and both precisions.
TEST(OneTokenKernels, RowsEqualOneTokenProducts) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (const char* fx : {"deepseek-v3-tiny", "deepseek-v3-fp8-tiny", "kimi-k2.5-int4-tiny"}) {
    auto m = Model::load(test::fixture(fx));
    const auto& L = m->weights().layers.back();
    std::vector<MatrixView> ws{L.kv_a, L.o, L.experts[0].gate, L.experts[0].down, m->weights().lm_head};
    for (cpu::Precision p : {cpu::Precision::Precise, cpu::Precision::Fast}) {
      cpu::Context one;
      one.precision = p;
      cpu::Context rows = one;
      rows.one_token_kernels = true;
      for (const MatrixView& W : ws)
        for (int64_t T : {2, 5, 17}) {
          std::vector<float> x(size_t(T * W.cols)), y(size_t(T * W.rows)), y1(size_t(W.rows));
          for (auto& v : x) v = nd(rng);
          cpu::matmul(rows, x.data(), T, W, y.data());
          for (int64_t t = 0; t < T; ++t) {
            cpu::matmul(one, x.data() + t * W.cols, 1, W, y1.data());
            ASSERT_EQ(std::memcmp(y1.data(), y.data() + t * W.rows, y1.size() * 4), 0)
                << fx << " " << cpu::precision_name(p) << " " << weight_format_name(W.format) << " T=" << T << " row " << t;
          }
        }
    }
  }
}

}  // namespace
}  // namespace mla
