// Rotary position embedding of the decoupled rope dimensions, with DeepSeek's YaRN:
// frequencies interpolated between extrapolation (high frequency) and interpolation (low
// frequency) over a linear ramp, cos/sin scaled by mscale(factor, mscale)/mscale(factor, mscale_all_dim).
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace mla {

class Rope {
 public:
  explicit Rope(const ModelConfig& cfg);
  int64_t half() const { return int64_t(inv_freq_.size()); }
  // cos/sin for one position, half() values each.
  void angles(int64_t pos, float* cos, float* sin) const;
  const std::vector<double>& inv_freq() const { return inv_freq_; }
  double attention_factor() const { return attention_factor_; }

 private:
  std::vector<double> inv_freq_;
  double attention_factor_ = 1.0;
};

}  // namespace mla
