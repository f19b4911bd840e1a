// The machine's limits as `mla bench` probes them: the read loop, the read of a token's own
// weights, the GEMM probe (see tools/bench.h); the loops themselves are the backend's
// (backend/cpu/probe.h).
#include <algorithm>
#include <numeric>

#include "tensor/dtype.h"
#include "tools/bench/sections.h"

namespace mla::bench {

double ReadLoop::measure(int passes) {
  const cpu::ReadSpan all = buffer_.span();
  double best = 0;
  for (int r = 0; r < std::max(1, passes); ++r) best = std::max(best, cpu::read_gbps({&all, 1}, buffer_.threads()));
  return best;
}

double read_bandwidth_gbps(size_t bytes, int runs, int threads) {
  ReadLoop loop(bytes, threads);
  return loop.measure(runs);
}

TokenRead::TokenRead(const ModelWeights& w, const ModelConfig& c, uint32_t seed, int threads)
    : w_(w), experts_per_token_(c.num_experts_per_tok), rng_state_(seed), threads_(cpu::threads_or_default(threads)) {
  each_fixed_weight(w, [&](const char*, const MatrixView& m) { add(fixed_, m); });
}

void TokenRead::add(std::vector<cpu::ReadSpan>& to, const MatrixView& m) {
  to.push_back({static_cast<const uint8_t*>(m.data), m.bytes()});
  if (m.scales) to.push_back({static_cast<const uint8_t*>(m.scales), m.scale_bytes()});
}

void TokenRead::draw() {
  std::mt19937 rng(rng_state_++);
  spans_ = fixed_;
  for (const auto& L : w_.layers) {
    if (!L.moe || L.experts.empty()) continue;
    std::vector<int64_t> order(L.experts.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t k = 0; k < std::min<int64_t>(experts_per_token_, int64_t(order.size())); ++k) {
      const Mlp& e = L.experts[size_t(order[size_t(k)])];
      if (!e.gate.data) continue;  // expert-parallel: another rank's expert
      for (const MatrixView* m : {&e.gate, &e.up, &e.down}) add(spans_, *m);
    }
  }
  const int64_t row = int64_t(rng() % uint32_t(std::max<int64_t>(1, w_.embed.rows)));
  spans_.push_back({static_cast<const uint8_t*>(w_.embed.data) + size_t(row) * w_.embed.row_bytes(), w_.embed.row_bytes()});
  bytes_ = 0;
  for (const cpu::ReadSpan& s : spans_) bytes_ += double(s.bytes);
}

double TokenRead::measure(int passes) {
  double best = 0;
  for (int r = 0; r < std::max(1, passes); ++r) {
    draw();
    best = std::max(best, cpu::read_gbps(spans_, threads_));
  }
  return best;
}

GemmProbe::GemmProbe(int64_t n, const cpu::Context& ctx) : n_(n), ctx_(ctx), a_(size_t(n * n)), b_(size_t(n * n)), c_(size_t(n * n)) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& v : a_) v = f32_to_bf16(u(rng));
  for (auto& v : b_) v = f32_to_bf16(u(rng));
}

double GemmProbe::measure(int passes) {
  double best = 0;
  for (int p = 0; p <= passes; ++p) {  // pass 0 creates the primitive and warms up
    auto t = Clock::now();
    cpu::gemm_probe_bf16(ctx_, n_, a_.data(), b_.data(), c_.data());
    const double s = seconds_since(t);
    if (p > 0) best = std::max(best, 2.0 * double(n_) * double(n_) * double(n_) / s / 1e9);
  }
  return best;
}

}  // namespace mla::bench
