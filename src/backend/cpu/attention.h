// MLA attention on the CPU, both exact algorithms, over float32 rows:
//  expand (MHA form): keys and values are the cached latents expanded through kv_b_proj;
//  absorb (MQA form): queries are mapped into latent space, every head shares the latent.
// Query t sits at position q_pos0 + t; key j at k_pos0 + j; causal: key position <= query
// position. Each call also returns the log-sum-exp of every (token, head) row so partial
// results over disjoint key ranges merge exactly (merge_partial).
#pragma once
#include <cstdint>
#include <functional>

#include "backend/cpu/context.h"

namespace mla::cpu {

struct ExpandArgs {
  const float* q;      // [T, H, nope + rope], q_pe already rotated
  const float* kv;     // [S, H, nope + v]: the latents of the key range through kv_b_proj
  const float* k_pe;   // [S, ...] rotated shared rope keys, row stride ld_kpe
  int64_t ld_kpe;
  int64_t T, S, H, nope, rope, v;
  int64_t q_pos0, k_pos0;
  float scale;
};
// out: [T, H, v]; lse: [T, H] (-inf where a row sees no key; its out row is then 0).
// Runs expand_kernel(a)'s kernel.
void attention_expand(const Context& ctx, const ExpandArgs& a, float* out, float* lse);

// The three kernels of the expand path, each callable on its own (tests hold each to the
// reference, attention_reference.h):
//  F32:    float32 products (AVX-512 sgemm), softmax in float32;
//  Amx:    bf16 products with float32 sums on AMX tiles, the softmax in float32 between them. It
//          needs AMX on the CPU and (nope + rope) % 32 == 0;
//  Dpbf16: the same bf16 products on VDPBF16PS (dpbf16_gemm.h's paired kernel); it needs
//          (nope + rope) % 32 == 0.
// attention_expand picks, in the fast precision: Amx where it can run and ctx.amx allows; else
// Dpbf16 where it can run, unless float32 FMAs outrun VDPBF16PS on this CPU (dispatch.h's
// CpuFeatures::fma_gemm); else F32. The precise precision always runs F32.
enum class ExpandKernel { F32, Amx, Dpbf16 };
const char* expand_kernel_name(ExpandKernel k);
bool amx_expand_supported(const ExpandArgs& a);
bool dpbf16_expand_supported(const ExpandArgs& a);
ExpandKernel expand_kernel(const Context& ctx, const ExpandArgs& a);
void attention_expand_f32(const Context& ctx, const ExpandArgs& a, float* out, float* lse);
// Each throws std::logic_error where its _supported(a) is false.
void attention_expand_amx(const Context& ctx, const ExpandArgs& a, float* out, float* lse);
void attention_expand_dpbf16(const Context& ctx, const ExpandArgs& a, float* out, float* lse);

struct AbsorbArgs {
  const float* q_lat;   // [T, H, kv_lora]: q_nope mapped through W_UK
  const float* q_pe;    // [T, H, rope] with row stride ld_qpe between tokens (heads contiguous, rope apart)
  int64_t ld_qpe, head_stride_qpe;
  const float* latent;  // [S, kv_lora + rope]: c_KV then k_pe per key; or null, and then:
  int64_t T, S, H, kv_lora, rope;
  int64_t q_pos0, k_pos0;
  float scale;
  // Writes keys [s0, s0 + n) as float32 rows of kv_lora + rope (e.g. LatentPool::gather); called
  // from several threads at once on disjoint ranges. Used when latent is null.
  std::function<void(int64_t s0, int64_t n, float* out)> gather = nullptr;
  // The same keys as the bf16 rows a bf16 cache stores (LatentPool::gather_bf16); where given,
  // the fast precision runs the bf16 kernel over them (absorb_kernel).
  std::function<void(int64_t s0, int64_t n, uint16_t* out)> gather_bf16 = nullptr;
  // Or those rows where they lie, read in place by the bf16 kernel (no copy): bf16_rows(s), s a
  // multiple of 32, points at key s's row, and keys s + 1 .. min(s + 32, S) - 1 follow it at
  // kv_lora + rope values apart (LatentPool::bf16_row with pages of a multiple of 32 rows).
  std::function<const uint16_t*(int64_t s)> bf16_rows = nullptr;
};
// out_lat: [T, H, kv_lora] (weighted sums of c_KV); lse: [T, H].
// The keys go in blocks with an online softmax (running max and sum per row); long key ranges
// are split across ctx's threads, each thread's partial result merged by log-sum-exp, so decoding
// on a long cache uses every core and never holds more than a block of keys in float32.
// Runs absorb_kernel(ctx, a)'s kernel.
void attention_absorb(const Context& ctx, const AbsorbArgs& a, float* out_lat, float* lse);

// The two kernels of the absorb path:
//  F32:    the keys as float32 rows (gather or latent), float32 products;
//  Dpbf16: the keys as stored in a bf16 cache (bf16_rows or gather_bf16), products on
//          VDPBF16PS: the scaled queries and the softmax weights rounded to bf16, every sum in
//          float32, the softmax in float32 between the two products. The scores put 16 query rows
//          in the lanes and broadcast each key's column pairs from its row, so the keys are
//          neither copied (bf16_rows) nor transposed. It needs bf16_rows or gather_bf16,
//          (kv_lora + rope) % 32 == 0 and kv_lora % 16 == 0.
// attention_absorb picks Dpbf16 in the fast precision where it can run, else F32 (which needs
// latent or gather).
enum class AbsorbKernel { F32, Dpbf16 };
const char* absorb_kernel_name(AbsorbKernel k);
bool dpbf16_absorb_supported(const AbsorbArgs& a);
AbsorbKernel absorb_kernel(const Context& ctx, const AbsorbArgs& a);

// acc <- the exact merge of (acc, acc_lse) with (part, part_lse): rows of d values.
void merge_partial(float* acc, float* acc_lse, const float* part, const float* part_lse, int64_t rows, int64_t d);

}  // namespace mla::cpu
