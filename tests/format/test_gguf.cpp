// The GGUF reader: what it reads back from files written by the test builder and by llama.cpp's
// own writer (tests/fixtures/gguf/), and the FormatError each kind of bad file ends in.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>

#include "format/error.h"
#include "format/gguf.h"
#include "format/gguf_builder.h"
#include "tensor/dtype.h"
#include "tensor/ggml_blocks.h"
#include "test_util.h"

namespace mla {
namespace {

using test::GgufBuilder;
namespace fs = std::filesystem;

// Runs fn, expects a FormatError whose message contains every fragment.
template <class F>
void expect_error(F fn, const std::vector<std::string>& fragments) {
  try {
    fn();
    ADD_FAILURE() << "no error raised; expected one mentioning " << fragments[0];
  } catch (const FormatError& e) {
    const std::string msg = e.what();
    for (auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "message: " << msg << "\nlacks: " << f;
  }
}

std::vector<uint8_t> iota_bytes(size_t n, uint8_t first = 1) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(first + i * 7);
  return v;
}

// "t<k>" (appended, not "t" + string: GCC 12 warns falsely on that operator+ under -O2).
std::string tensor_name(int k) {
  std::string s = "t";
  s += std::to_string(k);
  return s;
}

// A small valid model: a little metadata, an f32 [4, 2] and a q8_0 [32, 1] tensor.
GgufBuilder small_model() {
  GgufBuilder b;
  b.add_string("general.architecture", "deepseek2");
  b.add_u32("deepseek2.block_count", 1);
  b.add_tensor_f32("token_embd.weight", {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  b.add_tensor("blk.0.ffn_down.weight", 8, {32, 1}, iota_bytes(34));
  return b;
}

// Writes b to dir/name and opens it (the open is expected to throw in the bad-file tests).
std::string write(const test::TempDir& d, const GgufBuilder& b, const std::string& name = "model.gguf") {
  const std::string path = d / name;
  b.write(path);
  return path;
}

TEST(GgufTypes, BlockShapesAsGgml) {
  // ggml.c's type_traits and gguf-py's GGML_QUANT_SIZES.
  struct Row {
    GgmlType t;
    const char* name;
    int64_t values;
    size_t bytes;
  };
  const Row rows[] = {
      {GgmlType::F32, "f32", 1, 4},          {GgmlType::F16, "f16", 1, 2},
      {GgmlType::BF16, "bf16", 1, 2},        {GgmlType::Q4_0, "q4_0", 32, 18},
      {GgmlType::Q4_1, "q4_1", 32, 20},      {GgmlType::Q5_0, "q5_0", 32, 22},
      {GgmlType::Q5_1, "q5_1", 32, 24},      {GgmlType::Q8_0, "q8_0", 32, 34},
      {GgmlType::Q8_1, "q8_1", 32, 36},      {GgmlType::Q2_K, "q2_K", 256, 84},
      {GgmlType::Q3_K, "q3_K", 256, 110},    {GgmlType::Q4_K, "q4_K", 256, 144},
      {GgmlType::Q5_K, "q5_K", 256, 176},    {GgmlType::Q6_K, "q6_K", 256, 210},
      {GgmlType::Q8_K, "q8_K", 256, 292},    {GgmlType::IQ2_XXS, "iq2_xxs", 256, 66},
      {GgmlType::IQ2_XS, "iq2_xs", 256, 74}, {GgmlType::IQ3_XXS, "iq3_xxs", 256, 98},
      {GgmlType::IQ1_S, "iq1_s", 256, 50},   {GgmlType::IQ4_NL, "iq4_nl", 32, 18},
      {GgmlType::IQ3_S, "iq3_s", 256, 110},  {GgmlType::IQ2_S, "iq2_s", 256, 82},
      {GgmlType::IQ4_XS, "iq4_xs", 256, 136}, {GgmlType::I8, "i8", 1, 1},
      {GgmlType::I16, "i16", 1, 2},          {GgmlType::I32, "i32", 1, 4},
      {GgmlType::I64, "i64", 1, 8},          {GgmlType::F64, "f64", 1, 8},
      {GgmlType::IQ1_M, "iq1_m", 256, 56},   {GgmlType::TQ1_0, "tq1_0", 256, 54},
      {GgmlType::TQ2_0, "tq2_0", 256, 66},   {GgmlType::MXFP4, "mxfp4", 32, 17},
  };
  for (const Row& r : rows) {
    auto info = ggml_type_info(uint32_t(r.t));
    ASSERT_TRUE(info) << r.name;
    EXPECT_STREQ(info->name, r.name);
    EXPECT_EQ(info->values, r.values) << r.name;
    EXPECT_EQ(info->bytes, r.bytes) << r.name;
  }
  // The numbers ggml left empty (q4_2, q4_3, removed repacked layouts) and beyond.
  for (uint32_t t : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 99u, 0xFFFFFFFFu}) EXPECT_FALSE(ggml_type_info(t)) << t;
}

TEST(GgufRead, EveryValueKind) {
  test::TempDir d("gguf");
  GgufBuilder b;
  b.add_u8("u8", 200).add_i8("i8", -100).add_u16("u16", 60000).add_i16("i16", -30000);
  b.add_u32("u32", 4000000000u).add_i32("i32", -2000000000).add_u64("u64", uint64_t(1) << 62);
  b.add_i64("i64", -(int64_t(1) << 62)).add_f32("f32", 0.5f).add_f64("f64", -2.25);
  b.add_bool("yes", true).add_bool("no", false).add_string("s", "héllo").add_string("empty", "");
  b.add_array<uint8_t>("a.u8", GgufBuilder::U8, {0, 255});
  b.add_array<int8_t>("a.i8", GgufBuilder::I8, {-128, 127});
  b.add_array<uint16_t>("a.u16", GgufBuilder::U16, {65535});
  b.add_array<int16_t>("a.i16", GgufBuilder::I16, {-32768});
  b.add_array<uint32_t>("a.u32", GgufBuilder::U32, {4294967295u, 0});
  b.add_array<int32_t>("a.i32", GgufBuilder::I32, {1, -2, 3});
  b.add_array<uint64_t>("a.u64", GgufBuilder::U64, {uint64_t(INT64_MAX)});
  b.add_array<int64_t>("a.i64", GgufBuilder::I64, {INT64_MIN});
  b.add_array<float>("a.f32", GgufBuilder::F32, {0.25f, -1.5f});
  b.add_array<double>("a.f64", GgufBuilder::F64, {1e300});
  b.add_array<uint8_t>("a.bool", GgufBuilder::Bool, {1, 0, 1});
  b.add_string_array("a.str", {"a", "", "ccc"});
  b.add_array<int32_t>("a.none", GgufBuilder::I32, {});
  GgufFile f(write(d, b));

  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.metadata().size(), 27u);
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(f.get_int("u8"), 200);
  EXPECT_EQ(f.get_int("i8"), -100);
  EXPECT_EQ(f.get_int("u16"), 60000);
  EXPECT_EQ(f.get_int("i16"), -30000);
  EXPECT_EQ(f.get_int("u32"), 4000000000);
  EXPECT_EQ(f.get_int("i32"), -2000000000);
  EXPECT_EQ(f.get_int("u64"), int64_t(1) << 62);
  EXPECT_EQ(f.get_int("i64"), -(int64_t(1) << 62));
  EXPECT_EQ(f.get_float("f32"), 0.5);
  EXPECT_EQ(f.get_float("f64"), -2.25);
  EXPECT_EQ(f.get_bool("yes"), true);
  EXPECT_EQ(f.get_bool("no"), false);
  EXPECT_EQ(f.get_string("s"), "héllo");
  EXPECT_EQ(f.get_string("empty"), "");
  EXPECT_EQ(f.find("u16")->type, GgufType::U16);
  EXPECT_EQ(f.find("f32")->type, GgufType::F32);
  EXPECT_EQ(f.find("s")->kind, GgufValue::Kind::String);

  auto arr = [&](const std::string& k) -> const GgufValue& {
    const GgufValue* v = f.find(k);
    EXPECT_TRUE(v && v->kind == GgufValue::Kind::Array) << k;
    static const GgufValue none;
    return v ? *v : none;
  };
  EXPECT_EQ(arr("a.u8").ints, (std::vector<int64_t>{0, 255}));
  EXPECT_EQ(arr("a.i8").ints, (std::vector<int64_t>{-128, 127}));
  EXPECT_EQ(arr("a.u16").ints, (std::vector<int64_t>{65535}));
  EXPECT_EQ(arr("a.i16").ints, (std::vector<int64_t>{-32768}));
  EXPECT_EQ(arr("a.u32").ints, (std::vector<int64_t>{4294967295, 0}));
  EXPECT_EQ(arr("a.i32").ints, (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(arr("a.i32").type, GgufType::I32);
  EXPECT_EQ(arr("a.i32").elem, GgufValue::Kind::Int);
  EXPECT_EQ(arr("a.u64").ints, (std::vector<int64_t>{INT64_MAX}));
  EXPECT_EQ(arr("a.i64").ints, (std::vector<int64_t>{INT64_MIN}));
  EXPECT_EQ(arr("a.f32").floats, (std::vector<double>{0.25, -1.5}));
  EXPECT_EQ(arr("a.f32").elem, GgufValue::Kind::Float);
  EXPECT_EQ(arr("a.f64").floats, (std::vector<double>{1e300}));
  EXPECT_EQ(arr("a.bool").ints, (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(arr("a.bool").elem, GgufValue::Kind::Bool);
  EXPECT_EQ(arr("a.str").strings, (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(arr("a.str").size(), 3u);
  EXPECT_EQ(arr("a.none").size(), 0u);
  EXPECT_EQ(f.find("u8")->size(), 1u);
}

TEST(GgufRead, TypedReadsNameTheKey) {
  test::TempDir d("gguf");
  GgufBuilder b;
  b.add_u32("n", 7).add_f32("x", 1.5f).add_string("s", "v").add_bool("flag", true);
  b.add_array<int32_t>("list", GgufBuilder::I32, {1});
  GgufFile f(write(d, b));
  EXPECT_EQ(f.get_float("n"), 7.0);  // integers read as floats
  EXPECT_EQ(f.require_int("n"), 7);
  EXPECT_EQ(f.require_string("s"), "v");
  EXPECT_FALSE(f.get_int("absent"));
  EXPECT_FALSE(f.get_string("absent"));
  EXPECT_EQ(f.find("absent"), nullptr);
  expect_error([&] { f.get_int("x"); }, {"model.gguf", "key 'x'", "not an integer"});
  expect_error([&] { f.get_int("list"); }, {"key 'list'", "not an integer"});
  expect_error([&] { f.get_float("s"); }, {"key 's'", "not a number"});
  expect_error([&] { f.get_bool("n"); }, {"key 'n'", "not a bool"});
  expect_error([&] { f.get_string("flag"); }, {"key 'flag'", "not a string"});
  expect_error([&] { f.require_int("absent"); }, {"model.gguf", "key 'absent'", "missing"});
  expect_error([&] { f.require_string("absent"); }, {"key 'absent'", "missing"});
}

TEST(GgufRead, TensorsOfSeveralTypes) {
  test::TempDir d("gguf");
  for (uint32_t version : {2u, 3u})
    for (uint32_t align : {32u, 64u, 1u}) {
      SCOPED_TRACE("version " + std::to_string(version) + ", alignment " + std::to_string(align));
      GgufBuilder b;
      b.version = version;
      if (align != 32) b.set_alignment(align);
      b.add_tensor_f32("f32", {4, 3}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
      b.add_tensor("i8", 24, {5}, iota_bytes(5));               // 5 bytes: the next one is padded
      b.add_tensor("f16", 1, {3, 1, 2}, iota_bytes(12));
      b.add_tensor("q4_0", 2, {64, 2}, iota_bytes(2 * 2 * 18));
      b.add_tensor("q4_K", 12, {256, 1, 1, 2}, iota_bytes(2 * 144));
      b.add_tensor("bf16", 30, {2, 2}, iota_bytes(8));
      b.add_tensor("empty", 0, {0, 3}, {});  // ggml allows a zero dimension
      GgufFile f(write(d, b));
      EXPECT_EQ(f.version(), version);
      EXPECT_EQ(f.alignment(), align);
      ASSERT_EQ(f.tensors().size(), 7u);
      size_t total = 0;
      for (const auto& bt : b.tensors()) {
        const GgufTensor* t = f.find_tensor(bt.name);
        ASSERT_NE(t, nullptr) << bt.name;
        EXPECT_EQ(t->name, bt.name);
        EXPECT_EQ(t->type, bt.type);
        EXPECT_EQ(t->ne, bt.ne);
        EXPECT_EQ(t->file, d / "model.gguf");
        ASSERT_EQ(t->nbytes, bt.data.size()) << bt.name;
        if (t->nbytes) {
          EXPECT_EQ(std::memcmp(t->data, bt.data.data(), t->nbytes), 0) << bt.name;
        }
        total += t->nbytes;
      }
      EXPECT_EQ(f.total_bytes(), total);
      EXPECT_EQ(f.find_tensor("f16")->shape_str(), "[3, 1, 2]");
      // Each tensor starts on the alignment, counted from the data section (here the first).
      const uint8_t* base = f.find_tensor("f32")->data;
      for (auto& [name, t] : f.tensors())
        if (t.nbytes) {
          EXPECT_EQ(size_t(t.data - base) % align, 0u) << name;
        }
      EXPECT_EQ(f.find_tensor("absent"), nullptr);
    }
}

TEST(GgufRead, MetadataOnlyFileEndsAfterItsMetadata) {
  test::TempDir d("gguf");
  GgufBuilder b;
  b.add_string("general.architecture", "deepseek2");
  GgufFile f(write(d, b));  // no tensors, so no padding and no data section
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(f.total_bytes(), 0u);
  EXPECT_EQ(f.parts(), std::vector<std::string>{d / "model.gguf"});
}

TEST(GgufRead, PrefaultAndReleasePagesKeepTheDataReadable) {
  test::TempDir d("gguf");
  GgufFile f(write(d, small_model()));
  size_t last = 0, calls = 0;
  f.prefault([&](size_t done, size_t total) {
    EXPECT_LE(done, total);
    last = done;
    ++calls;
  });
  EXPECT_GT(calls, 0u);
  EXPECT_EQ(last, fs::file_size(d / "model.gguf"));
  f.release_pages();
  const GgufTensor* t = f.find_tensor("token_embd.weight");
  float v[8];
  std::memcpy(v, t->data, sizeof v);
  EXPECT_EQ(v[7], 8.0f);
}

// tests/fixtures/gguf/tiny-llamacpp.gguf, written by llama.cpp's gguf-py (make_gguf_fixtures.py).
TEST(GgufRead, ReadsWhatLlamaCppWrites) {
  GgufFile f((test::source_dir() / "tests/fixtures/gguf/tiny-llamacpp.gguf").string());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "deepseek2");
  EXPECT_EQ(f.get_int("test.u8"), 200);
  EXPECT_EQ(f.get_int("test.i8"), -100);
  EXPECT_EQ(f.get_int("test.u16"), 60000);
  EXPECT_EQ(f.get_int("test.i16"), -30000);
  EXPECT_EQ(f.get_int("test.u32"), 4000000000);
  EXPECT_EQ(f.get_int("test.i32"), -2000000000);
  EXPECT_EQ(f.get_int("test.u64"), int64_t(1) << 40);
  EXPECT_EQ(f.get_int("test.i64"), -(int64_t(1) << 40));
  EXPECT_EQ(f.get_float("test.f32"), 0.5);
  EXPECT_EQ(f.get_float("test.f64"), -2.25);
  EXPECT_EQ(f.get_bool("test.bool"), true);
  EXPECT_EQ(f.get_string("test.string"), "héllo");
  EXPECT_EQ(f.find("test.strings")->strings, (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(f.find("test.i32s")->ints, (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f.find("test.f32s")->floats, (std::vector<double>{0.25, -1.5}));
  EXPECT_EQ(f.find("test.bools")->ints, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(f.get_int("deepseek2.block_count"), 2);
  EXPECT_EQ(f.find("deepseek2.block_count")->type, GgufType::U32);
  ASSERT_EQ(f.tensors().size(), 5u);

  const GgufTensor* t = f.find_tensor("f32");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->ne, (std::vector<int64_t>{4, 3}));  // numpy (3, 4)
  for (int i = 0; i < 12; ++i) {
    float v;
    std::memcpy(&v, t->data + 4 * i, 4);
    EXPECT_EQ(v, float(i - 6) / 4) << i;
  }
  t = f.find_tensor("f16");
  EXPECT_EQ(t->ne, (std::vector<int64_t>{8}));
  for (int i = 0; i < 8; ++i) {
    uint16_t h;
    std::memcpy(&h, t->data + 2 * i, 2);
    EXPECT_EQ(f16_to_f32(h), 0.5f * float(i)) << i;
  }
  t = f.find_tensor("i32");
  EXPECT_EQ(t->ne, (std::vector<int64_t>{4, 3, 2}));
  EXPECT_EQ(t->type, uint32_t(GgmlType::I32));
  for (int i = 0; i < 24; ++i) {
    int32_t v;
    std::memcpy(&v, t->data + 4 * i, 4);
    EXPECT_EQ(v, i - 5) << i;
  }
  t = f.find_tensor("bf16");
  EXPECT_EQ(t->ne, (std::vector<int64_t>{8, 2}));
  EXPECT_EQ(t->type, uint32_t(GgmlType::BF16));
  for (int i = 0; i < 16; ++i) {
    uint16_t h;
    std::memcpy(&h, t->data + 2 * i, 2);
    EXPECT_EQ(bf16_to_f32(h), 0.125f * float(i)) << i;
  }
  t = f.find_tensor("q8_0");
  EXPECT_EQ(t->ne, (std::vector<int64_t>{64, 2}));
  EXPECT_EQ(t->type, uint32_t(GgmlType::Q8_0));
  ASSERT_EQ(t->nbytes, 4u * 34);
  float deq[128];
  ggml_dequantize(WeightFormat::Q8_0, t->data, 128, deq);
  for (int r = 0; r < 2; ++r)
    for (int k = 0; k < 64; ++k) {
      int q = (9 * k + 5 * r) % 255 - 127;
      if (k % 32 == 0) q = r ? -127 : 127;
      EXPECT_EQ(deq[r * 64 + k], float(q) / 64) << r << ", " << k;
    }
}

TEST(GgufRead, ReadsASplitSetLlamaCppWrites) {
  const fs::path dir = test::source_dir() / "tests/fixtures/gguf";
  GgufFile f((dir / "tiny-split-00002-of-00003.gguf").string());
  EXPECT_EQ(f.parts().size(), 3u);
  EXPECT_EQ(f.path(), (dir / "tiny-split-00001-of-00003.gguf").string());
  EXPECT_EQ(f.get_int("deepseek2.block_count"), 1);
  EXPECT_EQ(f.get_int("split.count"), 3);
  ASSERT_EQ(f.tensors().size(), 3u);
  for (int k = 0; k < 3; ++k) {
    const GgufTensor* t = f.find_tensor(tensor_name(k));
    ASSERT_TRUE(t);
    EXPECT_EQ(t->file, (dir / GgufBuilder::split_name("tiny-split", k + 1, 3)).string());
    float v;
    std::memcpy(&v, t->data + 28, 4);
    EXPECT_EQ(v, float(k + 1));
  }
}

// ---- bad files

TEST(GgufBad, TruncatedAnywhere) {
  test::TempDir d("gguf");
  GgufBuilder b = small_model();
  b.add_string_array("tokens", {"a", "bb"});
  const std::vector<uint8_t> whole = b.bytes();
  const std::string path = d / "model.gguf";
  for (size_t n = 0; n < whole.size(); ++n) {
    GgufBuilder::write_bytes(path, std::vector<uint8_t>(whole.begin(), whole.begin() + long(n)));
    try {
      GgufFile f(path);
      ADD_FAILURE() << "opened when cut to " << n << " of " << whole.size() << " bytes";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
  GgufBuilder::write_bytes(path, whole);
  EXPECT_NO_THROW(GgufFile f(path));
}

TEST(GgufBad, TruncationSaysWhatWasBeingRead) {
  test::TempDir d("gguf");
  const std::vector<uint8_t> whole = small_model().bytes();
  const std::string path = d / "model.gguf";
  GgufBuilder::write_bytes(path, std::vector<uint8_t>(whole.begin(), whole.end() - 1));
  expect_error([&] { GgufFile f(path); }, {path, "tensor 'blk.0.ffn_down.weight'", "run past the end of the file"});
  GgufBuilder::write_bytes(path, std::vector<uint8_t>(whole.begin(), whole.begin() + 70));  // in the first value
  expect_error([&] { GgufFile f(path); }, {path, "key 'general.architecture'", "runs past the end of the file"});
  GgufBuilder::write_bytes(path, std::vector<uint8_t>(whole.begin(), whole.begin() + 75));  // in the next key
  expect_error([&] { GgufFile f(path); }, {path, "metadata entry 1", "truncated: the key"});
  GgufBuilder::write_bytes(path, {});
  expect_error([&] { GgufFile f(path); }, {path, "truncated: 0 bytes"});
}

TEST(GgufBad, MissingFile) {
  test::TempDir d("gguf");
  expect_error([&] { GgufFile f(d / "absent.gguf"); }, {"absent.gguf", "no such file"});
}

TEST(GgufBad, WrongMagic) {
  test::TempDir d("gguf");
  GgufBuilder b = small_model();
  b.magic = "GGML";
  expect_error([&] { GgufFile f(write(d, b)); }, {"model.gguf", "not a GGUF file", "'GGML'"});
  b.magic = std::string("\x7f" "ELF", 4);
  expect_error([&] { GgufFile f(write(d, b)); }, {"not a GGUF file", "\\x7fELF"});
}

TEST(GgufBad, Versions) {
  test::TempDir d("gguf");
  GgufBuilder b = small_model();
  b.version = 1;
  expect_error([&] { GgufFile f(write(d, b)); }, {"model.gguf", "version 1", "not supported"});
  b.version = 4;
  expect_error([&] { GgufFile f(write(d, b)); }, {"version 4", "not supported"});
  b.version = 0;
  expect_error([&] { GgufFile f(write(d, b)); }, {"version 0", "not supported"});
  b.version = 0x03000000;  // version 3 written big-endian
  expect_error([&] { GgufFile f(write(d, b)); }, {"big-endian"});
}

TEST(GgufBad, UnknownTensorType) {
  test::TempDir d("gguf");
  GgufBuilder b = small_model();
  b.add_tensor("blk.0.attn_q.weight", 99, {4}, iota_bytes(16));
  expect_error([&] { GgufFile f(write(d, b)); }, {"model.gguf", "tensor 'blk.0.attn_q.weight'", "unknown ggml type 99"});
  GgufBuilder b2 = small_model();
  b2.add_tensor("old", 4, {32}, iota_bytes(20));  // q4_2, long removed from ggml
  expect_error([&] { GgufFile f(write(d, b2)); }, {"tensor 'old'", "unknown ggml type 4"});
}

TEST(GgufBad, TensorDataOutOfRange) {
  test::TempDir d("gguf");
  GgufBuilder b = small_model();
  b.tensors()[1].offset = 1 << 20;
  expect_error([&] { GgufFile f(write(d, b)); },
               {"model.gguf", "tensor 'blk.0.ffn_down.weight'", "run past the end of the file"});
  b.tensors()[1].offset = ~uint64_t(31);  // aligned, and offset + size wraps around
  expect_error([&] { GgufFile f(write(d, b)); }, {"tensor 'blk.0.ffn_down.weight'", "run past the end"});
  // The data sized by the shape, not by what follows: a q8_0 [64, 1] needs two blocks.
  GgufBuilder b2 = small_model();
  b2.tensors()[1].ne = {64, 1};
  expect_error([&] { GgufFile f(write(d, b2)); }, {"tensor 'blk.0.ffn_down.weight'", "run past the end"});
}

TEST(GgufBad, MisalignedOffset) {
  test::TempDir d("gguf");
  GgufBuilder b = small_model();
  b.tensors()[1].offset = 36;
  expect_error([&] { GgufFile f(write(d, b)); },
               {"tensor 'blk.0.ffn_down.weight'", "offset 36", "not a multiple of the alignment 32"});
}

TEST(GgufBad, OverlappingTensors) {
  test::TempDir d("gguf");
  GgufBuilder b = small_model();
  b.tensors()[1].offset = 0;
  expect_error([&] { GgufFile f(write(d, b)); }, {"overlaps tensor"});
}

TEST(GgufBad, BadAlignment) {
  test::TempDir d("gguf");
  for (uint32_t a : {0u, 3u, 48u}) {
    GgufBuilder b = small_model();
    b.add_u32("general.alignment", a);
    expect_error([&] { GgufFile f(write(d, b)); },
                 {"key 'general.alignment'", "alignment " + std::to_string(a) + " is not a power of two"});
  }
  GgufBuilder b = small_model();
  b.add_u64("general.alignment", 32);
  expect_error([&] { GgufFile f(write(d, b)); }, {"key 'general.alignment'", "must be a u32, is u64"});
}

TEST(GgufBad, NestedArray) {
  test::TempDir d("gguf");
  GgufBuilder b = small_model();
  std::vector<uint8_t> body;
  GgufBuilder::put(body, uint32_t(GgufBuilder::Array));
  GgufBuilder::put(body, uint32_t(GgufBuilder::Array));  // elements: arrays
  GgufBuilder::put(body, uint64_t(1));
  GgufBuilder::put(body, uint32_t(GgufBuilder::U8));
  GgufBuilder::put(body, uint64_t(1));
  GgufBuilder::put(body, uint8_t(7));
  b.add_raw("nested", body);
  expect_error([&] { GgufFile f(write(d, b)); }, {"model.gguf", "key 'nested'", "arrays of arrays"});
}

TEST(GgufBad, UnknownValueTypes) {
  test::TempDir d("gguf");
  GgufBuilder b = small_model();
  std::vector<uint8_t> body;
  GgufBuilder::put(body, uint32_t(13));
  GgufBuilder::put(body, uint64_t(0));
  b.add_raw("odd", body);
  expect_error([&] { GgufFile f(write(d, b)); }, {"key 'odd'", "unknown value type 13"});
  GgufBuilder b2 = small_model();
  body.clear();
  GgufBuilder::put(body, uint32_t(GgufBuilder::Array));
  GgufBuilder::put(body, uint32_t(77));
  GgufBuilder::put(body, uint64_t(0));
  b2.add_raw("odd.array", body);
  expect_error([&] { GgufFile f(write(d, b2)); }, {"key 'odd.array'", "unknown value type 77"});
}

TEST(GgufBad, BadScalars) {
  test::TempDir d("gguf");
  GgufBuilder b = small_model();
  std::vector<uint8_t> body;
  GgufBuilder::put(body, uint32_t(GgufBuilder::Bool));
  GgufBuilder::put(body, uint8_t(2));
  b.add_raw("flag", body);
  expect_error([&] { GgufFile f(write(d, b)); }, {"key 'flag'", "bool value 2"});
  GgufBuilder b2 = small_model();
  b2.add_u64("big", uint64_t(INT64_MAX) + 1);
  expect_error([&] { GgufFile f(write(d, b2)); }, {"key 'big'", "above 2^63 - 1"});
  GgufBuilder b3 = small_model();
  b3.add_array<uint64_t>("bigs", GgufBuilder::U64, {1, ~uint64_t(0)});
  expect_error([&] { GgufFile f(write(d, b3)); }, {"key 'bigs'", "above 2^63 - 1"});
}

TEST(GgufBad, HugeCountsAllocateNothing) {
  test::TempDir d("gguf");
  GgufBuilder b = small_model();
  b.tensor_count = uint64_t(1) << 62;
  expect_error([&] { GgufFile f(write(d, b)); }, {"model.gguf", "tensor count 4611686018427387904", "cannot fit"});
  b = small_model();
  b.kv_count = ~uint64_t(0);
  expect_error([&] { GgufFile f(write(d, b)); }, {"metadata count 18446744073709551615", "cannot fit"});
  b = small_model();
  b.tensor_count = 3;  // one more record than there is
  expect_error([&] { GgufFile f(write(d, b)); }, {"model.gguf"});

  // An array, a string and a key whose lengths run past the end of the file.
  for (uint32_t elem : {uint32_t(GgufBuilder::U8), uint32_t(GgufBuilder::String), uint32_t(GgufBuilder::F64)}) {
    GgufBuilder a = small_model();
    std::vector<uint8_t> body;
    GgufBuilder::put(body, uint32_t(GgufBuilder::Array));
    GgufBuilder::put(body, elem);
    GgufBuilder::put(body, uint64_t(1) << 61);
    a.add_raw("tokenizer.ggml.tokens", body);
    expect_error([&] { GgufFile f(write(d, a)); }, {"key 'tokenizer.ggml.tokens'", "array of 2305843009213693952", "runs past the end"});
  }
  GgufBuilder s = small_model();
  std::vector<uint8_t> body;
  GgufBuilder::put(body, uint32_t(GgufBuilder::String));
  GgufBuilder::put(body, uint64_t(1) << 63);
  s.add_raw("general.name", body);
  expect_error([&] { GgufFile f(write(d, s)); }, {"key 'general.name'", "9223372036854775808 bytes", "runs past the end"});
  // A key's own length: the 24-byte header of one entry, then the key's length by hand.
  GgufBuilder k;
  k.kv_count = 1;
  std::vector<uint8_t> file = k.bytes();
  GgufBuilder::put(file, uint64_t(1) << 40);
  file.resize(file.size() + 16, 'x');
  GgufBuilder::write_bytes(d / "key.gguf", file);
  expect_error([&] { GgufFile f(d / "key.gguf"); }, {"metadata entry 0", "the key of 1099511627776 bytes", "runs past the end"});
}

TEST(GgufBad, ArrayLongerThanTheReaderAccepts) {
  // 2^24 + 1 one-byte elements: in the file, but beyond the bound on what metadata may allocate.
  test::TempDir d("gguf");
  GgufBuilder b;
  b.add_array<uint8_t>("big", GgufBuilder::U8, std::vector<uint8_t>((size_t(1) << 24) + 1, 0));
  expect_error([&] { GgufFile f(write(d, b)); }, {"key 'big'", "array of 16777217 elements", "longer than"});
}

TEST(GgufBad, TensorShapes) {
  test::TempDir d("gguf");
  auto with = [&](std::function<void(GgufBuilder::Tensor&)> edit) {
    GgufBuilder b = small_model();
    edit(b.tensors()[1]);
    return write(d, b);
  };
  const std::string t = "tensor 'blk.0.ffn_down.weight'";
  expect_error([&] { GgufFile f(with([](auto& x) { x.ne = {}; })); }, {t, "has 0 dimensions"});
  expect_error([&] { GgufFile f(with([](auto& x) { x.ne = {32, 1, 1, 1, 1}; })); }, {t, "has 5 dimensions"});
  expect_error([&] { GgufFile f(with([](auto& x) { x.ne = {32, -1}; })); }, {t, "ne[1] is -1, negative"});
  expect_error([&] { GgufFile f(with([](auto& x) { x.ne = {32, int64_t(1) << 40, int64_t(1) << 40}; })); },
               {t, "2^63 elements or more"});
  expect_error([&] { GgufFile f(with([](auto& x) { x.ne = {33, 1}; })); },
               {t, "ne[0] = 33 is not a multiple of q8_0's block of 32"});
  // A shape whose element count fits but whose size in bytes does not.
  expect_error([&] { GgufFile f(with([](auto& x) { x.type = 28, x.ne = {int64_t(1) << 31, int64_t(1) << 31}; })); },
               {t, "more bytes than 2^64"});
}

TEST(GgufBad, DuplicatesAndEmptyNames) {
  test::TempDir d("gguf");
  GgufBuilder b = small_model();
  b.add_u32("deepseek2.block_count", 2);
  expect_error([&] { GgufFile f(write(d, b)); }, {"model.gguf", "key 'deepseek2.block_count'", "appears twice"});
  b = small_model();
  b.add_tensor_f32("token_embd.weight", {1}, {1});
  expect_error([&] { GgufFile f(write(d, b)); }, {"tensor 'token_embd.weight'", "appears twice"});
  b = small_model();
  b.add_u8("", 1);
  expect_error([&] { GgufFile f(write(d, b)); }, {"the key is empty"});
  b = small_model();
  b.add_tensor_f32("", {1}, {1});
  expect_error([&] { GgufFile f(write(d, b)); }, {"the name is empty"});
}

// ---- split sets

// Writes PREFIX-0000K-of-0000N.gguf for K = 1..count: part 1 carries the metadata, each part
// one f32 tensor "tK" of 4 values K; edit(no, builder) changes a part before it is written.
void write_split(const std::string& prefix, int count, const std::function<void(int, GgufBuilder&)>& edit = {}) {
  for (int no = 1; no <= count; ++no) {
    GgufBuilder b;
    b.add_split_keys(no, count, count);
    if (no == 1) b.add_string("general.architecture", "deepseek2").add_u32("deepseek2.block_count", 3);
    const float v = float(no);
    b.add_tensor_f32(tensor_name(no), {4}, {v, v, v, v});
    if (edit) edit(no, b);
    b.write(GgufBuilder::split_name(prefix, no, count));
  }
}

TEST(GgufSplit, OpensFromAnyPartAndFromTheFolder) {
  test::TempDir d("gguf");
  const std::string prefix = d / "Kimi-K2-Q4_K_M";
  write_split(prefix, 3);
  const std::vector<std::string> names = {GgufBuilder::split_name(prefix, 1, 3), GgufBuilder::split_name(prefix, 2, 3),
                                          GgufBuilder::split_name(prefix, 3, 3)};
  EXPECT_EQ(gguf_path(d.str()), names[0]);
  for (const std::string& from : {names[0], names[1], names[2], d.str()}) {
    SCOPED_TRACE(from);
    GgufFile f(from);
    EXPECT_EQ(f.path(), names[0]);
    EXPECT_EQ(f.parts(), names);
    EXPECT_EQ(f.get_string("general.architecture"), "deepseek2");
    EXPECT_EQ(f.get_int("split.count"), 3);
    EXPECT_EQ(f.get_int("split.no"), 0);  // the first part's
    ASSERT_EQ(f.tensors().size(), 3u);
    EXPECT_EQ(f.total_bytes(), 48u);
    for (int no = 1; no <= 3; ++no) {
      const GgufTensor* t = f.find_tensor(tensor_name(no));
      ASSERT_TRUE(t);
      EXPECT_EQ(t->file, names[size_t(no - 1)]);
      const uint8_t* map = f.mapping(size_t(no - 1));
      EXPECT_TRUE(t->data >= map && t->data + t->nbytes <= map + f.mapping_size(size_t(no - 1)));
      float v;
      std::memcpy(&v, t->data + 12, 4);
      EXPECT_EQ(v, float(no));
    }
    size_t last = 0;
    f.prefault([&](size_t done, size_t) { last = done; });
    size_t total = 0;
    for (auto& p : names) total += fs::file_size(p);
    EXPECT_EQ(last, total);
  }
}

TEST(GgufSplit, MetadataOnlyFirstPart) {
  // gguf-split --no-tensor-first-split: part 1 holds the metadata and no tensor.
  test::TempDir d("gguf");
  const std::string prefix = d / "m";
  for (int no = 1; no <= 3; ++no) {
    GgufBuilder b;
    b.add_split_keys(no, 3, 2);
    if (no == 1) b.add_string("general.architecture", "deepseek2");
    else b.add_tensor_f32(tensor_name(no), {2}, {1, 2});
    b.write(GgufBuilder::split_name(prefix, no, 3));
  }
  GgufFile f(GgufBuilder::split_name(prefix, 3, 3));
  EXPECT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.get_string("general.architecture"), "deepseek2");
}

TEST(GgufSplit, MissingPart) {
  test::TempDir d("gguf");
  const std::string prefix = d / "m";
  write_split(prefix, 5);
  fs::remove(GgufBuilder::split_name(prefix, 3, 5));
  for (const std::string& from : {GgufBuilder::split_name(prefix, 1, 5), GgufBuilder::split_name(prefix, 5, 5), d.str()})
    expect_error([&] { GgufFile f(from); }, {"m-00003-of-00005.gguf", "part 3 of 5", "is missing"});
  fs::remove(GgufBuilder::split_name(prefix, 1, 5));
  expect_error([&] { GgufFile f(GgufBuilder::split_name(prefix, 2, 5)); }, {"m-00001-of-00005.gguf", "part 1 of 5"});
}

TEST(GgufSplit, PartsMustAgreeWithTheirNames) {
  test::TempDir d("gguf");
  const std::string prefix = d / "m";
  const std::string part2 = GgufBuilder::split_name(prefix, 2, 3);
  auto rewrite_part2 = [&](const std::function<void(GgufBuilder&)>& keys) {
    GgufBuilder b;
    keys(b);
    b.add_tensor_f32("t2", {4}, {2, 2, 2, 2});
    b.write(part2);
  };
  write_split(prefix, 3);
  rewrite_part2([](GgufBuilder& b) { b.add_u16("split.no", 1).add_u16("split.count", 4).add_i32("split.tensors.count", 3); });
  expect_error([&] { GgufFile f(prefix + "-00001-of-00003.gguf"); }, {part2, "split.count is 4", "name says 3"});
  rewrite_part2([](GgufBuilder& b) { b.add_u16("split.no", 0).add_u16("split.count", 3).add_i32("split.tensors.count", 3); });
  expect_error([&] { GgufFile f(part2); }, {part2, "split.no is 0", "name says part 2"});
  rewrite_part2([](GgufBuilder& b) { b.add_u16("split.no", 1).add_u16("split.count", 3).add_i32("split.tensors.count", 4); });
  expect_error([&] { GgufFile f(part2); }, {part2, "split.tensors.count is 4", "first part says 3"});
  rewrite_part2([](GgufBuilder& b) { b.add_u32("general.alignment", 32); });
  expect_error([&] { GgufFile f(part2); }, {part2, "lacks split.no, split.count or split.tensors.count"});
  rewrite_part2([](GgufBuilder& b) { b.add_split_keys(2, 3, 3).add_string("split.count.extra", "x"); });
  EXPECT_NO_THROW(GgufFile f(part2));
}

TEST(GgufSplit, TensorTotalMustMatch) {
  test::TempDir d("gguf");
  const std::string prefix = d / "m";
  write_split(prefix, 3, [](int no, GgufBuilder& b) {
    b = GgufBuilder();
    b.add_split_keys(no, 3, 4);
    b.add_tensor_f32(tensor_name(no), {1}, {1});
  });
  expect_error([&] { GgufFile f(d.str()); }, {"m-00001-of-00003.gguf", "split.tensors.count is 4", "hold 3 tensors"});
}

TEST(GgufSplit, TensorInTwoParts) {
  test::TempDir d("gguf");
  const std::string prefix = d / "m";
  write_split(prefix, 2, [](int, GgufBuilder& b) { b.add_tensor_f32("shared", {1}, {1}); });
  expect_error([&] { GgufFile f(d.str()); },
               {"m-00002-of-00002.gguf", "tensor 'shared'", "appears in two parts", "m-00001-of-00002.gguf"});
}

TEST(GgufSplit, LonePartUnderAnotherName) {
  test::TempDir d("gguf");
  GgufBuilder b = small_model();
  b.add_split_keys(1, 3, 6);
  expect_error([&] { GgufFile f(write(d, b, "renamed.gguf")); }, {"renamed.gguf", "split set of 3", "cannot be found"});
  // A set of one is a plain file.
  GgufBuilder one = small_model();
  one.add_split_keys(1, 1, 2);
  EXPECT_NO_THROW(GgufFile f(write(d, one, "single.gguf")));
  EXPECT_NO_THROW(GgufFile f(write(d, one, "single-00001-of-00001.gguf")));
}

// ---- folders and gguf_path

TEST(GgufFolder, OneModelBesideItsProjector) {
  test::TempDir d("gguf");
  write(d, small_model(), "Model-Q4_K_M.gguf");
  write(d, small_model(), "mmproj-Model-F16.gguf");
  EXPECT_EQ(gguf_path(d.str()), d / "Model-Q4_K_M.gguf");
  GgufFile f(d.str());
  EXPECT_EQ(f.path(), d / "Model-Q4_K_M.gguf");
}

TEST(GgufFolder, SeveralModelsAreAnError) {
  test::TempDir d("gguf");
  write(d, small_model(), "a-Q8_0.gguf");
  write(d, small_model(), "a-Q4_K_M.gguf");
  write_split(d / "big", 2);
  write(d, small_model(), "mmproj-a.gguf");
  expect_error([&] { GgufFile f(d.str()); },
               {d.str(), "holds 3 GGUF models", "a-Q8_0.gguf", "a-Q4_K_M.gguf", "big-*-of-00002.gguf (2 parts)"});
  EXPECT_EQ(gguf_path(d.str()), d.str());  // so that opening it says why
}

TEST(GgufFolder, OnlyAProjector) {
  test::TempDir d("gguf");
  write(d, small_model(), "mmproj-a.gguf");
  expect_error([&] { GgufFile f(d.str()); }, {d.str(), "only multimodal projector"});
  EXPECT_EQ(gguf_path(d.str()), d.str());
}

TEST(GgufFolder, GgufPath) {
  test::TempDir d("gguf");
  EXPECT_EQ(gguf_path("/nowhere/model.gguf"), "/nowhere/model.gguf");  // opening reports it
  EXPECT_EQ(gguf_path(d.str()), std::nullopt);                        // empty folder
  EXPECT_EQ(gguf_path(d / "model.safetensors"), std::nullopt);
  EXPECT_EQ(gguf_path(d / "absent"), std::nullopt);
  write(d, small_model(), "model.gguf");
  EXPECT_EQ(gguf_path(d.str()), d / "model.gguf");
  GgufBuilder::write_bytes(d / "config.json", {'{', '}'});
  EXPECT_EQ(gguf_path(d.str()), std::nullopt);  // a hub checkpoint folder
}

}  // namespace
}  // namespace mla
