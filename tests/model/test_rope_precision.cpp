// Rotary angles at large positions. mla computes inverse frequencies, angles and cos/sin in
// float64 and rounds cos/sin to float32 (model/rope.h); transformers computes the angle as a
// float32 inverse frequency times a float32 position. Both are measured here against the exact
// value (the same formulas in long double) at position 160,000 and at each family's last
// position, for every family's rope scaling.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "model/config.h"
#include "model/presets.h"
#include "model/rope.h"

namespace mla {
namespace {

using nlohmann::json;

// The angles of pair i at `pos` by transformers' float32 recipe (_compute_yarn_parameters /
// _compute_default_rope_parameters, then inv_freq.float() @ position_ids.float()), with its
// attention_scaling; cos/sin of the float32 angle.
struct Float32Rope {
  std::vector<float> inv_freq;
  float attention_scaling = 1.0f;
  explicit Float32Rope(const ModelConfig& c) {
    const int64_t dim = c.qk_rope_head_dim;
    const float base = float(c.rope_theta);
    const RopeScaling& rs = c.rope_scaling;
    // Python floats (double) for the correction range, as transformers does.
    double low = 0, high = 0;
    if (rs.yarn) {
      auto correction_dim = [&](double rot) {
        return double(dim) * std::log(double(rs.original_max_position_embeddings) / (rot * 2 * M_PI)) /
               (2 * std::log(double(c.rope_theta)));
      };
      low = std::max(std::floor(correction_dim(rs.beta_fast)), 0.0);
      high = std::min(std::ceil(correction_dim(rs.beta_slow)), double(dim - 1));
      if (low == high) high += 0.001;
      attention_scaling = float(yarn_mscale(rs.factor, rs.mscale) / yarn_mscale(rs.factor, rs.mscale_all_dim));
    }
    for (int64_t i = 0; i < dim / 2; ++i) {
      const float pos_freq = std::pow(base, float(2 * i) / float(dim));
      if (!rs.yarn) {
        inv_freq.push_back(1.0f / pos_freq);
        continue;
      }
      const float extrapolation = 1.0f / pos_freq, interpolation = 1.0f / (float(rs.factor) * pos_freq);
      const float ramp = std::clamp((float(i) - float(low)) / (float(high) - float(low)), 0.0f, 1.0f);
      const float mask = 1.0f - ramp;
      inv_freq.push_back(interpolation * (1.0f - mask) + extrapolation * mask);
    }
  }
  float angle(int64_t pos, int64_t i) const { return inv_freq[size_t(i)] * float(pos); }
};

// The exact angles: DeepSeek's YaRN formulas in long double.
struct ExactRope {
  std::vector<long double> inv_freq;
  long double attention_factor = 1;
  explicit ExactRope(const ModelConfig& c) {
    const int64_t dim = c.qk_rope_head_dim;
    const long double base = c.rope_theta, pi = 3.141592653589793238462643383279502884L;
    const RopeScaling& rs = c.rope_scaling;
    long double low = 0, high = 0;
    if (rs.yarn) {
      auto correction_dim = [&](long double rot) {
        return (long double)(dim) * std::log((long double)(rs.original_max_position_embeddings) / (rot * 2 * pi)) /
               (2 * std::log(base));
      };
      low = std::max(std::floor(correction_dim(rs.beta_fast)), 0.0L);
      high = std::min(std::ceil(correction_dim(rs.beta_slow)), (long double)(dim - 1));
      if (low == high) high += 0.001L;
      auto mscale = [](long double f, long double m) { return f <= 1 ? 1.0L : 0.1L * m * std::log(f) + 1.0L; };
      attention_factor = mscale(rs.factor, rs.mscale) / mscale(rs.factor, rs.mscale_all_dim);
    }
    for (int64_t i = 0; i < dim / 2; ++i) {
      const long double pos_freq = std::pow(base, (long double)(2 * i) / (long double)(dim));
      if (!rs.yarn) {
        inv_freq.push_back(1 / pos_freq);
        continue;
      }
      const long double ramp = std::clamp(((long double)(i) - low) / (high - low), 0.0L, 1.0L);
      inv_freq.push_back(1 / ((long double)(rs.factor) * pos_freq) * ramp + 1 / pos_freq * (1 - ramp));
    }
  }
  long double angle(int64_t pos, int64_t i) const { return (long double)(pos) * inv_freq[size_t(i)]; }
};

struct Family {
  std::string name;
  json config;
};

json text_config(const std::string& preset) {
  json c = find_preset(preset).config;
  return c.contains("text_config") ? c["text_config"] : c;
}

std::vector<Family> families() {
  // DeepSeek-V3's release has mscale = mscale_all_dim = 1; the unequal case (cos/sin scaled by
  // their ratio, as the deepseek-v3-yarn-tiny fixture has it) at the release's factor 40.
  json v3_mscale = text_config("deepseek-v3");
  v3_mscale["rope_scaling"]["mscale"] = 0.9;
  v3_mscale["rope_scaling"]["mscale_all_dim"] = 0.707;
  return {{"deepseek-v3", text_config("deepseek-v3")},
          {"deepseek-v3 mscale 0.9 / mscale_all_dim 0.707", v3_mscale},
          {"kimi-k2.5", text_config("kimi-k2.5")},
          {"glm-4.7-flash", text_config("glm-4.7-flash")}};
}

struct Errors {
  long double angle = 0, cos_sin = 0;
};

TEST(RopePrecision, AnglesAt160kAreExactWithinAFloat32Rounding) {
  for (const Family& f : families()) {
    const ModelConfig c = ModelConfig::from_json(f.config, f.name);
    const Rope rope(c);
    const Float32Rope f32(c);
    const ExactRope exact(c);
    ASSERT_EQ(rope.half(), c.qk_rope_head_dim / 2);
    Errors mla_err, f32_err;
    for (int64_t pos : {int64_t(160000), int64_t(160001), c.max_position_embeddings - 1}) {
      std::vector<float> cos(size_t(rope.half())), sin(size_t(rope.half()));
      rope.angles(pos, cos.data(), sin.data());
      for (int64_t i = 0; i < rope.half(); ++i) {
        const long double a = exact.angle(pos, i), ec = std::cos(a) * exact.attention_factor,
                          es = std::sin(a) * exact.attention_factor;
        mla_err.angle = std::max(mla_err.angle, std::fabs((long double)(double(pos) * rope.inv_freq()[size_t(i)]) - a));
        mla_err.cos_sin = std::max({mla_err.cos_sin, std::fabs(cos[size_t(i)] - ec), std::fabs(sin[size_t(i)] - es)});
        const float fa = f32.angle(pos, i);
        f32_err.angle = std::max(f32_err.angle, std::fabs((long double)(fa) - a));
        f32_err.cos_sin = std::max({f32_err.cos_sin, std::fabs((long double)(std::cos(fa) * f32.attention_scaling) - ec),
                                    std::fabs((long double)(std::sin(fa) * f32.attention_scaling) - es)});
      }
    }
    std::printf("%-48s max |angle - exact|: mla %.2e, float32 %.2e rad; max |cos/sin - exact|: mla %.2e, float32 %.2e\n",
                f.name.c_str(), double(mla_err.angle), double(f32_err.angle), double(mla_err.cos_sin),
                double(f32_err.cos_sin));
    // float64 angles: relative error a few ulps of 2^-53 on angles up to 2.6e5 rad.
    EXPECT_LT(mla_err.angle, 1e-9L) << f.name;
    // cos/sin rounded once to float32 (half an ulp, 3e-8 below 0.5, 6e-8 below 1) after the
    // attention factor (at most 1.04 here) in float64.
    EXPECT_LT(mla_err.cos_sin, 1.2e-7L) << f.name;
    // And not worse than transformers' float32, whose angle errs by up to 6e-3 at 160k (measured).
    EXPECT_LE(mla_err.cos_sin, f32_err.cos_sin) << f.name;
    EXPECT_GT(f32_err.angle, 1e-3L) << f.name << ": the float32 recipe should err visibly at 160k";
  }
}

// The precision does not depend on how large the position is, up to the longest context.
TEST(RopePrecision, Float64AnglesHoldAtEveryScale) {
  const ModelConfig c = ModelConfig::from_json(text_config("kimi-k2.5"), "kimi-k2.5");
  const Rope rope(c);
  const ExactRope exact(c);
  std::vector<float> cos(size_t(rope.half())), sin(size_t(rope.half()));
  for (int64_t pos = 1; pos < c.max_position_embeddings; pos = pos * 3 + 1) {
    rope.angles(pos, cos.data(), sin.data());
    for (int64_t i = 0; i < rope.half(); ++i) {
      const long double a = exact.angle(pos, i);
      EXPECT_LT(std::fabs(cos[size_t(i)] - std::cos(a) * exact.attention_factor), 1.2e-7L) << pos << " " << i;
      EXPECT_LT(std::fabs(sin[size_t(i)] - std::sin(a) * exact.attention_factor), 1.2e-7L) << pos << " " << i;
    }
  }
}

}  // namespace
}  // namespace mla
