#include "model/forward_observer.h"

#include <algorithm>

namespace mla {

const char* ForwardProfile::name(int part) {
  static const char* const names[kParts] = {"embedding", "attention projections", "attention", "o_proj", "dense mlp",
                                            "router",    "experts (shared and routed)", "lm_head", "other"};
  return part >= 0 && part < kParts ? names[part] : "?";
}

// ---- ForwardProfiler ----

void ForwardProfiler::close() {
  if (!running_) return;
  const auto now = std::chrono::steady_clock::now();
  p_.seconds[part_] += std::chrono::duration<double>(now - since_).count();
  since_ = now;
}

void ForwardProfiler::begin_pass(const PassShape&) {
  running_ = true;
  part_ = ForwardProfile::Other;
  since_ = std::chrono::steady_clock::now();
}

void ForwardProfiler::enter(ForwardProfile::Part part) {
  close();
  part_ = part;
}

void ForwardProfiler::routed(std::span<const ExpertChoice> picks, parallel::ExpertRange local) {
  std::vector<int64_t> seen;
  seen.reserve(picks.size());
  for (const ExpertChoice& c : picks) seen.push_back(c.expert);
  std::sort(seen.begin(), seen.end());
  seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  p_.routed_experts += int64_t(seen.size());
  p_.local_routed_experts += std::count_if(seen.begin(), seen.end(), [&](int64_t e) { return local.has(e); });
  p_.moe_layers++;
}

void ForwardProfiler::end_pass() {
  close();
  running_ = false;
  p_.passes++;
}

// ---- ForwardCapture ----

void ForwardCapture::begin_pass(const PassShape&) {
  hidden_states.clear();
  attention_outputs.clear();
  selections.clear();
}

void ForwardCapture::hidden(int64_t index, std::span<const float> rows) {
  if (int64_t(hidden_states.size()) <= index) hidden_states.resize(size_t(index + 1));
  hidden_states[size_t(index)].assign(rows.begin(), rows.end());
}

void ForwardCapture::attention(int64_t layer, std::span<const float> out) {
  if (int64_t(attention_outputs.size()) <= layer) attention_outputs.resize(size_t(layer + 1));
  attention_outputs[size_t(layer)].assign(out.begin(), out.end());
}

void ForwardCapture::selection(int64_t, std::span<const TokenSelection> per_sequence) {
  selections.emplace_back(per_sequence.begin(), per_sequence.end());
}

// ---- PassLog ----

void PassLog::begin_pass(const PassShape& p) {
  std::fprintf(to_, "[mla] batch of %lld sequences, %lld new tokens, longest cached prefix %lld: %s%s\n",
               (long long)p.sequences, (long long)p.tokens, (long long)p.longest_cached, attn_path_name(p.path),
               p.chosen ? " (auto)" : "");
}

}  // namespace mla
