// Rotary position embedding of the decoupled rope dimensions, with DeepSeek's YaRN:
// frequencies interpolated between extrapolation (high frequency) and interpolation (low
// frequency) over a linear ramp, cos/sin scaled by mscale(factor, mscale)/mscale(factor, mscale_all_dim).
#pragma once
#include <cstdint>
#include <vector>

#include "backend/cpu/parallel.h"
#include "model/config.h"

namespace mla {

class Rope {
 public:
  explicit Rope(const ModelConfig& cfg);
  int64_t half() const { return int64_t(inv_freq_.size()); }
  // cos/sin for one position, half() values each.
  void angles(int64_t pos, float* cos, float* sin) const;
  // Calls rotate(t, cos, sin) for each of T tokens with the angles of its position pos[t]; across
  // the context's threads from 16 tokens.
  template <class Rotate>
  void for_each_position(const cpu::Context& ctx, int64_t T, const int64_t* pos, Rotate&& rotate) const {
    cpu::parallel_region(ctx, T >= 16, [&] {
      thread_local std::vector<float> cosv, sinv;
      cosv.resize(size_t(half()));
      sinv.resize(size_t(half()));
#pragma omp for schedule(static)
      for (int64_t t = 0; t < T; ++t) {
        angles(pos[t], cosv.data(), sinv.data());
        rotate(t, cosv.data(), sinv.data());
      }
    });
  }
  const std::vector<double>& inv_freq() const { return inv_freq_; }
  double attention_factor() const { return attention_factor_; }

 private:
  std::vector<double> inv_freq_;
  double attention_factor_ = 1.0;
};

}  // namespace mla
