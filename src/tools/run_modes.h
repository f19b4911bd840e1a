// Teacher-forced runs of one token sequence through the model in the ways a serving engine
// feeds it: all at once (prefill), one token at a time on top of the cache (decode), or a
// prefix then the rest (extend). `mla logits`, `mla verify` and the tests use these.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"

namespace mla {

struct RunMode {
  enum Kind { Prefill, Decode, Extend } kind = Prefill;
  int64_t prefix = 0;  // Extend: tokens prefilled first
  static RunMode parse(const std::string& s);  // prefill | decode | extend:P
  std::string name() const;
};

struct RunOptions {
  RunMode mode;
  AttnPath path = AttnPath::Auto;  // Auto: the policy's choice per forward pass
  PathPolicy policy;
  KvDType kv_dtype = KvDType::F32;
  int64_t page_size = 64;
  ForwardObserver* first_pass = nullptr;  // installed on the model for the first forward pass
  const cpu::Context* context = nullptr;  // the CPU context of the passes; null: the model's
};

// Logits at every position, [ids.size(), vocab].
std::vector<float> run_logits(Model& model, const std::vector<int32_t>& ids, const RunOptions& opt);

}  // namespace mla
