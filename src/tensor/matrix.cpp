#include "tensor/matrix.h"

#include <stdexcept>
#include <string>

#include "tensor/ggml_blocks.h"

namespace mla {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32: return "f32";
    case WeightFormat::BF16: return "bf16";
    case WeightFormat::F16: return "f16";
    case WeightFormat::FP8_BLOCK128: return "fp8-block128";
    case WeightFormat::INT4_GROUP: return "int4-group";
    case WeightFormat::INT8_GROUP: return "int8-group";
    case WeightFormat::BF16_PAIRS32: return "bf16-pairs32";
    case WeightFormat::INT4_WORDS16: return "int4-words16";
    case WeightFormat::INT8_WORDS16: return "int8-words16";
    case WeightFormat::Q4_0: return "q4_0";
    case WeightFormat::Q4_1: return "q4_1";
    case WeightFormat::Q5_0: return "q5_0";
    case WeightFormat::Q5_1: return "q5_1";
    case WeightFormat::Q8_0: return "q8_0";
    case WeightFormat::Q2_K: return "q2_k";
    case WeightFormat::Q3_K: return "q3_k";
    case WeightFormat::Q4_K: return "q4_k";
    case WeightFormat::Q5_K: return "q5_k";
    case WeightFormat::Q6_K: return "q6_k";
  }
  return "?";
}

size_t MatrixView::row_bytes() const {
  switch (format) {
    case WeightFormat::F32: return size_t(cols) * 4;
    case WeightFormat::BF16: case WeightFormat::F16: case WeightFormat::BF16_PAIRS32: return size_t(cols) * 2;
    case WeightFormat::FP8_BLOCK128: case WeightFormat::INT8_GROUP: case WeightFormat::INT8_WORDS16:
      return size_t(cols);
    case WeightFormat::INT4_GROUP: case WeightFormat::INT4_WORDS16: return size_t(cols) / 2;
    default: break;
  }
  const GgmlBlock b = ggml_block(format);
  return b.values ? size_t(cols / b.values) * b.bytes : 0;
}

size_t MatrixView::scale_bytes() const {
  switch (format) {
    case WeightFormat::FP8_BLOCK128: return size_t((rows + 127) / 128) * size_t(scale_cols) * 4;
    case WeightFormat::INT4_GROUP: case WeightFormat::INT8_GROUP: case WeightFormat::INT4_WORDS16:
    case WeightFormat::INT8_WORDS16:
      return size_t(rows) * size_t(scale_cols) * 2;
    default: return 0;
  }
}

void MatrixView::dequant_row(int64_t r, float* out) const {
  const uint8_t* p = static_cast<const uint8_t*>(data) + size_t(r) * row_bytes();
  if (is_ggml_block(format)) {
    ggml_dequantize(format, p, cols, out);
    return;
  }
  switch (format) {
    case WeightFormat::F32: {
      const float* s = reinterpret_cast<const float*>(p);
      for (int64_t k = 0; k < cols; ++k) out[k] = s[k];
      break;
    }
    case WeightFormat::BF16: {
      const uint16_t* s = reinterpret_cast<const uint16_t*>(p);
      for (int64_t k = 0; k < cols; ++k) out[k] = bf16_to_f32(s[k]);
      break;
    }
    case WeightFormat::F16: {
      const uint16_t* s = reinterpret_cast<const uint16_t*>(p);
      for (int64_t k = 0; k < cols; ++k) out[k] = f16_to_f32(s[k]);
      break;
    }
    case WeightFormat::FP8_BLOCK128: {
      const float* sc = static_cast<const float*>(scales) + ((row0 + r) / 128) * scale_cols;
      for (int64_t k = 0; k < cols; ++k) out[k] = fp8e4m3_to_f32(p[k]) * sc[k / 128];
      break;
    }
    case WeightFormat::INT4_GROUP: {
      const uint32_t* w = reinterpret_cast<const uint32_t*>(p);
      const uint16_t* sc = static_cast<const uint16_t*>(scales) + (row0 + r) * scale_cols;
      for (int64_t k = 0; k < cols; ++k) {
        int q = int((w[k / 8] >> (4 * (k % 8))) & 0xF) - 8;
        out[k] = float(q) * bf16_to_f32(sc[k / group_size]);
      }
      break;
    }
    case WeightFormat::INT8_GROUP: {
      const int8_t* q = reinterpret_cast<const int8_t*>(p);
      const uint16_t* sc = static_cast<const uint16_t*>(scales) + (row0 + r) * scale_cols;
      for (int64_t k = 0; k < cols; ++k) out[k] = float(q[k]) * bf16_to_f32(sc[k / group_size]);
      break;
    }
    case WeightFormat::BF16_PAIRS32: {
      const uint16_t* w = static_cast<const uint16_t*>(data);
      for (int64_t k = 0; k < cols; ++k) out[k] = bf16_to_f32(w[pairs32_word(r, k, cols)]);
      break;
    }
    case WeightFormat::INT4_WORDS16: {
      const uint32_t* w = static_cast<const uint32_t*>(data);
      const uint16_t* sc = static_cast<const uint16_t*>(scales);
      for (int64_t k = 0; k < cols; ++k) {
        const int q = int((w[words16_word(r, k, cols)] >> (4 * (k % 8))) & 0xF) - 8;
        out[k] = float(q) * bf16_to_f32(sc[words16_scale(row0 + r, k / group_size, scale_cols)]);
      }
      break;
    }
    case WeightFormat::INT8_WORDS16: {
      const uint8_t* b = static_cast<const uint8_t*>(data);
      const uint16_t* sc = static_cast<const uint16_t*>(scales);
      for (int64_t k = 0; k < cols; ++k) {
        const int q = int(b[4 * int8_words16_word(r, k, cols) + k % 4]) - 128;
        out[k] = float(q) * bf16_to_f32(sc[words16_scale(row0 + r, k / group_size, scale_cols)]);
      }
      break;
    }
    default: break;
  }
}

MatrixView MatrixView::slice_rows(int64_t first, int64_t count) const {
  if (first < 0 || count < 0 || first + count > rows) throw std::out_of_range("MatrixView::slice_rows");
  if (format == WeightFormat::BF16_PAIRS32 && (first % 32 != 0 || count % 32 != 0))
    throw std::out_of_range("MatrixView::slice_rows: bf16-pairs32 rows come in blocks of 32");
  if (is_words16(format) && (first % 16 != 0 || count % 16 != 0))
    throw std::out_of_range(std::string("MatrixView::slice_rows: ") + weight_format_name(format) +
                            " rows come in blocks of 16");
  MatrixView v = *this;
  v.data = static_cast<const uint8_t*>(data) + size_t(first) * row_bytes();
  v.rows = count;
  v.row0 = row0 + first;
  return v;
}

std::optional<MatrixView> concat_rows(const MatrixView& a, const MatrixView& b) {
  const bool plain = a.format == WeightFormat::F32 || a.format == WeightFormat::BF16 || a.format == WeightFormat::F16 ||
                     is_ggml_block(a.format) || (a.format == WeightFormat::BF16_PAIRS32 && a.rows % 32 == 0);
  if (!plain || b.format != a.format || b.cols != a.cols || !a.data ||
      b.data != static_cast<const uint8_t*>(a.data) + a.bytes())
    return std::nullopt;
  MatrixView v = a;
  v.rows = a.rows + b.rows;
  return v;
}

}  // namespace mla
