#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace mla {

Rope::Rope(const ModelConfig& cfg) {
  const int64_t dim = cfg.qk_rope_head_dim;
  const double base = cfg.rope_theta;
  std::vector<double> pos_freqs(size_t(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) pos_freqs[size_t(i)] = std::pow(base, double(2 * i) / double(dim));
  inv_freq_.resize(pos_freqs.size());
  const RopeScaling& rs = cfg.rope_scaling;
  if (!rs.yarn) {
    for (size_t i = 0; i < pos_freqs.size(); ++i) inv_freq_[i] = 1.0 / pos_freqs[i];
    return;
  }
  const double f = rs.factor, orig = double(rs.original_max_position_embeddings);
  // The dimension whose wavelength completes `rotations` turns over the original context.
  auto correction_dim = [&](double rotations) {
    return double(dim) * std::log(orig / (rotations * 2 * M_PI)) / (2 * std::log(base));
  };
  double low = std::max(std::floor(correction_dim(rs.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(rs.beta_slow)), double(dim - 1));
  if (low == high) high += 0.001;
  for (size_t i = 0; i < pos_freqs.size(); ++i) {
    double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    double extrapolate = 1.0 - ramp;  // weight of the original frequency
    inv_freq_[i] = 1.0 / (f * pos_freqs[i]) * (1.0 - extrapolate) + 1.0 / pos_freqs[i] * extrapolate;
  }
  attention_factor_ = yarn_mscale(f, rs.mscale) / yarn_mscale(f, rs.mscale_all_dim);
}

// Precision: the inverse frequencies (above), the angle pos * inv_freq and its cos/sin are
// float64; only cos/sin are rounded to float32, so at every position of any released context
// they are the exact values within one float32 rounding (about 6e-8). transformers multiplies a
// float32 inv_freq by a float32 position, whose angle errs by up to about 6e-3 rad at 160k.
// tests/model/test_rope_precision.cpp measures both (figures in docs/long-context.md).
void Rope::angles(int64_t pos, float* cos, float* sin) const {
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    const double a = double(pos) * inv_freq_[i];
    cos[i] = float(std::cos(a) * attention_factor_);
    sin[i] = float(std::sin(a) * attention_factor_);
  }
}

}  // namespace mla
