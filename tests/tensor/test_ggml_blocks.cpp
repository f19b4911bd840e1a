// The reference dequantizers of llama.cpp's block formats (tensor/ggml_blocks.h) against
// llama.cpp's own numpy reference: tests/fixtures/ggml_blocks/<format>.bin holds random blocks
// and the floats gguf-py's gguf.quants.dequantize makes of them (make_vectors.py there), which
// ggml_dequantize must reproduce bit for bit.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tensor/ggml_blocks.h"
#include "test_util.h"

namespace {

using mla::WeightFormat;

struct Vectors {
  uint32_t blocks = 0, block_bytes = 0, block_values = 0;
  std::vector<uint8_t> data;  // the blocks
  std::vector<float> expect;  // gguf-py's dequantized values
};

Vectors read_vectors(const std::string& name) {
  const std::string path = (mla::test::source_dir() / "tests/fixtures/ggml_blocks" / (name + ".bin")).string();
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Vectors v;
  if (bytes.size() < 20 || std::memcmp(bytes.data(), "GGMLVEC1", 8) != 0) {
    ADD_FAILURE() << path << ": missing or not a test vector file";
    return v;
  }
  std::memcpy(&v.blocks, &bytes[8], 4);
  std::memcpy(&v.block_bytes, &bytes[12], 4);
  std::memcpy(&v.block_values, &bytes[16], 4);
  const size_t nb = size_t(v.blocks) * v.block_bytes, nv = size_t(v.blocks) * v.block_values;
  if (bytes.size() != 20 + nb + 4 * nv) {
    ADD_FAILURE() << path << ": " << bytes.size() << " bytes, expected " << 20 + nb + 4 * nv;
    return v;
  }
  v.data.assign(bytes.begin() + 20, bytes.begin() + 20 + std::ptrdiff_t(nb));
  v.expect.resize(nv);
  std::memcpy(v.expect.data(), &bytes[20 + nb], 4 * nv);
  return v;
}

TEST(GgmlBlocks, DequantizeEqualsGgufPyBitForBit) {
  const WeightFormat formats[] = {WeightFormat::Q4_0, WeightFormat::Q4_1, WeightFormat::Q5_0, WeightFormat::Q5_1,
                                  WeightFormat::Q8_0, WeightFormat::Q2_K, WeightFormat::Q3_K, WeightFormat::Q4_K,
                                  WeightFormat::Q5_K, WeightFormat::Q6_K};
  for (WeightFormat f : formats) {
    const std::string name = mla::weight_format_name(f);
    const Vectors v = read_vectors(name);
    if (v.blocks == 0) continue;
    const mla::GgmlBlock b = mla::ggml_block(f);
    ASSERT_EQ(v.block_bytes, b.bytes) << name;
    ASSERT_EQ(int64_t(v.block_values), b.values) << name;
    std::vector<float> got(v.expect.size());
    mla::ggml_dequantize(f, v.data.data(), int64_t(got.size()), got.data());
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (std::memcmp(&got[i], &v.expect[i], 4) != 0 && bad++ < 8)
        ADD_FAILURE() << name << " block " << i / v.block_values << " value " << i % v.block_values << ": " << got[i]
                      << " vs gguf-py " << v.expect[i];
    EXPECT_EQ(bad, 0) << name << ": values differing from gguf-py";
  }
}

}  // namespace
