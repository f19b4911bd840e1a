// INT4 and INT8 group weights rewritten at load as INT4_WORDS16 and INT8_WORDS16 (see repack.h).
#include "backend/cpu/repack.h"

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/parallel.h"

namespace mla::cpu {

bool reads_words16(const Context& ctx) {
  return ctx.repack_weights && ctx.fast() && ctx.int8_activations && !features(ctx).amx;
}

bool words16_eligible(const MatrixView& W) {
  return (W.format == WeightFormat::INT4_GROUP || W.format == WeightFormat::INT8_GROUP) && W.data != nullptr && W.scales != nullptr && W.rows % 16 == 0 &&
         W.row0 % 16 == 0 && W.cols % 32 == 0 && W.group_size > 0 && W.group_size % 32 == 0;
}

void repack_words16(const Context& ctx, MatrixView& W) {
  if (!words16_eligible(W))
    throw std::invalid_argument(std::string("repack_words16: ") + weight_format_name(W.format) + " " +
                                std::to_string(W.rows) + "x" + std::to_string(W.cols) + " (first row " +
                                std::to_string(W.row0) + ", groups of " + std::to_string(W.group_size) +
                                ") is not INT4 or INT8 groups of 32k columns in blocks of 16 rows");
  const bool int8 = W.format == WeightFormat::INT8_GROUP;
  // Words (8 INT4 or 4 INT8 codes) and groups of a row; INT8 codes go in biased (q + 128).
  const int64_t words = W.cols / (int8 ? 4 : 8), G = W.scale_cols;
  const uint32_t bias = int8 ? 0x80808080u : 0;
  uint32_t* data = static_cast<uint32_t*>(const_cast<void*>(W.data));
  uint16_t* scales = static_cast<uint16_t*>(const_cast<void*>(W.scales)) + W.row0 * G;
  parallel_for(ctx, W.rows / 16, true, [&](int64_t b) {
    thread_local std::vector<uint32_t> buf;
    thread_local std::vector<uint16_t> sbuf;
    buf.resize(size_t(16 * words));
    sbuf.resize(size_t(16 * G));
    uint32_t* block = data + b * 16 * words;
    for (int64_t r = 0; r < 16; ++r)
      for (int64_t d = 0; d < words; ++d) buf[size_t(d * 16 + r)] = block[r * words + d] ^ bias;
    std::memcpy(block, buf.data(), buf.size() * 4);
    uint16_t* s = scales + b * 16 * G;
    for (int64_t r = 0; r < 16; ++r)
      for (int64_t g = 0; g < G; ++g) sbuf[size_t(g * 16 + r)] = s[r * G + g];
    std::memcpy(s, sbuf.data(), sbuf.size() * 2);
  });
  W.format = int8 ? WeightFormat::INT8_WORDS16 : WeightFormat::INT4_WORDS16;
}

}  // namespace mla::cpu
