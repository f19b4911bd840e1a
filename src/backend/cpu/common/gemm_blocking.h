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

}  // namespace mla::cpu
