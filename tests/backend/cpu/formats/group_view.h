// A MatrixView over caller-owned storage of a group-quantized matrix (the tests that pack codes
// by hand or through the quantizer and read them back through the loader's view).
#pragma once
#include <cstdint>

#include "tensor/matrix.h"

namespace mla::test {

// rows x cols codes at `data` (INT4_GROUP: 8 per uint32 word) and one bf16 scale per `group`
// values of a row at `scales`.
inline MatrixView group_view(WeightFormat format, const void* data, const void* scales, int64_t rows, int64_t cols,
                             int64_t group) {
  return {.format = format,
          .rows = rows,
          .cols = cols,
          .data = data,
          .scales = scales,
          .scale_cols = cols / group,
          .group_size = group};
}

}  // namespace mla::test
