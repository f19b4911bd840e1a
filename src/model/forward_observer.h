// What a forward pass shows as it runs, to the one observer installed on the model
// (Model::set_observer): the time of each part (ForwardProfiler, for `mla bench`), the states
// that `mla verify` and the golden tests compare (ForwardCapture), the attention path of each
// batch (PassLog, MLA_DEBUG=1 at the command line). The pass calls the hooks only when an
// observer is installed; a hook may read what it is shown, never change the pass.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

#include "model/moe.h"
#include "model/path_policy.h"
#include "parallel/expert_parallel.h"

namespace mla {

// The parts of a pass, in the order a layer runs them. Between begin_pass and end_pass every
// moment belongs to the part last entered.
struct ForwardProfile {
  enum Part { Embed, AttnProj, Attention, OProj, DenseMlp, Router, Experts, LmHead, Other, kParts };
  static const char* name(int part);
  // Wall time of each part, summed over passes, and the passes.
  double seconds[kParts] = {};
  int64_t passes = 0;
  // Routed experts read, summed over the MoE layers of the passes (an expert that several rows
  // of a pass chose counts once: its weights are read once), and those MoE layer passes.
  // Expert-parallel (mpirun), local_routed_experts: those of them this rank holds and ran (all
  // of them in one process).
  int64_t routed_experts = 0, local_routed_experts = 0, moe_layers = 0;
};

// What a pass is about to run: its sequences, new tokens, longest cached prefix and the
// attention path (chosen: by the policy, for AttnPath::Auto).
struct PassShape {
  int64_t sequences = 0, tokens = 0, longest_cached = 0;
  AttnPath path = AttnPath::Auto;
  bool chosen = false;
};

// The positions each query of one sequence attended in a layer (DeepSeek Sparse Attention
// models): [n, index_topk] positions with each row's count; empty where the context was dense.
struct TokenSelection {
  std::vector<int32_t> pos;
  std::vector<int64_t> count;
};

class ForwardObserver {
 public:
  virtual ~ForwardObserver() = default;
  virtual void begin_pass(const PassShape&) {}
  virtual void enter(ForwardProfile::Part) {}
  // The residual stream as transformers' output_hidden_states numbers it: 0 the embeddings,
  // l the output of layer l - 1 (l < layers), `layers` the final norm of the logits rows.
  virtual void hidden(int64_t index, std::span<const float> rows) { (void)index, (void)rows; }
  // Layer `layer`'s attention output after o_proj, [T, hidden].
  virtual void attention(int64_t layer, std::span<const float> out) { (void)layer, (void)out; }
  // A sparse-attention layer's selections, per sequence of the batch.
  virtual void selection(int64_t layer, std::span<const TokenSelection> per_sequence) {
    (void)layer, (void)per_sequence;
  }
  // A MoE layer's routing of the pass's T tokens ([T, top_k] picks) and the experts this rank holds.
  virtual void routed(std::span<const ExpertChoice> picks, parallel::ExpertRange local) { (void)picks, (void)local; }
  virtual void end_pass() {}
};

// Adds each part's wall time and the routed experts read to a ForwardProfile.
class ForwardProfiler final : public ForwardObserver {
 public:
  explicit ForwardProfiler(ForwardProfile& into) : p_(into) {}
  void begin_pass(const PassShape&) override;
  void enter(ForwardProfile::Part part) override;
  void routed(std::span<const ExpertChoice> picks, parallel::ExpertRange local) override;
  void end_pass() override;

 private:
  void close();  // the part running now ends
  ForwardProfile& p_;
  ForwardProfile::Part part_ = ForwardProfile::Other;
  bool running_ = false;
  std::chrono::steady_clock::time_point since_;
};

// Keeps what the passes show: the hidden states and attention outputs of every pass (a test or
// `mla verify` installs it around the pass it compares), the selections of each sparse layer.
class ForwardCapture final : public ForwardObserver {
 public:
  std::vector<std::vector<float>> hidden_states, attention_outputs;
  std::vector<std::vector<TokenSelection>> selections;  // per sparse layer of the last pass
  void begin_pass(const PassShape&) override;
  void hidden(int64_t index, std::span<const float> rows) override;
  void attention(int64_t layer, std::span<const float> out) override;
  void selection(int64_t layer, std::span<const TokenSelection> per_sequence) override;
};

// One line per pass on a stream: sequences, new tokens, longest cached prefix, the path.
class PassLog final : public ForwardObserver {
 public:
  explicit PassLog(std::FILE* to = stderr) : to_(to) {}
  void begin_pass(const PassShape& p) override;

 private:
  std::FILE* to_;
};

}  // namespace mla
