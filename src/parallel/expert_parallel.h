// Expert parallelism: which routed experts a rank holds, and what combining the ranks' expert
// outputs cost.
//
// Rank r of N holds a contiguous block of each MoE layer's routed experts,
// [E * r / N, E * (r + 1) / N): it maps and reads only those experts' weights (the others'
// pages of the checkpoint are never touched). Attention, dense layers, the router and the
// shared experts are replicated, so every rank has every token's hidden state at each MoE
// layer: no token has to be sent anywhere. Each rank runs its own experts for the tokens that
// chose them, weighted, into a [T, hidden] partial sum (rank 0 adds the shared experts' output
// as its first term), and the partials are summed across the ranks (sum_in_rank_order in
// parallel/comm.h).
//
// Why an allreduce of the hidden states and not an all-to-all dispatch and combine: with the
// inputs replicated, all-to-all would move each token's hidden state to the ranks of its top_k
// experts and their outputs back, about 2 * top_k * hidden values per token, where the
// allreduce moves (N - 1) * hidden per token to each rank: less for N <= 2 * top_k (16 for
// DeepSeek-V3's top_k = 8), which covers sockets and small clusters. The sum is gathered and
// added in rank order rather than left to MPI_Allreduce, whose algorithm may round
// differently on different ranks; this way every rank ends the layer with bitwise the same
// hidden state and the same sampled tokens, whatever the timing.
#pragma once
#include <cstdint>

namespace mla::parallel {

struct ExpertRange {
  int64_t begin = 0, end = -1;  // end < 0: every expert (one process)
  bool all() const { return end < 0; }
  bool has(int64_t e) const { return all() || (e >= begin && e < end); }
};

// Rank r of n's block of E experts: [E r / n, E (r + 1) / n); every expert when n == 1.
ExpertRange expert_range(int64_t n_experts, int rank, int size);

// The MoE layers' combine across ranks, summed over layer calls: calls, the bytes one rank
// received (N - 1 partial sums of T * hidden floats per call) and the wall time spent in it
// (waiting for the slowest rank included).
struct CombineCounters {
  int64_t calls = 0;
  double bytes_received = 0, seconds = 0;
};

}  // namespace mla::parallel
