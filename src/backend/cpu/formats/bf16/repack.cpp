// BF16 weights rewritten at load as BF16_PAIRS32 (see repack.h).
#include "backend/cpu/repack.h"

// GCC 12's AVX-512 headers build results on _mm512_undefined_*(), which -Wuninitialized reports
// at every inlined use (GCC bug 105593): a false positive, as in fma_gemm.cpp.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/common/transpose_avx512.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/parallel.h"

namespace mla::cpu {

bool reads_pairs32(const Context& ctx) { return ctx.repack_weights && ctx.fast() && !features(ctx).amx; }

bool pairs32_eligible(const MatrixView& W) {
  return W.format == WeightFormat::BF16 && W.data != nullptr && W.rows % 32 == 0 && W.cols % 32 == 0;
}

void repack_pairs32(const Context& ctx, MatrixView& W) {
  if (!pairs32_eligible(W))
    throw std::invalid_argument(std::string("repack_pairs32: ") + weight_format_name(W.format) + " " +
                                std::to_string(W.rows) + "x" + std::to_string(W.cols) +
                                " is not bf16 with rows and columns multiples of 32");
  const int64_t K = W.cols, block_words = 16 * K;  // a block: 32 rows of K bf16, K / 2 x 32 dwords
  uint16_t* base = static_cast<uint16_t*>(const_cast<void*>(W.data));
  parallel_for(ctx, W.rows / 32, true, [&](int64_t b) {
    thread_local std::vector<uint32_t> buf;
    if (buf.size() < size_t(block_words + 16)) buf.resize(size_t(block_words + 16));
    uint32_t* packed = reinterpret_cast<uint32_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63));
    uint16_t* block = base + b * 32 * K;
    pack_column_pairs32(block, K, K, packed);
    std::memcpy(block, packed, size_t(block_words) * 4);
  });
  W.format = WeightFormat::BF16_PAIRS32;
}

}  // namespace mla::cpu
