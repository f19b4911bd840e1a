// llama.cpp's GGUF files run as stored (model/gguf_model.h), checked against two outside
// references: the golden fixture's HuggingFace logits through llama.cpp's own conversion of it
// (BF16: the fixture's values), and llama.cpp's logits on the same quantized files. The files
// and llama.cpp's logits were made by tests/fixtures/gguf/make_models.sh.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>

#include "backend/cpu/precision.h"
#include "format/error.h"
#include "format/gguf.h"
#include "format/gguf_copy.h"
#include "model/fingerprint.h"
#include "model/gguf_model.h"
#include "tools/run_modes.h"
#include "test_util.h"

namespace mla {
namespace {

void copy_metadata(const GgufFile& src, test::GgufBuilder& b);

std::string gguf_fixture(const std::string& name) { return (test::source_dir() / "tests/fixtures/gguf" / name).string(); }

template <class T>
std::vector<T> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f) << path;
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

// ---- the config from the metadata ------------------------------------------------------------

class GgufConfig : public ::testing::TestWithParam<std::string> {};

// llama.cpp's converter writes every hyperparameter the folder's config.json holds; read back,
// they give the same ModelConfig (the MTP layers aside: the converter leaves them out).
TEST_P(GgufConfig, MetadataGivesTheFoldersConfig) {
  const ModelConfig want = ModelConfig::load(test::fixture(GetParam()));
  const ModelConfig got = ModelConfig::load(gguf_fixture(GetParam() + ".meta.gguf"));
  EXPECT_EQ(got.vocab_size, want.vocab_size);
  EXPECT_EQ(got.hidden_size, want.hidden_size);
  EXPECT_EQ(got.intermediate_size, want.intermediate_size);
  EXPECT_EQ(got.moe_intermediate_size, want.moe_intermediate_size);
  EXPECT_EQ(got.num_hidden_layers, want.num_hidden_layers);
  EXPECT_EQ(got.num_attention_heads, want.num_attention_heads);
  EXPECT_EQ(got.q_lora_rank, want.q_lora_rank);
  EXPECT_EQ(got.kv_lora_rank, want.kv_lora_rank);
  EXPECT_EQ(got.qk_nope_head_dim, want.qk_nope_head_dim);
  EXPECT_EQ(got.qk_rope_head_dim, want.qk_rope_head_dim);
  EXPECT_EQ(got.v_head_dim, want.v_head_dim);
  EXPECT_EQ(got.n_routed_experts, want.n_routed_experts);
  EXPECT_EQ(got.n_shared_experts, want.n_shared_experts);
  EXPECT_EQ(got.num_experts_per_tok, want.num_experts_per_tok);
  EXPECT_EQ(got.n_group, want.n_group);
  EXPECT_EQ(got.topk_group, want.topk_group);
  EXPECT_EQ(got.first_k_dense_replace, want.first_k_dense_replace);
  EXPECT_EQ(got.norm_topk_prob, want.norm_topk_prob);
  EXPECT_FLOAT_EQ(float(got.routed_scaling_factor), float(want.routed_scaling_factor));  // float32 in the file
  EXPECT_EQ(got.scoring_func, want.scoring_func);
  EXPECT_EQ(got.topk_method, want.topk_method);
  EXPECT_FLOAT_EQ(float(got.rms_norm_eps), float(want.rms_norm_eps));
  EXPECT_FLOAT_EQ(float(got.rope_theta), float(want.rope_theta));
  EXPECT_EQ(got.rope_scaling.yarn, want.rope_scaling.yarn);
  if (want.rope_scaling.yarn) {
    EXPECT_FLOAT_EQ(float(got.rope_scaling.factor), float(want.rope_scaling.factor));
    EXPECT_EQ(got.rope_scaling.original_max_position_embeddings, want.rope_scaling.original_max_position_embeddings);
    EXPECT_FLOAT_EQ(float(got.rope_scaling.beta_fast), float(want.rope_scaling.beta_fast));
    EXPECT_FLOAT_EQ(float(got.rope_scaling.beta_slow), float(want.rope_scaling.beta_slow));
    // Stored as float32 in the file: the two YaRN factors come back within float32 rounding.
    EXPECT_NEAR(got.rope_scaling.mscale, want.rope_scaling.mscale, 1e-5);
    EXPECT_NEAR(got.rope_scaling.mscale_all_dim, want.rope_scaling.mscale_all_dim, 1e-5);
    EXPECT_NEAR(got.softmax_scale(), want.softmax_scale(), 1e-6 * want.softmax_scale());
  }
  EXPECT_EQ(got.tie_word_embeddings, want.tie_word_embeddings);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufConfig,
                         ::testing::Values("deepseek-v2-lite-tiny", "deepseek-v2-tiny", "deepseek-v3-tiny",
                                           "deepseek-v3-yarn-tiny", "kimi-k2-tiny", "glm-4.7-flash-tiny"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& ch : s)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

// ---- the golden fixture, through llama.cpp's conversion --------------------------------------

// llama.cpp's MLA layout (attn_k_b / attn_v_b), BF16 as the fixture: HuggingFace's logits in
// every mode on both attention paths, within the golden tests' tolerance.
TEST(GgufGolden, Bf16FileGivesTheFixturesLogits) {
  auto model = Model::load(gguf_fixture("deepseek-v3-tiny-bf16.gguf"));
  SafetensorsFile golden(test::fixture("deepseek-v3-tiny") + "/golden.safetensors");
  for (int j = 0; j < 4; ++j) {
    auto ids = test::read_ids(*golden.find("seq" + std::to_string(j) + "_ids"));
    auto want = test::read_f32(*golden.find("seq" + std::to_string(j) + "_logits"));
    const int64_t n = int64_t(ids.size());
    for (const std::string& mode : {std::string("prefill"), std::string("decode"), "extend:" + std::to_string(n / 2)})
      for (AttnPath path : {AttnPath::Expand, AttnPath::Absorb}) {
        RunOptions opt;
        opt.mode = RunMode::parse(mode);
        opt.path = path;
        EXPECT_LE(test::max_abs_diff(run_logits(*model, ids, opt), want), 1e-3f)
            << "seq" << j << " " << mode << " " << attn_path_name(path);
      }
  }
}

// Files written before 2025 hold kv_b whole (attn_kv_b): the same logits through the loader's
// own absorption. The layout made here from the converted file: its attn_k_b / attn_v_b out,
// the fixture's kv_b_proj in as attn_kv_b.
TEST(GgufGolden, OlderKvbLayoutGivesTheFixturesLogits) {
  test::TempDir d("gguf-kvb");
  const GgufFile src(gguf_fixture("deepseek-v3-tiny-bf16.gguf"));
  const SafetensorsFile folder(test::fixture("deepseek-v3-tiny") + "/model.safetensors");
  test::GgufBuilder b;
  copy_metadata(src, b);
  for (const auto& [n, t] : src.tensors())
    if (n.find("attn_k_b") == std::string::npos && n.find("attn_v_b") == std::string::npos)
      b.add_tensor(n, t.type, t.ne, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  const int64_t layers = src.require_int("deepseek2.block_count");
  for (int64_t l = 0; l < layers; ++l) {
    const TensorInfo& kvb = *folder.find("model.layers." + std::to_string(l) + ".self_attn.kv_b_proj.weight");
    ASSERT_EQ(kvb.dtype, DType::BF16);
    b.add_tensor("blk." + std::to_string(l) + ".attn_kv_b.weight", uint32_t(GgmlType::BF16), {kvb.shape[1], kvb.shape[0]},
                 std::vector<uint8_t>(kvb.data, kvb.data + kvb.nbytes));
  }
  b.write(d / "old.gguf");
  auto model = Model::load(d / "old.gguf");
  EXPECT_EQ(model->weights().bytes_by_format.count("bf16 (derived kv_b)"), 0u);
  SafetensorsFile golden(test::fixture("deepseek-v3-tiny") + "/golden.safetensors");
  const auto ids = test::read_ids(*golden.find("seq2_ids"));
  const auto want = test::read_f32(*golden.find("seq2_logits"));
  for (AttnPath path : {AttnPath::Expand, AttnPath::Absorb}) {
    RunOptions opt;
    opt.path = path;
    EXPECT_LE(test::max_abs_diff(run_logits(*model, ids, opt), want), 1e-3f) << attn_path_name(path);
  }
}

// The prompt cache's key of a GGUF model: the same for the same file, another for another.
TEST(GgufModel, FingerprintTellsFilesApart) {
  const std::string a = gguf_fixture("kquant-tiny-q4_k_m.gguf"), b = gguf_fixture("kquant-tiny-q2_k_xl.gguf");
  EXPECT_EQ(checkpoint_fingerprint(a).hex(), checkpoint_fingerprint(a).hex());
  EXPECT_NE(checkpoint_fingerprint(a).hex(), checkpoint_fingerprint(b).hex());
  EXPECT_NE(checkpoint_fingerprint(a).hex(), checkpoint_fingerprint(test::fixture("deepseek-v3-tiny")).hex());
}

// ---- quantized files against llama.cpp ---------------------------------------------------------

struct Distance {
  double kl = 0;      // mean over positions of KL(reference || candidate)
  int top1 = 0;       // positions whose argmax agrees
  float max_abs = 0;  // largest logit difference
  // Where the argmax differs: the largest gap, in the reference's logits, between its argmax and
  // the candidate's (a near-tie that any rounding may flip has a small one).
  float worst_gap = 0;
};

Distance distance(const std::vector<float>& ref, const std::vector<float>& got, int64_t vocab) {
  Distance d;
  const int64_t T = int64_t(ref.size()) / vocab;
  for (int64_t t = 0; t < T; ++t) {
    const float* p = ref.data() + t * vocab;
    const float* q = got.data() + t * vocab;
    auto lse = [&](const float* x) {
      const float m = *std::max_element(x, x + vocab);
      double s = 0;
      for (int64_t i = 0; i < vocab; ++i) s += std::exp(double(x[i] - m));
      return double(m) + std::log(s);
    };
    const double lp = lse(p), lq = lse(q);
    for (int64_t i = 0; i < vocab; ++i) {
      const double a = double(p[i]) - lp, b = double(q[i]) - lq;
      d.kl += std::exp(a) * (a - b);
      d.max_abs = std::max(d.max_abs, std::abs(p[i] - q[i]));
    }
    const int64_t ip = std::max_element(p, p + vocab) - p, iq = std::max_element(q, q + vocab) - q;
    d.top1 += ip == iq;
    d.worst_gap = std::max(d.worst_gap, p[ip] - p[iq]);
  }
  d.kl /= double(T);
  return d;
}

class GgufQuantized : public ::testing::TestWithParam<std::string> {};

// On the same file, this engine's logits are llama.cpp's: the same argmax at every position, and
// no further from the unquantized model than llama.cpp's are (KL), beyond a margin: llama.cpp
// multiplies its quantized weights with 8-bit activations (Q8_K / Q8_0), this engine in the
// precise precision with float32 ones, so each is off the other by about the activations'
// rounding while both stay as close to the float32 model.
TEST_P(GgufQuantized, AgreesWithLlamaCppOnTheSameFile) {
  const std::string type = GetParam();
  auto model = Model::load(gguf_fixture("kquant-tiny-" + type + ".gguf"));
  const int64_t vocab = model->config().vocab_size;
  const auto ids = read_file<int32_t>(gguf_fixture("kquant-tiny.ids"));
  const auto f32 = read_file<float>(gguf_fixture("kquant-tiny-f32.logits"));
  const auto llama = read_file<float>(gguf_fixture("kquant-tiny-" + type + ".logits"));
  ASSERT_EQ(f32.size(), ids.size() * size_t(vocab));
  ASSERT_EQ(llama.size(), f32.size());
  const Distance theirs = distance(f32, llama, vocab);
  cpu::Context fast = model->context();
  fast.precision = cpu::Precision::Fast;  // what run, chat and serve compute in: 8- or 16-bit activations
  const cpu::Context* const contexts[] = {nullptr, &fast};  // null: the model's own (precise)
  for (const cpu::Context* ctx : contexts)
    for (const char* mode : {"prefill", "decode"})
      for (AttnPath path : {AttnPath::Expand, AttnPath::Absorb})
        for (KvDType kv : {KvDType::F32, KvDType::BF16}) {
        RunOptions opt;
        opt.mode = RunMode::parse(mode);
        opt.path = path;
        opt.kv_dtype = kv;
        opt.context = ctx;
        const auto ours = run_logits(*model, ids, opt);
        const Distance to_llama = distance(llama, ours, vocab), to_f32 = distance(f32, ours, vocab);
        const std::string where = type + (ctx ? " fast " : " precise ") + mode + " " + attn_path_name(path) +
                                  (kv == KvDType::BF16 ? " bf16 cache" : " f32 cache");
        // The same argmax as llama.cpp, but where the two engines' activation rounding (float32
        // or bf16 / int8 here, int8 in llama.cpp, each rounding differently) decides a near-tie:
        // llama.cpp's own logits then put our choice within kTie of its own. The two engines'
        // logits differ by up to 0.08-0.12 on these files (printed below, logits of standard
        // deviation 1), so a flip within 0.1 of a tie is that rounding, and one such is allowed.
        constexpr float kTie = 0.1f;
        EXPECT_GE(to_llama.top1, int(ids.size()) - 1) << where;
        EXPECT_LE(to_llama.worst_gap, kTie) << where << ": argmax differs from llama.cpp's where it is no tie";
        EXPECT_LE(to_f32.kl, theirs.kl * 1.25 + 1e-3) << where << ": KL to f32 " << to_f32.kl << ", llama.cpp's " << theirs.kl;
        std::printf("%-48s KL(f32||ours) %.3e  KL(f32||llama.cpp) %.3e  max|ours - llama.cpp| %.3e  argmax %d/%zu (gap %.3f)\n",
                    where.c_str(), to_f32.kl, theirs.kl, double(to_llama.max_abs), to_llama.top1, ids.size(),
                    double(to_llama.worst_gap));
      }
}

INSTANTIATE_TEST_SUITE_P(Files, GgufQuantized, ::testing::Values("q4_k_m", "q2_k_xl", "legacy"));

// ---- what the file holds -------------------------------------------------------------------------

TEST(GgufModel, WeightsStayInTheirBlockFormats) {
  auto model = Model::load(gguf_fixture("kquant-tiny-q4_k_m.gguf"));
  const auto& bytes = model->weights().bytes_by_format;
  EXPECT_TRUE(bytes.count("q4_k")) << weight_bytes_summary(model->weights());
  EXPECT_TRUE(bytes.count("q6_k")) << weight_bytes_summary(model->weights());
  EXPECT_EQ(model->weights().layers[1].experts[0].gate.format, WeightFormat::Q4_K);
}

TEST(GgufModel, MissingTensorNamesTheFilesTensor) {
  EXPECT_EQ(gguf_tensor_name("model.layers.3.mlp.experts.7.down_proj.weight"), "blk.3.ffn_down_exps.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.0.self_attn.kv_a_proj_with_mqa.weight"), "blk.0.attn_kv_a_mqa.weight");
  EXPECT_EQ(gguf_tensor_name("lm_head.weight"), "output.weight");
}

// ---- bad files -----------------------------------------------------------------------------------

void copy_metadata(const GgufFile& src, test::GgufBuilder& b) { test::copy_metadata(src.metadata(), b); }

// A copy of a fixture through the test writer (format/gguf_copy.h), `edit` changing it first.
std::string rewrite(const std::string& name, const test::TempDir& dir, const std::function<void(test::GgufBuilder&)>& edit) {
  const GgufFile src(gguf_fixture(name));
  test::GgufBuilder b;
  copy_metadata(src, b);
  for (const auto& [n, t] : src.tensors()) b.add_tensor(n, t.type, t.ne, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  edit(b);
  const std::string out = dir / "model.gguf";
  b.write(out);
  return out;
}

template <class F>
void expect_error(F fn, std::vector<std::string> fragments) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning " << fragments[0];
  } catch (const FormatError& e) {
    const std::string msg = e.what();
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "message: " << msg << "\nlacks: " << f;
  }
}

void drop_tensor(test::GgufBuilder& b, const std::string& name) {
  auto& ts = b.tensors();
  ts.erase(std::remove_if(ts.begin(), ts.end(), [&](const auto& t) { return t.name == name; }), ts.end());
}

TEST(BadGgufModel, RewrittenCopyStillLoads) {  // the rewrite itself keeps a good file good
  test::TempDir d("gguf");
  auto model = Model::load(rewrite("kquant-tiny-q4_k_m.gguf", d, [](auto&) {}));
  EXPECT_EQ(model->config().hidden_size, 256);
}

// The value of general.architecture, written first by gguf-py, renamed in place (same length).
TEST(BadGgufModel, ArchitectureThatIsNotMla) {
  test::TempDir d("gguf");
  std::ifstream f(gguf_fixture("deepseek-v3-tiny.meta.gguf"), std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::string needle = "deepseek2";
  auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
  ASSERT_NE(it, bytes.end());
  std::copy_n("llama2xyz", 9, it);
  const std::string path = d / "llama.gguf";
  test::GgufBuilder::write_bytes(path, bytes);
  expect_error([&] { ModelConfig::load(path); }, {path, "general.architecture", "not an MLA architecture"});
}

TEST(BadGgufModel, MissingTensorNamedAsInTheFile) {
  test::TempDir d("gguf");
  const std::string path =
      rewrite("kquant-tiny-q4_k_m.gguf", d, [](test::GgufBuilder& b) { drop_tensor(b, "blk.1.ffn_up_exps.weight"); });
  expect_error([&] { Model::load(path); }, {path, "blk.1.ffn_up_exps.weight", "missing"});
}

TEST(BadGgufModel, WrongShape) {
  test::TempDir d("gguf");
  const std::string path = rewrite("kquant-tiny-q4_k_m.gguf", d, [](test::GgufBuilder& b) {
    for (auto& t : b.tensors())
      if (t.name == "blk.0.attn_q_a_norm.weight") {  // f32 [256] -> [128]
        t.ne = {128};
        t.data.resize(128 * 4);
      }
  });
  expect_error([&] { Model::load(path); }, {path, "blk.0.attn_q_a_norm.weight", "shape"});
}

TEST(BadGgufModel, TypeTheEngineDoesNotRun) {
  test::TempDir d("gguf");
  const std::string path = rewrite("kquant-tiny-q4_k_m.gguf", d, [](test::GgufBuilder& b) {
    for (auto& t : b.tensors())
      if (t.name == "blk.0.ffn_down.weight") {  // q4_K [256, 256] -> iq2_xxs: 66 bytes a 256
        t.type = 16;
        t.data.assign(size_t(66) * 256, 0);
      }
  });
  expect_error([&] { Model::load(path); }, {path, "blk.0.ffn_down.weight", "iq2_xxs", "not supported"});
}

// A split set (as gguf-split writes one: the metadata in the first part, split.* keys in each,
// the tensors dealt across the parts) loads from its first part as the whole file does, and
// with a part missing is one error naming it.
TEST(GgufModel, SplitSetLoadsAsTheWholeFile) {
  test::TempDir d("gguf-split");
  const GgufFile src(gguf_fixture("kquant-tiny-q4_k_m.gguf"));
  constexpr int kParts = 3;
  std::vector<test::GgufBuilder> parts(kParts);
  copy_metadata(src, parts[0]);
  for (int i = 0; i < kParts; ++i) parts[size_t(i)].add_split_keys(i + 1, kParts, int32_t(src.tensors().size()));
  size_t k = 0;
  for (const auto& [n, t] : src.tensors())
    parts[k++ % kParts].add_tensor(n, t.type, t.ne, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  auto part = [&](int i) { return d / test::GgufBuilder::split_name("model", i, kParts); };
  for (int i = 0; i < kParts; ++i) parts[size_t(i)].write(part(i + 1));
  auto whole = Model::load(gguf_fixture("kquant-tiny-q4_k_m.gguf"));
  auto split = Model::load(part(1));
  const std::vector<int32_t> ids = {5, 17, 300, 2, 99, 41};
  RunOptions opt;
  EXPECT_EQ(run_logits(*split, ids, opt), run_logits(*whole, ids, opt));
  std::filesystem::remove(part(2));
  expect_error([&] { Model::load(part(1)); }, {"model-00002-of-00003.gguf", "missing"});
}

TEST(BadGgufModel, TruncatedFile) {
  test::TempDir d("gguf");
  std::ifstream f(gguf_fixture("kquant-tiny-q4_k_m.gguf"), std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (size_t keep : {size_t(3), size_t(100), bytes.size() / 2, bytes.size() - 1}) {
    const std::string path = d / "cut.gguf";
    test::GgufBuilder::write_bytes(path, std::vector<uint8_t>(bytes.begin(), bytes.begin() + long(keep)));
    expect_error([&] { Model::load(path); }, {path});
  }
}

}  // namespace
}  // namespace mla
