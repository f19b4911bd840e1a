// `mla quantize` of a llama.cpp GGUF file (tools/quantize.h): the copy is a hub folder (no
// block formats, kv_b_proj instead of llama.cpp's k_b_proj / v_b_proj, config.json from the
// metadata) that the loader reads and whose logits stay within a measured distance of the
// file's own; a BF16 file becomes a folder with the golden fixture's logits.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>

#include "format/error.h"
#include "format/gguf.h"
#include "format/gguf_copy.h"
#include "model/gguf_model.h"
#include "tokenizer/tokenizer.h"
#include "tools/quantize.h"
#include "tools/run_modes.h"
#include "test_util.h"

namespace mla {
namespace {

using nlohmann::json;
using quant::QuantFormat;
namespace fs = std::filesystem;

std::string gguf_fixture(const std::string& name) { return (test::source_dir() / "tests/fixtures/gguf" / name).string(); }

cpu::Context one_thread() {
  cpu::Context ctx;
  ctx.threads = 1;
  ctx.weights = cpu::WeightPlacement::Mapped;
  return ctx;
}

QuantizeReport quantize(const std::string& in, const std::string& out, const LoadQuantization& formats) {
  QuantizeOptions o;
  o.in = in;
  o.out = out;
  o.formats = formats;
  o.threads = 1;
  o.progress = false;
  return quantize_checkpoint(o);
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  return json::parse(f);
}

// kquant-tiny's token ids (tests/fixtures/gguf/README.md), as one sequence and its two halves.
std::vector<std::vector<int32_t>> kquant_sequences() {
  std::ifstream f(gguf_fixture("kquant-tiny.ids"), std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<int32_t> ids(bytes.size() / 4);
  std::memcpy(ids.data(), bytes.data(), ids.size() * 4);
  EXPECT_EQ(ids.size(), 24u);
  return {ids, std::vector<int32_t>(ids.begin(), ids.begin() + 12), std::vector<int32_t>(ids.begin() + 12, ids.end())};
}

// What every folder made from a GGUF file holds: hub dtypes only, kv_b_proj and neither of
// llama.cpp's halves, config.json, generation_config.json and the tokenizer files from the
// metadata (the folder's tokenizer is the file's), and no note.
void expect_hub_folder(const std::string& gguf, const test::TempDir& out, const QuantizeReport& rep) {
  const Checkpoint ck(out.str());
  const ModelConfig cfg = ModelConfig::load(gguf);
  for (const std::string& name : ck.names()) {
    const TensorInfo& t = ck.get(name);
    EXPECT_FALSE(t.ggml) << name;
    EXPECT_NE(t.dtype, DType::U8) << name;
    EXPECT_EQ(name.find(".k_b_proj"), std::string::npos) << name;
    EXPECT_EQ(name.find(".v_b_proj"), std::string::npos) << name;
  }
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string a = "model.layers." + std::to_string(l) + ".self_attn.kv_b_proj.";
    EXPECT_TRUE(ck.find(a + "weight") || ck.find(a + "weight_packed")) << a;
  }
  const ModelConfig got = ModelConfig::load(out.str());
  EXPECT_EQ(got.hidden_size, cfg.hidden_size);
  EXPECT_EQ(got.kv_lora_rank, cfg.kv_lora_rank);
  EXPECT_EQ(got.qk_nope_head_dim, cfg.qk_nope_head_dim);
  EXPECT_EQ(got.v_head_dim, cfg.v_head_dim);
  EXPECT_EQ(got.n_routed_experts, cfg.n_routed_experts);
  const json gen = read_json(out / "generation_config.json");
  const GgufFile f(gguf);
  EXPECT_EQ(gen["bos_token_id"], *f.get_int("tokenizer.ggml.bos_token_id"));
  EXPECT_EQ(gen["eos_token_id"], *f.get_int("tokenizer.ggml.eos_token_id"));
  EXPECT_TRUE(fs::exists(out / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(out / "tokenizer_config.json"));
  EXPECT_TRUE(rep.notes.empty()) << rep.notes.front();
  const Tokenizer want = Tokenizer::load(gguf), got_tok = Tokenizer::load(out.str());
  EXPECT_EQ(got_tok.vocab_size(), want.vocab_size());
  EXPECT_EQ(got_tok.bos_id(), want.bos_id());
  EXPECT_EQ(got_tok.eos_id(), want.eos_id());
  EXPECT_EQ(got_tok.chat_template(), want.chat_template());
  const std::string text = "The quick brown fox: 12345 <｜User｜>hi<｜Assistant｜> 你好";
  EXPECT_EQ(got_tok.encode(text, true), want.encode(text, true));
}

// No targets: every block-format tensor becomes bf16, the float32 ones (norms, the router, the
// router's bias) stay float32, each value exactly: bf16 of the block format's dequantized value,
// and kv_b exactly the loader's own derivation from the file's k_b / v_b. The logits then differ
// from the file's only by the weights' rounding to bf16 (relative 2^-9 at most): measured mean
// KL 1.3e-5, max |d| 0.029 over the 48 positions (llama.cpp's file against its F32 original:
// KL 0.034); the bounds leave 2x room, 100x below the int4/int8 copy's KL.
TEST(QuantizeGguf, KquantFileToBf16FolderIsExactBf16) {
  const std::string in = gguf_fixture("kquant-tiny-q4_k_m.gguf");
  test::TempDir out("quantize-gguf-bf16");
  const auto rep = quantize(in, out.str(), LoadQuantization{});
  expect_hub_folder(in, out, rep);
  EXPECT_FALSE(read_json(out / "config.json").contains("quantization_config"));

  const Checkpoint got(out.str());
  const auto src = open_checkpoint(in);
  auto ref = Model::load(in, one_thread());
  int block_format = 0;
  for (const std::string& name : got.names()) {
    const TensorInfo& t = got.get(name);
    const size_t kv_b = name.find(".self_attn.kv_b_proj.weight");
    if (kv_b != std::string::npos) {  // the loader's derived bf16 kv_b, byte for byte
      const MatrixView& want = ref->weights().layers[size_t(std::stoi(name.substr(13)))].kv_b;
      ASSERT_EQ(want.format, WeightFormat::BF16);
      ASSERT_EQ(t.shape, (std::vector<int64_t>{want.rows, want.cols})) << name;
      EXPECT_EQ(std::memcmp(t.data, want.data, t.nbytes), 0) << name;
      continue;
    }
    const TensorInfo& s = src->get(name);
    EXPECT_EQ(t.shape, s.shape) << name;
    if (!s.ggml) {  // float32 as it was
      EXPECT_EQ(t.dtype, s.dtype) << name;
      EXPECT_EQ(std::memcmp(t.data, s.data, t.nbytes), 0) << name;
      continue;
    }
    ASSERT_EQ(t.dtype, DType::BF16) << name;
    ++block_format;
    MatrixView v;
    v.format = *s.ggml;
    v.cols = s.shape.back();
    v.rows = s.numel() / v.cols;
    v.data = s.data;
    std::vector<float> row(size_t(v.cols));
    const uint16_t* b = reinterpret_cast<const uint16_t*>(t.data);
    int64_t differ = 0;
    for (int64_t r = 0; r < v.rows; ++r) {
      v.dequant_row(r, row.data());
      for (int64_t k = 0; k < v.cols; ++k) differ += b[r * v.cols + k] != f32_to_bf16(row[size_t(k)]);
    }
    EXPECT_EQ(differ, 0) << name;
  }
  EXPECT_GT(block_format, 20);

  auto q = Model::load(out.str(), one_thread());
  const auto d = logits_distance(*ref, *q, kquant_sequences());
  std::printf("bf16 folder vs GGUF: %s", logits_distance_text(d).c_str());
  EXPECT_EQ(d.argmax_agree, d.positions);
  EXPECT_LT(d.mean_kl, 3e-5);
  EXPECT_LT(d.max_abs, 0.06);
}

// experts=int4, others=int8: the block formats' values requantized. INT4 in groups of 32 with
// a bf16 scale is about as fine as the Q4_K (sub-blocks of 32, 6-bit scales) and Q5_0 it
// replaces, INT8 finer than Q6_K, so the copy moves from the file by a fraction of what the
// file moved from its float32 original: measured mean KL 0.0032 (the file from its F32
// original: 0.034), max |d| 0.32, the argmax agreeing at 44 of 48 positions (random tiny
// weights, whose top logits lie close). Bounds: 2x the KL and |d|, 42 of 48.
TEST(QuantizeGguf, KquantFileToInt4Int8FolderWithinMeasuredBound) {
  const std::string in = gguf_fixture("kquant-tiny-q4_k_m.gguf");
  test::TempDir out("quantize-gguf-int");
  const auto rep = quantize(in, out.str(), LoadQuantization::parse("experts=int4,others=int8"));
  expect_hub_folder(in, out, rep);
  EXPECT_EQ(read_json(out / "config.json")["quantization_config"]["format"], "mixed-precision");
  EXPECT_EQ(rep.classes.at("attention").converted, rep.classes.at("attention").tensors);

  auto q = Model::load(out.str(), one_thread());
  const auto& w = q->weights();
  for (const auto& L : w.layers) {
    EXPECT_EQ(L.kv_b.format, WeightFormat::INT8_GROUP);
    EXPECT_EQ(L.q_b.format, WeightFormat::INT8_GROUP);
    if (L.moe) {
      EXPECT_EQ(L.experts[0].down.format, WeightFormat::INT4_GROUP);
      EXPECT_EQ(L.shared.up.format, WeightFormat::INT8_GROUP);
    } else {
      EXPECT_EQ(L.dense.gate.format, WeightFormat::INT8_GROUP);
    }
  }
  EXPECT_EQ(w.lm_head.format, WeightFormat::BF16);  // embed unset: the Q6_K head to bf16

  auto ref = Model::load(in, one_thread());
  const auto d = logits_distance(*ref, *q, kquant_sequences());
  std::printf("int4/int8 folder vs GGUF: %s", logits_distance_text(d).c_str());
  EXPECT_GT(d.mean_kl, 0.0);
  EXPECT_LT(d.mean_kl, 0.0065);
  EXPECT_LT(d.max_abs, 0.65);
  EXPECT_GE(d.argmax_agree, 42);
}

// llama.cpp's BF16 conversion of the golden fixture (k_b / v_b layout) as a folder: kv_b is
// put back from bf16 values exactly, so the folder gives HuggingFace's logits as the file does.
TEST(QuantizeGguf, Bf16GoldenFileToFolderGivesTheGoldenLogits) {
  const std::string in = gguf_fixture("deepseek-v3-tiny-bf16.gguf");
  test::TempDir out("quantize-gguf-golden");
  const auto rep = quantize(in, out.str(), LoadQuantization{});
  expect_hub_folder(in, out, rep);
  for (auto& [name, s] : rep.classes) EXPECT_EQ(s.err2, 0.0) << name;
  auto model = Model::load(out.str(), one_thread());
  SafetensorsFile golden(test::fixture("deepseek-v3-tiny") + "/golden.safetensors");
  for (int j = 0; j < 4; ++j) {
    auto ids = test::read_ids(*golden.find("seq" + std::to_string(j) + "_ids"));
    auto want = test::read_f32(*golden.find("seq" + std::to_string(j) + "_logits"));
    for (AttnPath path : {AttnPath::Expand, AttnPath::Absorb}) {
      RunOptions opt;
      opt.path = path;
      EXPECT_LE(test::max_abs_diff(run_logits(*model, ids, opt), want), 1e-3f) << "seq" << j << " " << attn_path_name(path);
    }
  }
}

// A copy of `src` at `path` with metadata `meta`; `replace(b, name, tensor)` may add a tensor its
// own way (returning true), else it is copied as it is.
using ReplaceTensor = std::function<bool(test::GgufBuilder&, const std::string&, const GgufTensor&)>;
void write_gguf_copy(const GgufFile& src, const std::map<std::string, GgufValue>& meta, const std::string& path,
                     const ReplaceTensor& replace = {}) {
  test::GgufBuilder b;
  test::copy_metadata(meta, b);
  for (const auto& [n, t] : src.tensors())
    if (!replace || !replace(b, n, t)) b.add_tensor(n, t.type, t.ne, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  b.write(path);
}

// A tensor of a type the engine does not read: the loader's error, naming the file, the tensor
// and the type, before anything is written.
TEST(QuantizeGguf, UnsupportedTypeIsRefused) {
  test::TempDir d("quantize-gguf-bad");
  const GgufFile src(gguf_fixture("kquant-tiny-q4_k_m.gguf"));
  const std::string path = d / "model.gguf";
  write_gguf_copy(src, src.metadata(), path, [](test::GgufBuilder& b, const std::string& n, const GgufTensor& t) {
    if (n != "blk.0.ffn_down.weight") return false;
    b.add_tensor(n, 16, t.ne, std::vector<uint8_t>(size_t(66) * 256, 0));  // q4_K [256, 256] -> iq2_xxs: 66 bytes a 256
    return true;
  });
  const std::string out = d / "out";
  try {
    quantize(path, out, LoadQuantization::parse("experts=int4,others=int8"));
    ADD_FAILURE() << "no error";
  } catch (const FormatError& e) {
    const std::string msg = e.what();
    for (const char* want : {path.c_str(), "blk.0.ffn_down.weight", "iq2_xxs", "not supported"})
      EXPECT_NE(msg.find(want), std::string::npos) << msg;
  }
  EXPECT_FALSE(fs::exists(fs::path(out) / "config.json"));
}

// A GGUF file whose tokenizer this engine cannot read (here SentencePiece) still gives its
// weights: no tokenizer files, and one note saying why and what to copy in.
TEST(QuantizeGguf, UnreadableTokenizerIsANote) {
  test::TempDir d("quantize-gguf-sentencepiece");
  const GgufFile src(gguf_fixture("kquant-tiny-q4_k_m.gguf"));
  std::map<std::string, GgufValue> meta = src.metadata();
  meta["tokenizer.ggml.model"].s = "llama";
  const std::string path = d / "model.gguf";
  write_gguf_copy(src, meta, path);
  const std::string out = d / "out";
  const auto rep = quantize(path, out, LoadQuantization{});
  EXPECT_TRUE(fs::exists(fs::path(out) / "config.json"));
  EXPECT_FALSE(fs::exists(fs::path(out) / "tokenizer.json"));
  EXPECT_FALSE(fs::exists(fs::path(out) / "tokenizer_config.json"));
  ASSERT_EQ(rep.notes.size(), 1u);
  for (const char* want : {"no tokenizer files written", "tokenizer.ggml.model", "SentencePiece", "tokenizer.json"})
    EXPECT_NE(rep.notes[0].find(want), std::string::npos) << rep.notes[0];
  EXPECT_NE(quantize_report_text(rep).find("note: no tokenizer files"), std::string::npos);
}

}  // namespace
}  // namespace mla
