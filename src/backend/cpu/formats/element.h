// Reading a stored weight matrix by hand, for the formats' scalar references (decode.h:
// <format>_element, registry.h's FormatKernels::element) and their row decoders. Internal to
// src/backend/cpu.
#pragma once
#include <cstdint>
#include <cstring>

#include "tensor/matrix.h"

namespace mla::cpu::avx512 {

// Row n of W's stored bytes (the row-major formats).
inline const uint8_t* row_bytes_of(const MatrixView& W, int64_t n) {
  return static_cast<const uint8_t*>(W.data) + size_t(n) * W.row_bytes();
}

// Item i of row r of a row-major W read as a T (a value of F32 / BF16 / F16 / FP8 / INT8, a word
// of INT4).
template <class T>
inline T stored(const MatrixView& W, int64_t r, int64_t i) {
  T v;
  std::memcpy(&v, row_bytes_of(W, r) + sizeof(T) * size_t(i), sizeof(T));
  return v;
}

}  // namespace mla::cpu::avx512
