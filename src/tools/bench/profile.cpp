// The one place `mla bench` attaches a profile to the model's passes, and reads one.
#include "tools/bench/sections.h"

namespace mla::bench {

Profiled::Profiled(Model& model, ForwardProfile* to) : model_(model) {
  if (to) profiler_.emplace(*to);
  model_.set_observer(to ? &*profiler_ : nullptr);
}

Profiled::~Profiled() { model_.set_observer(nullptr); }

std::vector<std::pair<std::string, double>> per_pass_ms(const ForwardProfile& p, double passes) {
  std::vector<std::pair<std::string, double>> out;
  if (passes <= 0) return out;
  for (int i = 0; i < ForwardProfile::kParts; ++i)
    if (p.seconds[i] > 0) out.push_back({ForwardProfile::name(i), p.seconds[i] * 1e3 / passes});
  return out;
}

}  // namespace mla::bench
