// Every fixture checkpoint reproduces HuggingFace's logits (golden.safetensors) for its four
// sequences in every mode (prefill, decode, extend at several P) on both attention paths, and
// its layer outputs for sequence 2's prompt.
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "backend/cpu/common/amx.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/precision.h"
#include "tools/run_modes.h"
#include "test_util.h"

namespace mla {
namespace {

// The fixture README's tolerance for float32 compute against the float32 HF run.
constexpr float kLogitTol = 1e-3f;

struct Loaded {
  std::unique_ptr<Model> model;
  std::unique_ptr<SafetensorsFile> golden;
};

Loaded& load(const std::string& name) {
  static std::map<std::string, Loaded> cache;
  auto& l = cache[name];
  if (!l.model) {
    l.model = Model::load(test::fixture(name));
    l.golden = std::make_unique<SafetensorsFile>(test::fixture(name) + "/golden.safetensors");
  }
  return l;
}

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, LogitsEveryModeBothPaths) {
  auto& l = load(GetParam());
  for (int j = 0; j < 4; ++j) {
    auto ids = test::read_ids(*l.golden->find("seq" + std::to_string(j) + "_ids"));
    auto want = test::read_f32(*l.golden->find("seq" + std::to_string(j) + "_logits"));
    const int64_t n = int64_t(ids.size());
    std::vector<RunMode> modes = {RunMode::parse("prefill"), RunMode::parse("decode")};
    for (int64_t p : {int64_t(1), n / 2, n - 1}) modes.push_back(RunMode::parse("extend:" + std::to_string(p)));
    for (auto& mode : modes)
      for (AttnPath path : {AttnPath::Expand, AttnPath::Absorb}) {
        RunOptions opt;
        opt.mode = mode;
        opt.path = path;
        auto got = run_logits(*l.model, ids, opt);
        EXPECT_LE(test::max_abs_diff(got, want), kLogitTol)
            << GetParam() << " seq" << j << " " << mode.name() << " " << attn_path_name(path);
      }
  }
}

TEST_P(Golden, LayerOutputs) {
  auto& l = load(GetParam());
  const auto& cfg = l.model->config();
  auto ids = test::read_ids(*l.golden->find("seq2_ids"));
  int64_t T;
  std::memcpy(&T, l.golden->find("seq2_prompt")->data, 8);
  ids.resize(size_t(T));
  for (AttnPath path : {AttnPath::Expand, AttnPath::Absorb}) {
    ForwardCapture capture;
    RunOptions opt;
    opt.path = path;
    opt.first_pass = &capture;
    run_logits(*l.model, ids, opt);
    const auto& hidden = capture.hidden_states;
    ASSERT_EQ(int64_t(hidden.size()), cfg.num_hidden_layers + 1);
    for (int64_t i = 0; i <= cfg.num_hidden_layers; ++i) {
      auto want = test::read_f32(*l.golden->find("hidden" + std::to_string(i)));
      EXPECT_LE(test::max_abs_diff(hidden[size_t(i)], want), kLogitTol) << "hidden" << i << " " << attn_path_name(path);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Golden, ::testing::ValuesIn(test::model_fixtures()),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& ch : s)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

}  // namespace
}  // namespace mla

namespace mla {
namespace {

// The kernels split rows across threads: two threads give the golden logits too (ctest runs
// each test on one thread, so this test sets its own count).
TEST(MultiThread, TwoThreadsReproduceTheGolden) {
  cpu::Context two;
  two.threads = 2;
  auto& l = load("deepseek-v3-fp8-tiny");
  auto ids = test::read_ids(*l.golden->find("seq3_ids"));
  auto want = test::read_f32(*l.golden->find("seq3_logits"));
  for (const char* mode : {"prefill", "decode", "extend:40"})
    for (AttnPath path : {AttnPath::Expand, AttnPath::Absorb}) {
      RunOptions opt;
      opt.mode = RunMode::parse(mode);
      opt.path = path;
      opt.context = &two;
      EXPECT_LE(test::max_abs_diff(run_logits(*l.model, ids, opt), want), kLogitTol) << mode;
    }
}

// A 108-token prompt gives each of the 16 experts enough tokens that two threads run the
// experts one per thread (Model::moe) while one thread batches them: in the fast precision
// (oneDNN bf16 GEMMs) both must still agree. They share every expert's arithmetic, so they
// differ only by the summation order of the split products elsewhere (shared experts,
// attention): far below the 1e-3 of the goldens, and below the fast precision's own error.
TEST(MultiThread, FastPrecisionExpertsPerThreadMatchOneThread) {
  cpu::Context fast1, fast2;
  fast1.precision = fast2.precision = cpu::Precision::Fast;
  fast1.threads = 1;
  fast2.threads = 2;
  auto& l = load("deepseek-v3-tiny");
  auto ids = test::read_ids(*l.golden->find("seq3_ids"));
  auto want = test::read_f32(*l.golden->find("seq3_logits"));
  RunOptions opt;
  opt.mode = RunMode::parse("prefill");
  opt.context = &fast1;
  const MoeCounters c0 = l.model->moe_counters();
  auto one = run_logits(*l.model, ids, opt);
  const MoeCounters c1 = l.model->moe_counters();
  opt.context = &fast2;
  auto two = run_logits(*l.model, ids, opt);
  const MoeCounters c2 = l.model->moe_counters();
  // The branch under test ran: one thread batched every MoE layer, two threads ran each of them
  // expert per thread.
  const int64_t moe_layers = l.model->config().num_hidden_layers - l.model->config().first_k_dense_replace;
  EXPECT_EQ(c1.expert_per_thread, c0.expert_per_thread);
  EXPECT_EQ(c1.batched - c0.batched, moe_layers);
  EXPECT_EQ(c2.expert_per_thread - c1.expert_per_thread, moe_layers);
  EXPECT_EQ(c2.batched, c1.batched);
  // Bound: every product splits its output rows (or its experts) across the threads, never one
  // sum, so where the CPU has AMX (our kernels for every product of this 108-token prompt) each
  // value is computed by the same operations on one thread or two: the logits are equal
  // (measured: equal). Without AMX oneDNN's GEMMs run, which may split a sum by thread count:
  // float32 noise (relative ~1e-7) unless it flips the bf16 rounding of an activation, which
  // moves the input by 2^-8 of it and a logit by 2^-8 |x_i| |w_ij|: about 4e-4 for |x_i| ~ 1 and
  // |w| ~ 0.1 (this fixture's lm_head: max |w| 0.37, final-norm |x| <= 4.3): 1e-3 allows about
  // two such flips per logit.
  if (cpu::amx_available()) EXPECT_EQ(test::max_abs_diff(one, two), 0.0f);
  else EXPECT_LE(test::max_abs_diff(one, two), 1e-3f);
  // Against transformers' float32: bf16 activations move most logits by a few 1e-3, but on these
  // random weights a rounding can flip a near-tied expert choice and move that token's row by
  // O(1) (see tests/engine/test_verify.cpp), so the mean is bounded, not the max.
  const double mean = test::mean_abs_diff(two, want);
  EXPECT_LT(mean, 3e-2);  // measured 1.1e-2, of which a flipped row is a few 1e-3
}

// run(ids, want, opt, what) for each of name's golden sequences (want: its logits) in prefill,
// decode and extend at half the sequence, on both attention paths (opt: that mode and path).
template <class Run>
void for_each_golden_run(const std::string& name, Run&& run) {
  SafetensorsFile golden(test::fixture(name) + "/golden.safetensors");
  for (int j = 0; j < 4; ++j) {
    const auto ids = test::read_ids(*golden.find("seq" + std::to_string(j) + "_ids"));
    const auto want = test::read_f32(*golden.find("seq" + std::to_string(j) + "_logits"));
    const int64_t n = int64_t(ids.size());
    for (const std::string& mode : {std::string("prefill"), std::string("decode"), "extend:" + std::to_string(n / 2)})
      for (AttnPath path : {AttnPath::Expand, AttnPath::Absorb}) {
        RunOptions opt;
        opt.mode = RunMode::parse(mode);
        opt.path = path;
        run(ids, want, opt, "seq" + std::to_string(j) + " " + mode + " " + attn_path_name(path));
      }
  }
}

// A context whose loads repack the weights (repack.h): the fast precision without AMX, the
// weights copied onto huge pages.
cpu::Context repacking_context() {
  cpu::Context c;
  c.precision = cpu::Precision::Fast;
  c.amx = false;
  c.weights = cpu::WeightPlacement::HugePages;
  return c;
}

// The weights repacked at load as column pairs (Context::repack_weights, where
// the fast precision runs without AMX: repack.h) are the same model: run in the precise
// precision they give the golden logits (every product on the pairs kernels of the float32
// GEMV, or unpacked for sgemm), in every mode and both attention paths; in the fast precision,
// whose prompt products then read them in place, they stay as near the golden as the fast
// precision does (the bound and its reasoning as above).
TEST(Repack, RepackedWeightsReproduceTheGolden) {
  const cpu::Context fast = repacking_context();
  const std::string name = "deepseek-v2-lite-tiny";  // dense, shared and routed MLPs
  auto model = Model::load(test::fixture(name), fast);
  ASSERT_TRUE(model->weights_repacked());
  ASSERT_TRUE(model->context().repack_weights);
  const auto& L = model->weights().layers.back();
  ASSERT_EQ(L.experts[0].gate.format, WeightFormat::BF16_PAIRS32);
  ASSERT_EQ(L.shared.down.format, WeightFormat::BF16_PAIRS32);
  ASSERT_EQ(model->weights().layers.front().dense.up.format, WeightFormat::BF16_PAIRS32);
  ASSERT_EQ(L.o.format, WeightFormat::BF16_PAIRS32);
  ASSERT_EQ(L.kv_a.format, L.kv_a.rows % 32 == 0 ? WeightFormat::BF16_PAIRS32 : WeightFormat::BF16);
  ASSERT_EQ(L.kv_b.format, WeightFormat::BF16);  // its rows are read per head (w_uv) as stored
  const MatrixView& head = model->weights().lm_head;
  ASSERT_EQ(head.format, head.rows % 32 == 0 ? WeightFormat::BF16_PAIRS32 : WeightFormat::BF16);
  cpu::Context off = fast;
  off.repack_weights = false;
  EXPECT_FALSE(Model::load(test::fixture(name), off)->weights_repacked());
  cpu::Context precise;
  for_each_golden_run(name, [&](const auto& ids, const auto& want, RunOptions opt, const std::string& what) {
    opt.context = &precise;
    EXPECT_LE(test::max_abs_diff(run_logits(*model, ids, opt), want), kLogitTol) << what << " precise";
    opt.context = nullptr;  // the model's own: fast, weights in place
    const auto got = run_logits(*model, ids, opt);
    EXPECT_LT(test::mean_abs_diff(got, want), 3e-2) << what << " fast";
  });
}

// INT4 routed experts (quantized at load) repacked in blocks of 16 rows (INT4_WORDS16, where the
// prompt's INT4 products run on the VNNI GEMM: repack.h) are the same model as the row-major
// INT4: every mode and path gives the logits of a load that keeps them row-major (int8
// activations off at load; its bf16 weights repacked alike) in the precise precision (float32
// GEMVs of another summation order: the golden's 1e-3). In the fast one with int8 activations
// the repacked experts' products of a few tokens run on the VNNI GEMV, the activations
// quantized to int8 as the VNNI GEMM has them (the row-major load's GEMVs round them to bf16):
// within that quantization's reach of the row-major logits (bounds below).
TEST(Repack, RepackedInt4ExpertsGiveTheSameLogits) {
  const cpu::Context fast = repacking_context();
  cpu::Context off = fast;
  off.int8_activations = false;
  const std::string name = "deepseek-v2-lite-tiny";
  const LoadQuantization q = LoadQuantization::parse("experts=int4");
  auto model = Model::load(test::fixture(name), fast, false, q);
  auto plain = Model::load(test::fixture(name), off, false, q);
  ASSERT_TRUE(model->weights_repacked());
  ASSERT_EQ(plain->weights().layers.back().o.format, model->weights().layers.back().o.format);
  const auto& L = model->weights().layers.back();
  ASSERT_EQ(L.experts[0].gate.format, WeightFormat::INT4_WORDS16);
  ASSERT_EQ(L.experts[0].down.format, L.experts[0].down.rows % 16 == 0 ? WeightFormat::INT4_WORDS16
                                                                         : WeightFormat::INT4_GROUP);
  ASSERT_EQ(plain->weights().layers.back().experts[0].gate.format, WeightFormat::INT4_GROUP);
  cpu::Context precise;
  double worst_mean = 0;
  float worst = 0;
  for_each_golden_run(name, [&](const auto& ids, const auto&, RunOptions opt, const std::string& what) {
    opt.context = &precise;
    EXPECT_LE(test::max_abs_diff(run_logits(*model, ids, opt), run_logits(*plain, ids, opt)), kLogitTol)
        << what << " precise";
    opt.context = &fast;
    const auto a = run_logits(*model, ids, opt), b = run_logits(*plain, ids, opt);
    worst_mean = std::max(worst_mean, test::mean_abs_diff(a, b));
    worst = std::max(worst, test::max_abs_diff(a, b));
  });
  std::printf("int4 words16 against row-major, fast: worst mean |d| %.3g, max %.3g\n", worst_mean, worst);
  // Int8 activations move each product by up to half a step of its chunk's largest value
  // (vnni_gemm.h), bf16 ones by up to 2^-9 of each value: measured at most 0.0041 mean and 0.109
  // max over the 24 runs; the bounds leave 2x.
  EXPECT_GT(worst, 0.0f) << "the fast runs should differ: decode on int8 activations against bf16";
  EXPECT_LT(worst_mean, 8.2e-3) << "mean |d|";
  EXPECT_LT(worst, 0.22f) << "max |d|";
}

// INT8 weights (every projection but kv_b, quantized at load) repacked in blocks of 16 rows
// (INT8_WORDS16) are the same model as the row-major INT8: the precise precision, which runs them
// on the reference GEMV, gives the row-major load's logits within the golden's 1e-3; the fast one
// runs decode's products on the VNNI GEMV, int8 activations as the prompt's VNNI GEMM has them
// (the row-major load decodes on float32 activations), and stays within that quantization's
// reach of the row-major logits (bounds below).
TEST(Repack, RepackedInt8WeightsGiveTheSameLogits) {
  const cpu::Context fast = repacking_context();
  cpu::Context off = fast;
  off.repack_weights = false;
  const std::string name = "deepseek-v2-lite-tiny";
  const LoadQuantization q = LoadQuantization::parse("experts=int8,others=int8");
  auto model = Model::load(test::fixture(name), fast, false, q);
  auto plain = Model::load(test::fixture(name), off, false, q);
  ASSERT_TRUE(model->weights_repacked());
  const auto& L = model->weights().layers.back();
  for (const MatrixView* m : {&L.experts[0].gate, &L.experts[0].down, &L.shared.up, &L.o, &L.kv_a})
    ASSERT_EQ(m->format, m->rows % 16 == 0 ? WeightFormat::INT8_WORDS16 : WeightFormat::INT8_GROUP);
  ASSERT_EQ(L.experts[0].gate.format, WeightFormat::INT8_WORDS16);
  ASSERT_EQ(plain->weights().layers.back().experts[0].gate.format, WeightFormat::INT8_GROUP);
  EXPECT_GT(model->weights().bytes_by_format.count("int8 in blocks of 16 rows (repacked at load)"), 0u);
  cpu::Context precise;
  double worst_mean = 0;
  float worst = 0;
  for_each_golden_run(name, [&](const auto& ids, const auto&, RunOptions opt, const std::string& what) {
    opt.context = &precise;
    EXPECT_LE(test::max_abs_diff(run_logits(*model, ids, opt), run_logits(*plain, ids, opt)), kLogitTol)
        << what << " precise";
    opt.context = &fast;
    const auto a = run_logits(*model, ids, opt), b = run_logits(*plain, ids, opt);
    worst_mean = std::max(worst_mean, test::mean_abs_diff(a, b));
    worst = std::max(worst, test::max_abs_diff(a, b));
  });
  // Int8 activations move each product by up to half a step of its chunk's largest value
  // (vnni_gemm.h): measured at most 0.012 mean and 0.194 max over the 24 runs (the quantization
  // of the weights themselves moves this model's logits by 0.029 mean: test_quantize.cpp); the
  // bounds leave 2x.
  EXPECT_GT(worst, 0.0f) << "the fast runs should differ: decode on int8 activations against float32";
  EXPECT_LT(worst_mean, 2.5e-2) << "mean |d|";
  EXPECT_LT(worst, 0.4f) << "max |d|";
  std::printf("int8 words16 against row-major, fast: worst mean |d| %.3g, max %.3g\n", worst_mean, worst);
}

}  // namespace
}  // namespace mla
