// MLA decode kernel (sm_90a): one CTA of 8 warps handles a tile of 16/32/64 query rows of one
// sequence against the key blocks of its schedule pieces. Per 64-token block:
//   S = Q K^T  (rows x 64, k = 576)  warps split the keys,
//   online softmax (row max shared through shared memory, exp2 domain),
//   O += P V   (rows x 512, k = 64)  warps split the 512 output columns.
// The next block is fetched with cp.async while the current one is computed (BF16: two
// buffers; FP8: the raw rows land in a staging area and are dequantised to BF16 in place of
// the previous block). Shared rows are 16-byte chunks XOR-swizzled by (row & 7) so ldmatrix
// is free of bank conflicts. Pieces of split sequences write float32 partials that
// combine_kernel merges by LSE.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "backend/cuda/mla_decode.h"

namespace mla::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per bf16 row: 72
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("mla::cuda: ") + what + ": " + cudaGetErrorString(e));
}

struct KernelParams {
  const __nv_bfloat16* q;
  const uint8_t* cache;
  const int32_t* block_table;
  int64_t bt_stride;
  int page_size;
  const int32_t* lengths;
  const DecodePiece* pieces;
  const int32_t* part_begin;
  int rows, h_q, s_q;
  float scale_log2;  // softmax scale * log2(e)
  __nv_bfloat16* out;
  float* lse;
  float* o_part;
  float* lse_part;
};

__device__ __forceinline__ int swz(int row, int chunk) { return chunk ^ (row & 7); }

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous copy; src_bytes 0 fills the destination with zeros.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c += a(16x16, row) * b(16x8, col), bf16 in, f32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Address of token t's row in the paged cache (t < length).
__device__ __forceinline__ const uint8_t* token_row(const KernelParams& p, int b, int t, int row_bytes) {
  const int32_t page = p.block_table[int64_t(b) * p.bt_stride + t / p.page_size];
  return p.cache + (int64_t(page) * p.page_size + t % p.page_size) * row_bytes;
}

// Issues the copies of key block `blk` of sequence b: BF16 rows straight into a swizzled
// buffer, FP8 rows as raw bytes into the staging area. Tokens past the length are zeros.
template <bool FP8>
__device__ __forceinline__ void load_block(const KernelParams& p, int b, int len, int blk, void* dst) {
  const int tok = threadIdx.x >> 2, sub = threadIdx.x & 3;
  const int t = blk * kBlockTokens + tok;
  const bool valid = t < len;
  constexpr int row_bytes = FP8 ? kFp8RowBytes : kHeadDim * 2;
  const uint8_t* src = valid ? token_row(p, b, t, row_bytes) : p.cache;
  const int n = valid ? 16 : 0;
  if constexpr (FP8) {
    uint8_t* d = static_cast<uint8_t*>(dst) + tok * kFp8RowBytes;
    for (int c = sub; c < kFp8RowBytes / 16; c += 4) cp_async16(d + c * 16, valid ? src + c * 16 : src, n);
  } else {
    __nv_bfloat16* d = static_cast<__nv_bfloat16*>(dst) + tok * kHeadDim;
    for (int c = sub; c < kChunks; c += 4) cp_async16(d + swz(tok, c) * 8, valid ? src + c * 16 : src, n);
  }
}

// FP8 staging rows -> BF16 swizzled rows: latent byte * its block's scale, k_pe copied.
__device__ __forceinline__ void dequant_block(const uint8_t* stage, __nv_bfloat16* dst) {
  const int tok = threadIdx.x >> 2, sub = threadIdx.x & 3;
  const uint8_t* row = stage + tok * kFp8RowBytes;
  const float* scales = reinterpret_cast<const float*>(row + kKvLora);
  __nv_bfloat16* d = dst + tok * kHeadDim;
#pragma unroll 1
  for (int c = sub; c < kChunks; c += 4) {
    uint4 v;
    if (c < kKvLora / 8) {
      const uint2 raw = *reinterpret_cast<const uint2*>(row + c * 8);
      const float s = scales[c / 16];
      const uint32_t w[2] = {raw.x, raw.y};
      uint32_t o[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const __nv_fp8x2_storage_t pair = __nv_fp8x2_storage_t(w[i / 2] >> (16 * (i % 2)));
        const __half2 h = __half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3));
        const float2 f = __half22float2(h);
        o[i] = pack_bf16(f.x * s, f.y * s);
      }
      v = make_uint4(o[0], o[1], o[2], o[3]);
    } else {
      v = *reinterpret_cast<const uint4*>(row + kKvLora + kKvLora / 128 * 4 + (c - kKvLora / 8) * 16);
    }
    *reinterpret_cast<uint4*>(d + swz(tok, c) * 8) = v;
  }
}

template <int TILE>
constexpr size_t smem_bytes() {
  constexpr int WC = 8 / (TILE / 16);
  return size_t(TILE) * kHeadDim * 2           // Q
         + size_t(2) * kBlockTokens * kHeadDim * 2  // two key blocks (FP8: second is staging)
         + size_t(TILE) * kBlockTokens * 2      // P
         + size_t(2) * WC * TILE * 4;           // row max and row sum exchange
}

template <int TILE, bool FP8>
__global__ void __launch_bounds__(kThreads, 1) decode_kernel(const KernelParams p) {
  constexpr int RG = TILE / 16;      // row groups of 16
  constexpr int WC = 8 / RG;         // warps per row group
  constexpr int KW = kBlockTokens / WC;  // keys per warp in S
  constexpr int NT = KW / 8;         // n-tiles of S per warp
  constexpr int DW = kKvLora / WC;   // output columns per warp
  constexpr int ND = DW / 8;         // n-tiles of O per warp
  static_assert(RG * WC == 8 && NT >= 1 && ND % 2 == 0);

  extern __shared__ __align__(128) uint8_t smem[];
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* sKV = sQ + TILE * kHeadDim;
  __nv_bfloat16* sP = sKV + 2 * kBlockTokens * kHeadDim;
  float* sMax = reinterpret_cast<float*>(sP + TILE * kBlockTokens);
  float* sSum = sMax + WC * TILE;
  uint8_t* sStage = reinterpret_cast<uint8_t*>(sKV + kBlockTokens * kHeadDim);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rg = warp % RG, wc = warp / RG;
  const int g = lane >> 2, tq = lane & 3;
  const int row0 = rg * 16 + g, row1 = row0 + 8;  // tile-local rows of this thread's accumulators
  const int m_tile = blockIdx.y;
  const int grow0 = m_tile * TILE + row0, grow1 = m_tile * TILE + row1;

  for (int pi = p.part_begin[blockIdx.x]; pi < p.part_begin[blockIdx.x + 1]; ++pi) {
    const DecodePiece pc = p.pieces[pi];
    const int b = pc.batch, len = p.lengths[b];
    const int nblk = pc.block_end - pc.block_begin;
    // Keys visible to each row: [0, vis); padded rows (past rows) see every loaded key.
    const int vis0 = min(len, len - p.s_q + grow0 / p.h_q + 1);
    const int vis1 = min(len, len - p.s_q + grow1 / p.h_q + 1);

    if (nblk > 0) {
      for (int i = threadIdx.x; i < TILE * kChunks; i += kThreads) {
        const int r = i / kChunks, c = i % kChunks, gr = m_tile * TILE + r;
        const bool valid = gr < p.rows;
        const __nv_bfloat16* src = valid ? p.q + (int64_t(b) * p.rows + gr) * kHeadDim + c * 8 : p.q;
        cp_async16(sQ + r * kHeadDim + swz(r, c) * 8, src, valid ? 16 : 0);
      }
      load_block<FP8>(p, b, len, pc.block_begin, FP8 ? static_cast<void*>(sStage) : static_cast<void*>(sKV));
    }
    cp_async_commit();

    float o[ND][4];
#pragma unroll
    for (int i = 0; i < ND; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    for (int j = 0; j < nblk; ++j) {
      const int blk = pc.block_begin + j;
      const __nv_bfloat16* kv;
      cp_async_wait_all();
      __syncthreads();  // block j has landed; every warp is done with block j-1
      if constexpr (FP8) {
        dequant_block(sStage, sKV);
        __syncthreads();
        if (j + 1 < nblk) load_block<true>(p, b, len, blk + 1, sStage);
        kv = sKV;
      } else {
        if (j + 1 < nblk) load_block<false>(p, b, len, blk + 1, sKV + ((j + 1) & 1) * kBlockTokens * kHeadDim);
        kv = sKV + (j & 1) * kBlockTokens * kHeadDim;
      }
      cp_async_commit();

      // S = Q K^T for rows rg*16.., keys wc*KW..
      float s[NT][4];
#pragma unroll
      for (int i = 0; i < NT; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
      {
        const int qr = rg * 16 + (lane & 15);
        const __nv_bfloat16* qrow = sQ + qr * kHeadDim;
#pragma unroll 4
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
          uint32_t a[4];
          ldmatrix_x4(a, qrow + swz(qr, kk * 2 + (lane >> 4)) * 8);
          if constexpr (NT >= 2) {
#pragma unroll
            for (int np = 0; np < NT; np += 2) {
              const int kr = wc * KW + np * 8 + ((lane >> 4) & 1) * 8 + (lane & 7);
              uint32_t bf[4];
              ldmatrix_x4(bf, kv + kr * kHeadDim + swz(kr, kk * 2 + ((lane >> 3) & 1)) * 8);
              mma_bf16(s[np], a, bf[0], bf[1]);
              mma_bf16(s[np + 1], a, bf[2], bf[3]);
            }
          } else {
            const int kr = wc * KW + (lane & 7);
            uint32_t bf[2];
            ldmatrix_x2(bf, kv + kr * kHeadDim + swz(kr, kk * 2 + ((lane >> 3) & 1)) * 8);
            mma_bf16(s[0], a, bf[0], bf[1]);
          }
        }
      }

      // Mask, scale to the exp2 domain, partial row max over this warp's keys.
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = blk * kBlockTokens + wc * KW + nt * 8 + tq * 2 + (e & 1);
          const bool hi = e >= 2;
          const float v = key < (hi ? vis1 : vis0) ? s[nt][e] * p.scale_log2 : -INFINITY;
          s[nt][e] = v;
          if (hi) mx1 = fmaxf(mx1, v);
          else mx0 = fmaxf(mx0, v);
        }
#pragma unroll
      for (int d = 1; d <= 2; d <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, d));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, d));
      }
      if (tq == 0) {
        sMax[wc * TILE + row0] = mx0;
        sMax[wc * TILE + row1] = mx1;
      }
      __syncthreads();
      float n0 = m0, n1 = m1;
#pragma unroll
      for (int c = 0; c < WC; ++c) {
        n0 = fmaxf(n0, sMax[c * TILE + row0]);
        n1 = fmaxf(n1, sMax[c * TILE + row1]);
      }
      // A row with no visible key so far keeps max -inf; use base 0 so exp2 gives 0, not NaN.
      const float base0 = n0 == -INFINITY ? 0.f : n0, base1 = n1 == -INFINITY ? 0.f : n1;
      const float alpha0 = exp2f(m0 - base0), alpha1 = exp2f(m1 - base1);
      m0 = n0;
      m1 = n1;
      l0 *= alpha0;
      l1 *= alpha1;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float p0 = exp2f(s[nt][0] - base0), p1 = exp2f(s[nt][1] - base0);
        const float p2 = exp2f(s[nt][2] - base1), p3 = exp2f(s[nt][3] - base1);
        l0 += p0 + p1;
        l1 += p2 + p3;
        const int key = wc * KW + nt * 8 + tq * 2;  // block-local
        *reinterpret_cast<uint32_t*>(sP + row0 * kBlockTokens + swz(row0, key >> 3) * 8 + (key & 7)) =
            pack_bf16(p0, p1);
        *reinterpret_cast<uint32_t*>(sP + row1 * kBlockTokens + swz(row1, key >> 3) * 8 + (key & 7)) =
            pack_bf16(p2, p3);
      }
#pragma unroll
      for (int i = 0; i < ND; ++i) {
        o[i][0] *= alpha0;
        o[i][1] *= alpha0;
        o[i][2] *= alpha1;
        o[i][3] *= alpha1;
      }
      __syncthreads();

      // O += P V for rows rg*16.., columns wc*DW..
      {
        const int pr = rg * 16 + (lane & 15);
#pragma unroll
        for (int kk = 0; kk < kBlockTokens / 16; ++kk) {
          uint32_t a[4];
          ldmatrix_x4(a, sP + pr * kBlockTokens + swz(pr, kk * 2 + (lane >> 4)) * 8);
          const int vr = kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
          const __nv_bfloat16* vrow = kv + vr * kHeadDim;
#pragma unroll
          for (int np = 0; np < ND; np += 2) {
            uint32_t bf[4];
            ldmatrix_x4_trans(bf, vrow + swz(vr, wc * (DW / 8) + np + (lane >> 4)) * 8);
            mma_bf16(o[np], a, bf[0], bf[1]);
            mma_bf16(o[np + 1], a, bf[2], bf[3]);
          }
        }
      }
    }
    cp_async_wait_all();

    // Row sums: over the quad, then over the WC warps of the row group.
#pragma unroll
    for (int d = 1; d <= 2; d <<= 1) {
      l0 += __shfl_xor_sync(0xffffffffu, l0, d);
      l1 += __shfl_xor_sync(0xffffffffu, l1, d);
    }
    if (tq == 0) {
      sSum[wc * TILE + row0] = l0;
      sSum[wc * TILE + row1] = l1;
    }
    __syncthreads();
    float L0 = 0.f, L1 = 0.f;
#pragma unroll
    for (int c = 0; c < WC; ++c) {
      L0 += sSum[c * TILE + row0];
      L1 += sSum[c * TILE + row1];
    }
    const bool split = pc.slot >= 0;
    const float empty_lse = split ? -INFINITY : INFINITY;
    const float inv0 = L0 > 0.f ? 1.f / L0 : 0.f, inv1 = L1 > 0.f ? 1.f / L1 : 0.f;
    const float lse0 = L0 > 0.f ? (m0 + log2f(L0)) * kLn2 : empty_lse;
    const float lse1 = L1 > 0.f ? (m1 + log2f(L1)) * kLn2 : empty_lse;
    const int col0 = wc * DW + tq * 2;
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int gr = hi ? grow1 : grow0;
      if (gr >= p.rows) continue;
      const float inv = hi ? inv1 : inv0;
      const float lse = hi ? lse1 : lse0;
      if (split) {
        float* dst = p.o_part + (int64_t(pc.slot) * p.rows + gr) * kKvLora + col0;
#pragma unroll
        for (int i = 0; i < ND; ++i)
          *reinterpret_cast<float2*>(dst + i * 8) = make_float2(o[i][2 * hi] * inv, o[i][2 * hi + 1] * inv);
        if (wc == 0 && tq == 0) p.lse_part[int64_t(pc.slot) * p.rows + gr] = lse;
      } else {
        __nv_bfloat16* dst = p.out + (int64_t(b) * p.rows + gr) * kKvLora + col0;
#pragma unroll
        for (int i = 0; i < ND; ++i)
          *reinterpret_cast<uint32_t*>(dst + i * 8) = pack_bf16(o[i][2 * hi] * inv, o[i][2 * hi + 1] * inv);
        if (wc == 0 && tq == 0) {
          const int qi = gr / p.h_q, h = gr % p.h_q;
          p.lse[(int64_t(b) * p.h_q + h) * p.s_q + qi] = lse;
        }
      }
    }
    __syncthreads();  // sSum is read above; the next piece writes it again
  }
}

// Merges the partials of split sequences: one CTA per (sequence, row), 128 threads x 4 columns.
__global__ void __launch_bounds__(128) combine_kernel(const int32_t* split_begin, const int32_t* num_splits,
                                                      const float* o_part, const float* lse_part, int rows, int h_q,
                                                      int s_q, __nv_bfloat16* out, float* lse) {
  const int b = blockIdx.x, r = blockIdx.y;
  const int ns = num_splits[b];
  if (ns <= 1) return;
  const int s0 = split_begin[b];
  float mx = -INFINITY;
  for (int k = 0; k < ns; ++k) mx = fmaxf(mx, lse_part[int64_t(s0 + k) * rows + r]);
  const int col = threadIdx.x * 4;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  float total_lse = INFINITY;
  if (mx != -INFINITY) {
    float sum = 0.f;
    for (int k = 0; k < ns; ++k) sum += expf(lse_part[int64_t(s0 + k) * rows + r] - mx);
    const float inv = 1.f / sum;
    for (int k = 0; k < ns; ++k) {
      const float w = expf(lse_part[int64_t(s0 + k) * rows + r] - mx) * inv;
      if (w == 0.f) continue;  // a partial without keys holds zeros; skip it anyway
      const float4 v = *reinterpret_cast<const float4*>(o_part + (int64_t(s0 + k) * rows + r) * kKvLora + col);
      acc[0] += w * v.x;
      acc[1] += w * v.y;
      acc[2] += w * v.z;
      acc[3] += w * v.w;
    }
    total_lse = mx + logf(sum);
  }
  uint2 packed = make_uint2(pack_bf16(acc[0], acc[1]), pack_bf16(acc[2], acc[3]));
  *reinterpret_cast<uint2*>(out + (int64_t(b) * rows + r) * kKvLora + col) = packed;
  if (threadIdx.x == 0) lse[(int64_t(b) * h_q + r % h_q) * s_q + r / h_q] = total_lse;
}

template <int TILE, bool FP8>
void launch(const DecodePlan& plan, const KernelParams& kp, cudaStream_t stream) {
  constexpr size_t bytes = smem_bytes<TILE>();
  check(cudaFuncSetAttribute(decode_kernel<TILE, FP8>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
        "setting the decode kernel's shared memory");
  const dim3 grid(unsigned(plan.schedule.num_parts), unsigned(plan.schedule.num_m_tiles));
  decode_kernel<TILE, FP8><<<grid, kThreads, bytes, stream>>>(kp);
}

template <bool FP8>
void launch_tile(const DecodePlan& plan, const KernelParams& kp, cudaStream_t stream) {
  switch (plan.schedule.tile_rows) {
    case 16: launch<16, FP8>(plan, kp, stream); break;
    case 32: launch<32, FP8>(plan, kp, stream); break;
    case 64: launch<64, FP8>(plan, kp, stream); break;
    default: throw std::invalid_argument("run_decode: plan has an unknown tile size");
  }
}

template <typename T>
T* carve(uint8_t*& cursor, size_t count) {
  T* p = reinterpret_cast<T*>(cursor);
  cursor += (count * sizeof(T) + 255) / 256 * 256;
  return p;
}

}  // namespace

int device_sm_count() {
  int dev = 0, n = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), "querying the SM count");
  return n;
}

DecodePlan plan_decode(const int32_t* lengths_host, int batch, int s_q, int h_q, int num_sms) {
  DecodePlan plan;
  plan.schedule = schedule_decode(lengths_host, batch, s_q, h_q, num_sms, kBlockTokens);
  const DecodeSchedule& s = plan.schedule;
  auto round = [](size_t n) { return (n + 255) / 256 * 256; };
  const size_t bytes = round(size_t(batch) * 4) + round(s.pieces.size() * sizeof(DecodePiece)) +
                       round(s.part_begin.size() * 4) + 2 * round(size_t(batch) * 4) +
                       round(size_t(s.num_slots) * s.rows * kKvLora * 4) + round(size_t(s.num_slots) * s.rows * 4);
  void* raw = nullptr;
  check(cudaMalloc(&raw, bytes), "allocating the decode plan");
  plan.memory = std::shared_ptr<void>(raw, [](void* ptr) { cudaFree(ptr); });
  uint8_t* cur = static_cast<uint8_t*>(raw);
  int32_t* lengths = carve<int32_t>(cur, size_t(batch));
  DecodePiece* pieces = carve<DecodePiece>(cur, s.pieces.size());
  int32_t* part_begin = carve<int32_t>(cur, s.part_begin.size());
  int32_t* split_begin = carve<int32_t>(cur, size_t(batch));
  int32_t* num_splits = carve<int32_t>(cur, size_t(batch));
  plan.o_part = carve<float>(cur, size_t(s.num_slots) * s.rows * kKvLora);
  plan.lse_part = carve<float>(cur, size_t(s.num_slots) * s.rows);
  check(cudaMemcpy(lengths, lengths_host, size_t(batch) * 4, cudaMemcpyHostToDevice), "copying lengths");
  check(cudaMemcpy(pieces, s.pieces.data(), s.pieces.size() * sizeof(DecodePiece), cudaMemcpyHostToDevice),
        "copying the schedule");
  check(cudaMemcpy(part_begin, s.part_begin.data(), s.part_begin.size() * 4, cudaMemcpyHostToDevice),
        "copying the schedule");
  check(cudaMemcpy(split_begin, s.split_begin.data(), size_t(batch) * 4, cudaMemcpyHostToDevice),
        "copying the schedule");
  check(cudaMemcpy(num_splits, s.num_splits.data(), size_t(batch) * 4, cudaMemcpyHostToDevice),
        "copying the schedule");
  plan.lengths = lengths;
  plan.pieces = pieces;
  plan.part_begin = part_begin;
  plan.split_begin = split_begin;
  plan.num_splits = num_splits;
  return plan;
}

void run_decode(const DecodePlan& plan, const DecodeArgs& a, cudaStream_t stream) {
  const DecodeSchedule& s = plan.schedule;
  if (!plan.memory) throw std::invalid_argument("run_decode: empty plan (call plan_decode)");
  if (!a.q || !a.cache || !a.block_table || !a.out || !a.lse)
    throw std::invalid_argument("run_decode: q, cache, block_table, out and lse must all be set");
  if (a.page_size < 1) throw std::invalid_argument("run_decode: page_size must be >= 1, got " + std::to_string(a.page_size));
  if (a.block_table_stride < 1) throw std::invalid_argument("run_decode: block_table_stride must be >= 1");
  if ((reinterpret_cast<uintptr_t>(a.q) | reinterpret_cast<uintptr_t>(a.cache) | reinterpret_cast<uintptr_t>(a.out)) &
      15)
    throw std::invalid_argument("run_decode: q, cache and out must be 16-byte aligned");
  if (!(a.softmax_scale > 0.f) || !std::isfinite(a.softmax_scale))
    throw std::invalid_argument("run_decode: softmax_scale must be a positive finite number");

  KernelParams kp;
  kp.q = static_cast<const __nv_bfloat16*>(a.q);
  kp.cache = static_cast<const uint8_t*>(a.cache);
  kp.block_table = a.block_table;
  kp.bt_stride = a.block_table_stride;
  kp.page_size = a.page_size;
  kp.lengths = plan.lengths;
  kp.pieces = plan.pieces;
  kp.part_begin = plan.part_begin;
  kp.rows = s.rows;
  kp.h_q = s.h_q;
  kp.s_q = s.s_q;
  kp.scale_log2 = a.softmax_scale * kLog2e;
  kp.out = static_cast<__nv_bfloat16*>(a.out);
  kp.lse = a.lse;
  kp.o_part = plan.o_part;
  kp.lse_part = plan.lse_part;

  if (a.cache_dtype == CacheDType::FP8) launch_tile<true>(plan, kp, stream);
  else launch_tile<false>(plan, kp, stream);
  check(cudaGetLastError(), "launching the decode kernel");
  if (s.num_slots > 0) {
    combine_kernel<<<dim3(unsigned(s.batch), unsigned(s.rows)), 128, 0, stream>>>(
        plan.split_begin, plan.num_splits, plan.o_part, plan.lse_part, s.rows, s.h_q, s.s_q, kp.out, a.lse);
    check(cudaGetLastError(), "launching the decode combine kernel");
  }
}

}  // namespace mla::cuda
