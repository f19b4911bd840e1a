// What the prompt GEMM kernels that transpose their weight blocks share (fma_gemm.cpp,
// dpbf16_gemm.cpp, vnni_gemm.cpp): the split of a call's tokens into register blocks and each
// thread's buffer for the reordered block. Internal to src/backend/cpu.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace mla::cpu {

// Calls run(std::integral_constant<int, n>{}, t0) for consecutive groups of n tokens from t0,
// n <= Max, covering M tokens in groups of nearly equal size (29 tokens, Max 12: 10, 10, 9), so
// no group is left with one or two tokens and too few independent chains.
template <int N, class F>
inline void with_token_count(int n, F&& f) {
  if constexpr (N > 1) {
    if (n < N) return with_token_count<N - 1>(n, f);
  }
  f(std::integral_constant<int, N>{});
}
// The groups of at most Max tokens that M tokens split into, and group g's first token and size
// (the first M % groups groups one token larger), so that the groups can be handed to threads.
struct TokenGroup {
  int64_t t0, n;
};
inline int64_t token_group_count(int64_t M, int Max) { return (M + Max - 1) / Max; }
inline TokenGroup token_group(int64_t M, int Max, int64_t g) {
  const int64_t groups = token_group_count(M, Max), q = M / groups, r = M % groups;
  return {g * q + std::min(g, r), q + (g < r ? 1 : 0)};
}
template <int Max, class Run>
inline void for_each_token_group(int64_t M, Run&& run) {
  for (int64_t g = 0, groups = token_group_count(M, Max); g < groups; ++g) {
    const TokenGroup tg = token_group(M, Max, g);
    with_token_count<Max>(int(tg.n), [&](auto n) { run(n, tg.t0); });
  }
}

// This thread's buffer of at least n words of T, 64-byte aligned, kept between calls (one per
// Tag type, so kernels do not share it).
template <class Tag, class T>
inline T* thread_buffer(size_t n) {
  thread_local std::vector<T> buf;
  if (buf.size() < n + 64 / sizeof(T)) buf.resize(n + 64 / sizeof(T));
  return reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63));
}

// y[t, 0..rows-1] for T tokens from their accumulators of rows 0..15 (a0) and 16..31 (a1); the
// rows past `rows` are not stored.
template <int T>
inline void store_rows32(const __m512 (&a0)[T], const __m512 (&a1)[T], int rows, float* y, int64_t ldy) {
  const __mmask16 m0 = __mmask16((1u << std::min(rows, 16)) - 1);
  const __mmask16 m1 = rows > 16 ? __mmask16((1u << std::min(rows - 16, 16)) - 1) : __mmask16(0);
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) {
    _mm512_mask_storeu_ps(y + t * ldy, m0, a0[t]);
    _mm512_mask_storeu_ps(y + t * ldy + 16, m1, a1[t]);
  }
}

// The bytes of a pass's bf16 activations (2 K per token, in passes of a multiple of 48 tokens,
// the AMX kernel's token group), read again for every 32 weight rows. AMX: within about 1 MiB,
// half of L2: 240 tokens at K = 2048, 48 at K = 7168. Measured on 2816 x 2048 experts, one per
// thread (2 threads): 256 tokens in one pass ran 1.17 TFLOPS, 512 tokens 1.05.
inline constexpr int64_t kAmxPassBytes = int64_t(1) << 20;
// The VDPBF16PS kernels run at about half AMX's rate, so a group of tokens read from L3 for every
// 32 rows keeps up with them; a pass's bf16 activations may then take 8 MiB (a quarter of a Zen
// 4 / 5 L3): the whole 512-token prompt at K = 2048, two passes at K = 10944, and every weight
// read once or twice from memory instead of 3 or 11 times. Measured against the 1 MiB passes
// (in-process alternation, 2 threads, Zen 5, 4 copies of each matrix cycled from DRAM, 512
// tokens): 21888 x 2048 1.05-1.07x, 2048 x 10944 1.08-1.15x, 5632 x 2048 1.04x, 2048-row
// products at K = 2048 and 2816 1.00-1.04x.
inline constexpr int64_t kDpbf16PassBytes = int64_t(8) << 20;
inline int64_t max_pass_tokens(int64_t K, int64_t bytes) { return std::clamp<int64_t>(bytes / (2 * K) / 48 * 48, 48, 512); }

// Tokens per pass for T tokens: at most max_pass_tokens(K, bytes), the passes of equal size (a
// short last pass would read every weight again for a few tokens).
inline int64_t pass_tokens(int64_t T, int64_t K, int64_t bytes) {
  const int64_t most = max_pass_tokens(K, bytes), npass = (T + most - 1) / most;
  return (T + npass - 1) / npass;
}

}  // namespace mla::cpu
