#include "model/path_policy.h"

#include <stdexcept>

namespace mla {

const char* attn_path_name(AttnPath p) {
  switch (p) {
    case AttnPath::Auto: return "auto";
    case AttnPath::Expand: return "expand";
    case AttnPath::Absorb: return "absorb";
    case AttnPath::Chunked: return "chunked";
  }
  return "?";
}

AttnPath parse_attn_path(const std::string& s) {
  for (AttnPath p : {AttnPath::Auto, AttnPath::Expand, AttnPath::Absorb, AttnPath::Chunked})
    if (s == attn_path_name(p)) return p;
  throw std::invalid_argument("unknown attention path '" + s + "' (auto, expand, absorb, chunked)");
}

MlaCosts MlaCosts::of(const ModelConfig& c) {
  const double H = double(c.num_attention_heads), nope = double(c.qk_nope_head_dim), rope = double(c.qk_rope_head_dim),
               v = double(c.v_head_dim), r = double(c.kv_lora_rank);
  return {2 * H * (nope + rope) + 2 * H * v, 2 * H * (r + rope) + 2 * H * r, 2 * r * H * (nope + v),
          2 * H * nope * r + 2 * H * r * v};
}

AttnPath choose_attn_path(const MlaCosts& costs, const std::vector<SeqShape>& batch, const PathPolicy& policy) {
  double expand = 0, absorb = 0;
  int64_t longest_prefix = 0;
  for (auto& s : batch) {
    double T = double(s.new_tokens), S = double(s.new_tokens + s.cached_tokens);
    expand += costs.expand(T, S);
    absorb += costs.absorb(T, S);
    longest_prefix = std::max(longest_prefix, s.cached_tokens);
  }
  if (expand * policy.expand_margin >= absorb) return AttnPath::Absorb;
  return longest_prefix > policy.prefix_chunk ? AttnPath::Chunked : AttnPath::Expand;
}

}  // namespace mla
