// The one safetensors writer (format/safetensors.h): tensors produced by callbacks in the order
// given, or held in memory in name order, read back through the validating reader.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "format/error.h"
#include "format/safetensors.h"
#include "test_util.h"

namespace mla {
namespace {

TEST(SafetensorsWriter, StreamsTensorsInTheOrderGiven) {
  test::TempDir dir("st_writer");
  const std::string path = dir / "t.safetensors";
  TensorSpec b{"b", DType::F32, {2, 3}, [](uint8_t* out) {
                 for (int i = 0; i < 6; ++i) {
                   const float v = float(i);
                   std::memcpy(out + 4 * i, &v, 4);
                 }
               }};
  TensorSpec a{"a", DType::BF16, {5}, [](uint8_t* out) { std::memset(out, 0x3f, 10); }};
  write_safetensors(path, std::vector<const TensorSpec*>{&b, &a}, {{"format", "pt"}});
  SafetensorsFile f(path);
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const TensorInfo* tb = f.find("b");
  const TensorInfo* ta = f.find("a");
  ASSERT_TRUE(tb && ta);
  EXPECT_LT(tb->data, ta->data);  // data in the order given, not the header's (sorted) order
  EXPECT_EQ(test::read_f32(*tb), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(ta->nbytes, 10u);
  EXPECT_EQ(ta->data[9], 0x3f);
  // The header is padded to 8 bytes.
  std::ifstream in(path, std::ios::binary);
  uint64_t header = 0;
  in.read(reinterpret_cast<char*>(&header), 8);
  EXPECT_EQ(header % 8, 0u);
}

TEST(SafetensorsWriter, InMemoryTensorsAndTheirSizes) {
  test::TempDir dir("st_writer_mem");
  const std::string path = dir / "m.safetensors";
  const float v[3] = {1.5f, -2, 4};
  write_safetensors(path, {{"z", tensor_f32({3}, v)}, {"y", tensor_f32({1}, v)}});
  SafetensorsFile f(path);
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_EQ(test::read_f32(*f.find("z")), (std::vector<float>{1.5f, -2, 4}));
  EXPECT_LT(f.find("y")->data, f.find("z")->data);  // name order
  TensorData wrong{DType::F32, {4}, std::vector<uint8_t>(12)};
  EXPECT_THROW(write_safetensors(path, {{"w", wrong}}), FormatError);
  EXPECT_THROW(write_safetensors(dir / "no/such/dir/x.safetensors", {{"z", tensor_f32({3}, v)}}), FormatError);
}

}  // namespace
}  // namespace mla
