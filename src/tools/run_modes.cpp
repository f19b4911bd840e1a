#include "tools/run_modes.h"

#include <stdexcept>

namespace mla {

RunMode RunMode::parse(const std::string& s) {
  RunMode m;
  if (s == "prefill") return m;
  if (s == "decode") { m.kind = Decode; return m; }
  if (s.rfind("extend:", 0) == 0) {
    m.kind = Extend;
    try {
      size_t used = 0;
      m.prefix = std::stoll(s.substr(7), &used);
      if (used != s.size() - 7 || m.prefix < 0) throw std::invalid_argument("");
    } catch (const std::exception&) {
      throw std::invalid_argument("bad mode '" + s + "': extend:P needs a non-negative integer P");
    }
    return m;
  }
  throw std::invalid_argument("unknown mode '" + s + "' (prefill, decode, extend:P)");
}

std::string RunMode::name() const {
  return kind == Prefill ? "prefill" : kind == Decode ? "decode" : "extend:" + std::to_string(prefix);
}

std::vector<float> run_logits(Model& model, const std::vector<int32_t>& ids, const RunOptions& opt) {
  const ModelConfig& c = model.config();
  const int64_t n = int64_t(ids.size());
  if (n == 0) throw std::invalid_argument("no token ids given");
  if (opt.mode.kind == RunMode::Extend && opt.mode.prefix > n)
    throw std::invalid_argument("extend:" + std::to_string(opt.mode.prefix) + " is longer than the " +
                                std::to_string(n) + " ids given");
  LatentPool pool = model.make_pool(pages_for_tokens(n, opt.page_size), opt.page_size, opt.kv_dtype);
  PageTable seq;
  // The pieces fed to the model, in order.
  std::vector<std::pair<int64_t, int64_t>> steps;
  switch (opt.mode.kind) {
    case RunMode::Prefill: steps.push_back({0, n}); break;
    case RunMode::Decode:
      for (int64_t i = 0; i < n; ++i) steps.push_back({i, i + 1});
      break;
    case RunMode::Extend:
      if (opt.mode.prefix > 0) steps.push_back({0, opt.mode.prefix});
      if (opt.mode.prefix < n) steps.push_back({opt.mode.prefix, n});
      break;
  }
  std::vector<float> all(size_t(n * c.vocab_size)), out;
  for (size_t i = 0; i < steps.size(); ++i) {
    auto [b, e] = steps[i];
    ForwardOptions fo;
    fo.path = opt.path;
    fo.policy = opt.policy;
    fo.context = opt.context;
    SeqSlice s{&seq, std::span<const int32_t>(ids.data() + b, size_t(e - b))};
    {
      ScopedObserver watch(model, i == 0 && opt.first_pass ? opt.first_pass : model.observer());
      model.forward(std::span<SeqSlice>(&s, 1), pool, fo, out);
    }
    std::copy(out.begin(), out.end(), all.begin() + b * c.vocab_size);
  }
  return all;
}

}  // namespace mla
