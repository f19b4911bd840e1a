// Which MLA algorithm a batch runs on. The FLOP arithmetic of the two paths (per layer,
// 2 FLOPs per multiply-add) and the one small policy function that picks a path from a
// batch's shape. `mla analyze` prints the same arithmetic.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace mla {

enum class AttnPath { Auto, Expand, Absorb, Chunked };
const char* attn_path_name(AttnPath p);
AttnPath parse_attn_path(const std::string& s);  // auto | expand | absorb | chunked; throws otherwise

struct MlaCosts {
  double pair_expand;              // per (query, key) pair: 2H(nope+rope) + 2H v
  double pair_absorb;              // 2H(kv_lora+rope) + 2H kv_lora
  double expand_per_cached_token;  // 2 kv_lora H (nope + v): kv_b_proj over one cached latent
  double absorb_per_new_token;     // 2H nope kv_lora + 2H kv_lora v: W_UK and W_UV for one query
  double crossover_new_tokens() const { return expand_per_cached_token / (pair_absorb - pair_expand); }
  // T new tokens after S - T cached (S counts the new ones).
  static double pairs(double T, double S) { return T * S - T * (T - 1) / 2; }
  double expand(double T, double S) const { return S * expand_per_cached_token + pairs(T, S) * pair_expand; }
  double absorb(double T, double S) const { return T * absorb_per_new_token + pairs(T, S) * pair_absorb; }
  static MlaCosts of(const ModelConfig& c);
};

struct PathPolicy {
  // An expand whose cached prefix is longer than this runs chunked (the expanded K/V of the
  // prefix never exceeds one chunk); also the chunk size.
  int64_t prefix_chunk = 1024;
  // Prefer absorb unless expand is cheaper by this factor (absorb needs no expanded K/V memory).
  double expand_margin = 1.0;
};

struct SeqShape {
  int64_t new_tokens, cached_tokens;
};

// The policy: sum each path's FLOPs over the batch's sequences; the cheaper one wins (decode and
// short extends: absorb; prefill: expand). An expand over a cached prefix longer than
// prefix_chunk runs chunked.
AttnPath choose_attn_path(const MlaCosts& costs, const std::vector<SeqShape>& batch, const PathPolicy& policy);

}  // namespace mla
