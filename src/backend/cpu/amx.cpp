// bf16 GEMM on AMX tiles (see amx.h). Tiles 0-3 accumulate C^T blocks (16 weight rows x 16
// tokens, float32), tiles 4-5 hold two blocks of 16 weight rows x 32 columns (A), tiles 6-7 two
// blocks of 16 column pairs x 16 tokens (B, VNNI). TDPBF16PS: C[r][t] += sum over the 16 pairs
// p of A[r][2p] B[p][2t] + A[r][2p+1] B[p][2t+1], i.e. W[r, k] x[t, k] over 32 columns k.
#include "backend/cpu/amx.h"

#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/gemm.h"

namespace mla::cpu {

namespace {

constexpr int64_t kBlock = 16;       // rows or tokens per tile
constexpr int64_t kStep = 32;        // columns per tile step
constexpr int64_t kTileValues = 512;  // bf16 values in one packed B tile (16 x 32)
constexpr int64_t kChunkBlocks = 8;   // token blocks per pass over the weights

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

bool request_amx() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool tile = d & (1u << 24), bf16 = d & (1u << 22);
  if (!tile || !bf16) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// C blocks for two 16-row weight blocks (a0, a1: packed tiles, 2 per step) against one or two
// 16-token blocks of packed activations (b0, b1), over Kc steps; c: [4][16][16] float32.
template <bool kTwoTokenBlocks>
__attribute__((target("amx-tile,amx-bf16"))) void tiles(const uint16_t* a0, const uint16_t* a1, const uint16_t* b0,
                                                          const uint16_t* b1, int64_t Kc, float* c) {
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (kTwoTokenBlocks) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t s = 0; s < Kc; ++s) {
    _tile_loadd(4, a0 + s * 2 * kTileValues, 64);
    _tile_loadd(5, a1 + s * 2 * kTileValues, 64);
    _tile_loadd(6, b0 + s * kTileValues, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 5, 6);
    if constexpr (kTwoTokenBlocks) {
      _tile_loadd(7, b1 + s * kTileValues, 64);
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, 64);
  _tile_stored(1, c + 256, 64);
  if constexpr (kTwoTokenBlocks) {
    _tile_stored(2, c + 512, 64);
    _tile_stored(3, c + 768, 64);
  }
}

__attribute__((target("amx-tile"))) void tiles_begin() {
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) {
    cfg.rows[i] = kBlock;
    cfg.colsb[i] = 64;
  }
  _tile_loadconfig(&cfg);
}

__attribute__((target("amx-tile"))) void tiles_end() { _tile_release(); }

}  // namespace

bool amx_available() {
  static const bool ok = request_amx();
  return ok;
}

int64_t amx_packed_size(int64_t M, int64_t K) { return (M + kBlock - 1) / kBlock * kBlock * K; }

void amx_pack_activations(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, uint16_t* out) {
  const int64_t Mb = (M + kBlock - 1) / kBlock, Kc = K / kStep;
  uint32_t* o = reinterpret_cast<uint32_t*>(out);
  for (int64_t tb = 0; tb < Mb; ++tb)
    for (int64_t m = 0; m < kBlock; ++m) {
      const int64_t t = tb * kBlock + m;
      for (int64_t s = 0; s < Kc; ++s) {
        uint32_t* tile = o + (tb * Kc + s) * (kTileValues / 2);
        if (t < M) {
          uint32_t pairs[16];
          std::memcpy(pairs, x + t * ldx + s * kStep, sizeof pairs);
          for (int p = 0; p < 16; ++p) tile[p * kBlock + m] = pairs[p];
        } else {
          for (int p = 0; p < 16; ++p) tile[p * kBlock + m] = 0;
        }
      }
    }
}

void amx_gemm(const uint16_t* xp, int64_t M, const MatrixView& W, float* y, int64_t ldy) {
  const int64_t N = W.rows, K = W.cols, Kc = K / kStep, Mb = (M + kBlock - 1) / kBlock;
  const int64_t units = (N + 2 * kBlock - 1) / (2 * kBlock);
#pragma omp parallel
  {
    tiles_begin();
    thread_local std::vector<uint16_t> rows;  // 32 weight rows as bf16, when not read in place
    thread_local std::vector<uint16_t> packed;  // the same, in tile order
    alignas(64) float c[4 * kBlock * kBlock];
    // Tokens in chunks of kChunkBlocks blocks (their packed activations stay in L2 while every
    // weight block passes; the weights come round again from L3 for the next chunk).
    for (int64_t cb = 0; cb < Mb; cb += kChunkBlocks) {
    const int64_t cb1 = std::min(Mb, cb + kChunkBlocks);
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < units; ++u) {
      const int64_t n0 = u * 2 * kBlock, nn = std::min(2 * kBlock, N - n0);
      const uint16_t* src;
      if (W.format == WeightFormat::BF16) {
        src = static_cast<const uint16_t*>(W.data) + n0 * K;
      } else {
        if (rows.size() < size_t(2 * kBlock * K)) rows.resize(size_t(2 * kBlock * K));
        dequant_rows_bf16(W, n0, n0 + nn, rows.data(), K);
        src = rows.data();
      }
      // Tile order: step s, block b (rows 16b..16b+15), 16 rows of 32 values, 1 KiB per tile,
      // so a tile load reads 1 KiB in a row (rows of the weights lie K * 2 bytes apart, which
      // maps a tile's 16 lines onto one L1 set). Rows past N are zero.
      if (packed.size() < size_t(2 * kBlock * K)) packed.resize(size_t(2 * kBlock * K));
      for (int64_t r = 0; r < 2 * kBlock; ++r) {
        uint16_t* dst = packed.data() + (r / kBlock) * kTileValues + (r % kBlock) * kStep;
        if (r < nn) {
          const uint16_t* row = src + r * K;
          for (int64_t st = 0; st < Kc; ++st)
            _mm512_storeu_si512(dst + st * 2 * kTileValues, _mm512_loadu_si512(row + st * kStep));
        } else {
          for (int64_t st = 0; st < Kc; ++st) _mm512_storeu_si512(dst + st * 2 * kTileValues, _mm512_setzero_si512());
        }
      }
      const uint16_t* a = packed.data();
      for (int64_t tb = cb; tb < cb1; tb += 2) {
        const bool two = tb + 1 < cb1;
        const uint16_t* b0 = xp + tb * Kc * kTileValues;
        if (two) tiles<true>(a, a + kTileValues, b0, b0 + Kc * kTileValues, Kc, c);
        else tiles<false>(a, a + kTileValues, b0, nullptr, Kc, c);
        // c[j][r][m]: j = (token block - tb) * 2 + weight block.
        for (int j = 0; j < (two ? 4 : 2); ++j) {
          const int64_t rb = n0 + (j & 1) * kBlock, t0 = (tb + (j >> 1)) * kBlock;
          const int64_t nr = std::min(kBlock, N - rb), nt = std::min(kBlock, M - t0);
          for (int64_t m = 0; m < nt; ++m)
            for (int64_t r = 0; r < nr; ++r) y[(t0 + m) * ldy + rb + r] = c[(j * kBlock + r) * kBlock + m];
        }
      }
    }
    }
    tiles_end();
  }
}

}  // namespace mla::cpu
