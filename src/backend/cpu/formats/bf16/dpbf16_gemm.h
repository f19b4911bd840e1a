// bf16 GEMM on VDPBF16PS for the fast precision's prompt-sized products on CPUs with AVX-512
// BF16 and no AMX (gemm.cpp chooses it there, or where Context::amx is false, when K is a
// multiple of 32). Both operands are read row-major as bf16: the weights where they lie, the
// activations as converted once per call. Each VDPBF16PS multiplies 32 columns of one weight row
// by the same 32 columns of one token, so a zmm accumulator holds 16 partial sums of one output
// (over the columns k = 2i, 2i + 1 mod 32 of lane i), added up once at the end of the row. No
// operand is padded: an expert's few dozen tokens cost what they compute, whatever their count.
// Internal to src/backend/cpu.
#pragma once
#include <cstdint>

namespace mla::cpu {

// y[t, r] = sum over k of W[r, k] x[t, k] for r < rows (at most 32), t < M. x: bf16 tokens of K
// values, ldx apart; W: bf16 rows of K values, ldw apart, readable for rows rounded up to 4;
// K % 32 == 0. `prefetch`: W comes from memory, so each group of rows fetches the next ahead
// (towards L2) while it runs. Per output 16 float32 chains over the column pairs, summed at the
// end. Single-threaded; callers split the rows.
void dpbf16_gemm_rows32(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const uint16_t* W, int64_t ldw,
                        int64_t rows, bool prefetch, float* y, int64_t ldy);

// matmul_bf16's VDPBF16PS path runs a pass of at least this many tokens on the paired kernel
// below (the transpose then costs little), fewer on dpbf16_gemm_rows32. One thread, 64 bf16
// matrices of 2816 x 2048 cycled from DRAM, AMD Zen 5: 48 tokens 1.76 ms against 2.20 for the
// row-major kernel.
constexpr int64_t kDpbf16PairsMinTokens = 16;

// The activations of the paired kernel below: x [M, K] (bf16, ldx apart) as dwords of column
// pairs, token group by token group (gemm_blocking.h's for_each_token_group of
// kDpbf16PairsTokens): the group of n tokens from t0 at out + t0 * K / 2, pair j of its token i
// at [j * n + i]. The kernel then reads every token's pair from one pointer at fixed offsets
// (with a pointer per token row, 12 of them, the compiler kept reloading them from the stack).
// out: M * K / 2 dwords; the caller packs once per pass, every block of rows reads it.
constexpr int kDpbf16PairsTokens = 12;
void pack_activation_pairs(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, uint32_t* out);

// One token group of that layout (gemm_blocking.h's token_group(M, kDpbf16PairsTokens, g)): its n
// tokens x (ldx apart) into out + t0 * K / 2, so that threads can pack the groups between them.
void pack_activation_pair_group(const uint16_t* x, int64_t n, int64_t K, int64_t ldx, uint32_t* out);

// The same group from float32 tokens (n <= 16, K % 32 == 0), each value rounded to bf16 as
// activations_bf16 rounds it (to nearest even): in one pass, 32 columns of the n tokens
// converted, then transposed in registers into 16 pairs of n dwords. The two passes it replaces
// (convert, then a 4-byte copy per pair) cost about 3% of a bf16 prompt's time.
void pack_activation_pair_group(const float* x, int64_t n, int64_t K, int64_t ldx, uint32_t* out);

// The same product with the 32 rows first transposed into column pairs in a per-thread buffer
// (pack_column_pairs32, as the FMA GEMM does): each VDPBF16PS then takes one column pair of 16
// rows against one token's pair broadcast, 16 outputs in its lanes, 12 tokens x 32 rows of
// accumulators; no horizontal sums. xp: the activations by pack_activation_pairs. W readable
// for 32 rows. `prefetch`: W comes from memory and the caller's next block follows it (ldw ==
// K), fetched towards L2 while the token groups run, spread over their column pairs. Per output
// one float32 chain, two roundings per column pair.
void dpbf16_gemm_pairs_rows32(const uint32_t* xp, int64_t M, int64_t K, const uint16_t* W, int64_t ldw, int64_t rows,
                              bool prefetch, float* y, int64_t ldy);

// The same on a block of 32 rows stored as column pairs (BF16_PAIRS32: what the call above
// packs into its buffer), read where it lies: p its K / 2 x 32 words; `next` the caller's next
// block (K * 64 bytes, fetched towards L2 while the token groups run) or nullptr.
void dpbf16_gemm_packed_rows32(const uint32_t* xp, int64_t M, int64_t K, const uint32_t* p, const void* next,
                               int64_t rows, float* y, int64_t ldy);

}  // namespace mla::cpu
