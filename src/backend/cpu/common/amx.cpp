// bf16 GEMM on AMX tiles (see amx.h). One call covers 32 weight rows (two row blocks of 16)
// against the tokens in groups of up to 3 blocks of 16. Tiles 0-2 accumulate row block 0 against
// token blocks 0-2, tiles 3-5 row block 1; tile 6 holds a weight tile (16 rows x 32 columns),
// tile 7 a token tile (16 column pairs x 16 tokens). TDPBF16PS: C[r][t] += sum over the 16 pairs
// p of A[r][2p] B[p][2t] + A[r][2p+1] B[p][2t+1], i.e. W[r, k] x[t, k] over 32 columns k.
//
// On the Xeon this was tuned on, a tile load took about 15 ns and a TDPBF16PS 5 ns (a loop of
// each alone), so the order of a step is chosen to load as few tiles as possible per product:
// weights of row block 0, each token tile in turn (3 products), weights of row block 1, then the
// token tiles in reverse, the last one still loaded: 7 loads for 6 products.
#include "backend/cpu/common/amx.h"

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on _mm512_undefined_ps() (GCC bug 105593,
// as in common/avx512.h): a false positive, silenced for this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <initializer_list>

#include "backend/cpu/common/avx512.h"
#include "backend/cpu/formats/fp8_block128/decode.h"
#include "backend/cpu/common/vec_math.h"

namespace mla::cpu {

namespace {

constexpr int64_t kBlock = 16;           // rows or tokens per tile
constexpr int64_t kStep = 32;            // columns per tile step
constexpr int64_t kTileValues = 512;     // bf16 values in one token tile (16 pairs x 16 tokens x 2)
// Weight columns are fetched this many steps ahead, one line per row. Measured on 256 experts of
// 2816 x 2048 read cold from DRAM, 48 tokens each, 2 threads: 2-4 steps ahead 14.4-15.1 GB/s,
// 8 steps 12.4-13.5, 12-16 steps 11.6-12.3; prefetching the next 32 rows in address order instead
// (or as well) 10.6-11.4.
constexpr int64_t kPrefetchSteps = 4;

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

// 32 weight rows (w, ldw values apart) against NT token blocks of xp (bs values apart), Kc steps.
// c: 6 tiles of 16 x 16 float32, tile rb * 3 + j for row block rb and token block j.
template <int NT>
__attribute__((target("amx-tile,amx-bf16"))) void tiles(const uint16_t* w, int64_t ldw, const uint16_t* xp,
                                                          int64_t bs, int64_t Kc, bool prefetch, float* c) {
  _tile_zero(0);
  _tile_zero(3);
  if constexpr (NT > 1) {
    _tile_zero(1);
    _tile_zero(4);
  }
  if constexpr (NT > 2) {
    _tile_zero(2);
    _tile_zero(5);
  }
  const uint16_t* w1 = w + kBlock * ldw;
  const int64_t stride = ldw * 2;
  for (int64_t s = 0; s < Kc; ++s) {
    if (prefetch && s + kPrefetchSteps < Kc)
      for (int64_t r = 0; r < 2 * kBlock; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(w + r * ldw + (s + kPrefetchSteps) * kStep), _MM_HINT_T1);
    const uint16_t* x = xp + s * kTileValues;
    _tile_loadd(6, w + s * kStep, stride);
    _tile_loadd(7, x, 64);
    _tile_dpbf16ps(0, 6, 7);
    if constexpr (NT > 1) {
      _tile_loadd(7, x + bs, 64);
      _tile_dpbf16ps(1, 6, 7);
    }
    if constexpr (NT > 2) {
      _tile_loadd(7, x + 2 * bs, 64);
      _tile_dpbf16ps(2, 6, 7);
    }
    _tile_loadd(6, w1 + s * kStep, stride);
    if constexpr (NT > 2) {
      _tile_dpbf16ps(5, 6, 7);
      _tile_loadd(7, x + bs, 64);
    }
    if constexpr (NT > 1) {
      _tile_dpbf16ps(4, 6, 7);
      _tile_loadd(7, x, 64);
    }
    _tile_dpbf16ps(3, 6, 7);
  }
  _tile_stored(0, c, 64);
  _tile_stored(3, c + 3 * 256, 64);
  if constexpr (NT > 1) {
    _tile_stored(1, c + 256, 64);
    _tile_stored(4, c + 4 * 256, 64);
  }
  if constexpr (NT > 2) {
    _tile_stored(2, c + 2 * 256, 64);
    _tile_stored(5, c + 5 * 256, 64);
  }
}

// GCC 12 does not see _tile_loadconfig read its operand and drops the stores that fill it in;
// the empty asm reading the whole configuration keeps them. _tile_loadd is no better (an asm
// without a memory operand): loads of memory written just before go after a compiler barrier.
inline void barrier() { asm volatile("" : : : "memory"); }
__attribute__((target("amx-tile"))) void load_config(const TileConfig& cfg) {
  asm volatile("" : : "m"(cfg));
  _tile_loadconfig(&cfg);
}

// Loaded at every call: the tile configuration does not survive everything a thread may run
// in between (the dynamic linker's lazy binding saves and restores extended state).
void load_tile_config() {
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) {
    cfg.rows[i] = kBlock;
    cfg.colsb[i] = 64;
  }
  load_config(cfg);
}

__attribute__((target("amx-tile"))) void release_tiles() { _tile_release(); }

// ---- GEMV tiles: C = tiles 0 and 5 (16 rows x T floats), A = tiles 1, 2 (16 rows x 32 bf16),
// B = tiles 3, 4 (16 pairs x T tokens) ----

// The products of the FP8 codes of exponent field 0 among row r's 64 bytes of step s (mask),
// which TDPBF16PS reads as zero: fix[t] += code / 512 * scale * x, x the step's B tiles.
[[gnu::noinline, gnu::cold]] void fp8_subnormals(const uint8_t* bytes, uint64_t mask, const uint16_t* xb, int64_t T,
                                                 float scale, float* fix) {
  avx512::BfDecFP8::subnormals(bytes, mask, scale, [&](int w, float v) {
    const uint16_t* xs = xb + (w >> 1) * 2 * T + (w & 1);
    for (int64_t t = 0; t < T; ++t) fix[t] += v * bf16_to_f32(xs[2 * t]);
  });
}

// Row buffers of the A tiles, 16 rows x 64 bytes each (rows a short tile leaves stale only feed
// rows of C that are not read), and the C tiles of two scale blocks.
struct alignas(64) GemvBuffers {
  uint16_t a0[16 * 32] = {}, a1[16 * 32] = {};
  float c[2][kBlock * kBlock] = {};
};

}  // namespace

void amx_gemv_begin(int64_t T) {
  TileConfig cfg;
  for (int i = 0; i < 6; ++i) cfg.rows[i] = kBlock;
  cfg.colsb[0] = cfg.colsb[3] = cfg.colsb[4] = cfg.colsb[5] = uint16_t(4 * T);
  cfg.colsb[1] = cfg.colsb[2] = 64;
  load_config(cfg);
}

void amx_gemv_end() { release_tiles(); }

__attribute__((target("amx-tile,amx-bf16"))) void amx_gemv_fp8_rows16(const uint8_t* w, int64_t row_bytes,
                                                                        int64_t nr, int64_t S, int64_t T,
                                                                        const uint16_t* xb, const float* scales,
                                                                        int64_t prefetch, float* c, float* fix) {
  thread_local GemvBuffers buf;
  const int64_t ldb = 4 * T, step_values = 64 * T;
  // Each block of 128 columns (2 steps) sums in a C tile of its own (0 and 5 in turn), added to
  // acc times the block's scale after the next block's products are issued. acc holds the
  // 16 x T floats of C in order (one scale for the whole tile: any grouping of them will do).
  __m512 acc[kBlock];
  for (int64_t v = 0; v < T; ++v) acc[v] = _mm512_setzero_ps();
  auto add = [&](int64_t blk) {
    const __m512 sc = _mm512_set1_ps(scales[blk]);
    const float* cb = buf.c[blk & 1];
    for (int64_t v = 0; v < T; ++v) acc[v] = _mm512_fmadd_ps(_mm512_load_ps(cb + 16 * v), sc, acc[v]);
  };
  const int64_t nblk = (S + 1) / 2;
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const bool odd = blk & 1;
    if (odd) _tile_zero(5);
    else _tile_zero(0);
    for (int64_t s = 2 * blk; s < std::min(S, 2 * blk + 2); ++s) {
      for (int64_t r = 0; r < nr; ++r) {
        const uint8_t* p = w + r * row_bytes + s * 64;
        if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(p + prefetch), _MM_HINT_T1);
        __m512i a, b;
        const uint64_t special = avx512::BfDecFP8::words(_mm512_loadu_si512(p), a, b);
        _mm512_store_si512(buf.a0 + r * 32, a);
        _mm512_store_si512(buf.a1 + r * 32, b);
        if (special) [[unlikely]]
          fp8_subnormals(p, special, xb + s * step_values, T, scales[blk], fix + r * T);
      }
      barrier();
      _tile_loadd(1, buf.a0, 64);
      _tile_loadd(2, buf.a1, 64);
      _tile_loadd(3, xb + s * step_values, ldb);
      _tile_loadd(4, xb + s * step_values + 32 * T, ldb);
      if (odd) {
        _tile_dpbf16ps(5, 1, 3);
        _tile_dpbf16ps(5, 2, 4);
      } else {
        _tile_dpbf16ps(0, 1, 3);
        _tile_dpbf16ps(0, 2, 4);
      }
    }
    if (odd) _tile_stored(5, buf.c[1], ldb);
    else _tile_stored(0, buf.c[0], ldb);
    if (blk > 0) add(blk - 1);
  }
  if (nblk > 0) add(nblk - 1);
  for (int64_t v = 0; v < T; ++v) _mm512_storeu_ps(c + 16 * v, acc[v]);
}

__attribute__((target("amx-tile,amx-bf16"))) double amx_peak_loop(int64_t iters, float b) {
  alignas(64) uint16_t ones[kBlock * 32], bs[kBlock * 32];
  std::fill(ones, ones + kBlock * 32, f32_to_bf16(1.0f));
  std::fill(bs, bs + kBlock * 32, f32_to_bf16(b));
  alignas(64) float c[4][kBlock * kBlock];
  load_tile_config();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  barrier();
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_loadd(6, bs, 64);
  _tile_loadd(7, bs, 64);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c[0], 64);
  _tile_stored(1, c[1], 64);
  _tile_stored(2, c[2], 64);
  _tile_stored(3, c[3], 64);
  release_tiles();
  barrier();
  double sum = 0;
  for (auto& tile : c)
    for (float v : tile) sum += v;
  return sum;
}

bool amx_available() {
  static const bool ok = request_amx();
  return ok;
}

int64_t amx_packed_size(int64_t M, int64_t K) { return (M + kBlock - 1) / kBlock * kBlock * K; }

void amx_pack_activations(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, uint16_t* out) {
  // Per token block and step: the 16 tokens' 16 column pairs, transposed (a pair is 32 bits).
  const int64_t Mb = (M + kBlock - 1) / kBlock, Kc = K / kStep;
  for (int64_t tb = 0; tb < Mb; ++tb)
    for (int64_t s = 0; s < Kc; ++s) {
      __m512 pairs[16];
      vec::transpose16(reinterpret_cast<const float*>(x + tb * kBlock * ldx + s * kStep), ldx / 2, M - tb * kBlock,
                       pairs);
      float* tile = reinterpret_cast<float*>(out + (tb * Kc + s) * kTileValues);
      for (int p = 0; p < 16; ++p) _mm512_storeu_ps(tile + p * kBlock, pairs[p]);
    }
}

void amx_gemm_rows32(const uint16_t* xp, int64_t M, int64_t K, const uint16_t* W, int64_t ldw, int64_t rows,
                     bool prefetch, float* y, int64_t ldy) {
  const int64_t Kc = K / kStep, Mb = (M + kBlock - 1) / kBlock, bs = Kc * kTileValues;
  alignas(64) float c[6 * kBlock * kBlock];
  load_tile_config();
  for (int64_t tb = 0; tb < Mb; tb += 3) {
    const int nt = int(std::min<int64_t>(3, Mb - tb));
    const uint16_t* x = xp + tb * bs;
    const bool pf = prefetch && tb == 0;  // later groups find the rows in L2
    if (nt == 3) tiles<3>(W, ldw, x, bs, Kc, pf, c);
    else if (nt == 2) tiles<2>(W, ldw, x, bs, Kc, pf, c);
    else tiles<1>(W, ldw, x, bs, Kc, pf, c);
    for (int j = 0; j < nt; ++j) {
      const int64_t t0 = (tb + j) * kBlock, nt_rows = std::min(kBlock, M - t0);
      for (int rb = 0; rb < 2; ++rb) {
        const int64_t r0 = rb * kBlock, nr = std::min(kBlock, rows - r0);
        if (nr <= 0) continue;
        __m512 col[16];  // col[m]: token m's 16 rows
        vec::transpose16(c + (rb * 3 + j) * kBlock * kBlock, kBlock, kBlock, col);
        const __mmask16 keep = __mmask16((1u << nr) - 1);
        for (int64_t m = 0; m < nt_rows; ++m) _mm512_mask_storeu_ps(y + (t0 + m) * ldy + r0, keep, col[m]);
      }
    }
  }
  release_tiles();
}

}  // namespace mla::cpu
