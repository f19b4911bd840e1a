// Weights rewritten at load into the order a kernel computes in, so that the prompt's GEMMs
// read them where they lie instead of reordering every block of rows on every call (as
// ik_llama.cpp's run-time repacking, -rtr, does for its kernels).
//
// BF16_PAIRS32 (tensor/matrix.h): without AMX the VDPBF16PS and FMA GEMMs (dpbf16_gemm.h,
// fma_gemm.h) multiply a block of 32 rows as column pairs, which they otherwise transpose into a
// per-thread buffer for each block and each call. 48 tokens through 64 experts of 2816 x 2048
// from DRAM, 2 threads, AMD Zen 5: 53-55 ms with the transpose in every call, 39-41 ms on
// blocks already in that order (the kernel's own rate, 0.95 of VDPBF16PS's peak).
//
// INT4_WORDS16 (tensor/matrix.h): the VNNI GEMM (vnni_gemm.h) multiplies 16 rows at a time with
// each row's 4 columns in one lane, and otherwise unpacks and transposes every block of 16 rows
// for each call (vnni_pack_rows16: about 29% of that GEMM's time in an INT4 prompt). Stored as
// the rows' 32-bit words side by side, a block's 8 code vectors of 32 columns are 4 loads, an AND
// and a shift each; the GEMVs of decode read the same blocks (formats/int4/kernels.cpp).
//
// INT8_WORDS16 (tensor/matrix.h): INT8 groups the same way, each row's 4 codes of a dword biased
// to unsigned: a block is exactly what vnni_pack_rows16 would build from it, so the VNNI GEMM
// reads it in place, and decode's GEMV runs on VPDPBUSD too (formats/int_group/vnni_gemv.h: Kernel::GemvVnni), one
// sequential stream of 64-byte vectors of 16 rows instead of the row-major GEMV's 4 rows a page
// apart.
#pragma once
#include "backend/cpu/context.h"
#include "tensor/matrix.h"

namespace mla::cpu {

// Whether ctx's products read BF16_PAIRS32 weights in place: the fast precision where AMX is not
// used (VDPBF16PS or FMA GEMMs; the GEMVs of a few tokens read it too, on float32 FMAs) and
// ctx.repack_weights is set. AMX tiles and oneDNN would have to unpack it again.
bool reads_pairs32(const Context& ctx);

// Whether W can be stored as BF16_PAIRS32: bf16, rows and columns multiples of 32.
bool pairs32_eligible(const MatrixView& W);

// Rewrites the bf16 rows of an eligible W in place (its memory writable, as a WeightArena's)
// as BF16_PAIRS32 and sets its format; the blocks of 32 rows are split across ctx's threads.
void repack_pairs32(const Context& ctx, MatrixView& W);

// Whether ctx's products read INT4_WORDS16 and INT8_WORDS16 weights in place: where the prompt's
// INT4 and INT8 products run on the VNNI GEMM (the fast precision without AMX,
// ctx.int8_activations) and ctx.repack_weights is set.
bool reads_words16(const Context& ctx);

// Whether W can be stored as INT4_WORDS16 or INT8_WORDS16: INT4 or INT8 groups of a multiple of
// 32 columns, rows a multiple of 16 starting on one (row0), columns of 32.
bool words16_eligible(const MatrixView& W);

// Rewrites an eligible W's codes and its rows' scales in place (both writable, as in a
// WeightArena) as INT4_WORDS16 or INT8_WORDS16 and sets its format; the blocks are split across
// ctx's threads.
void repack_words16(const Context& ctx, MatrixView& W);

}  // namespace mla::cpu
