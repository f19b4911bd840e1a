// A grammar mask as a logits processor (see grammar_processor.h).
#include "engine/grammar_processor.h"

#include <cmath>
#include <stdexcept>
#include <vector>

namespace mla {

namespace {

struct GrammarState {
  grammar::Matcher matcher;
  size_t prompt_len;
  const Tokenizer* tokenizer;
  std::string activate_after;
  bool active;
  std::string tail;  // the output's last bytes before activation
  std::vector<uint32_t> mask;
  // Each output token accounted for: whether the matcher accepted it, and the activation state
  // before it (to restore when it is rolled back).
  struct Seen {
    int32_t id;
    bool matched, active_before;
    std::string tail_before;
  };
  std::vector<Seen> seen;

  GrammarState(std::shared_ptr<const grammar::CompiledGrammar> g, size_t prompt, const Tokenizer* t, std::string after)
      : matcher(std::move(g)), prompt_len(prompt), tokenizer(t), activate_after(std::move(after)),
        active(activate_after.empty()) {}

  // Brings the state to the output tokens[prompt_len ..]: tokens no longer there (rejected
  // speculative drafts) are rolled back, new ones accepted.
  void advance(std::span<const int32_t> tokens) {
    const size_t n_out = tokens.size() > prompt_len ? tokens.size() - prompt_len : 0;
    size_t common = 0;
    while (common < seen.size() && common < n_out && seen[common].id == tokens[prompt_len + common]) ++common;
    while (seen.size() > common) {
      Seen& x = seen.back();
      if (x.matched) matcher.rollback(1);
      active = x.active_before;
      if (!active) tail = std::move(x.tail_before);
      seen.pop_back();
    }
    for (size_t i = prompt_len + seen.size(); i < tokens.size(); ++i) {
      const int32_t id = tokens[i];
      Seen x{id, active, active, active ? std::string() : tail};
      if (active) {
        if (!matcher.accept_token(id))
          throw std::runtime_error("grammar: token " + std::to_string(id) + " is not allowed here");
        seen.push_back(std::move(x));
        continue;
      }
      if (tokenizer) tail += tokenizer->token_bytes(id);
      if (tail.size() >= activate_after.size() &&
          tail.compare(tail.size() - activate_after.size(), activate_after.size(), activate_after) == 0)
        active = true;
      else if (tail.size() > 4 * activate_after.size())
        tail.erase(0, tail.size() - activate_after.size());
      seen.push_back(std::move(x));
    }
  }
};

}  // namespace

LogitsProcessor grammar_processor(std::shared_ptr<const grammar::CompiledGrammar> grammar, size_t prompt_len,
                                  const Tokenizer* tokenizer, std::string activate_after) {
  if (!grammar || !grammar->tokens()) throw std::invalid_argument("grammar_processor: a grammar with a token table");
  auto st = std::make_shared<GrammarState>(std::move(grammar), prompt_len, tokenizer, std::move(activate_after));
  return [st](std::span<float> logits, std::span<const int32_t> tokens) {
    st->advance(tokens);
    if (!st->active) return;
    st->mask.assign(st->matcher.compiled().tokens()->mask_words(), 0);
    st->matcher.fill_mask(st->mask);
    grammar::apply_mask(logits, st->mask);
    // Rows past the table (none when it was built for the model's vocabulary) are not allowed.
    for (size_t i = st->matcher.compiled().tokens()->vocab_size(); i < logits.size(); ++i) logits[i] = -INFINITY;
    bool any = false;
    for (uint32_t w : st->mask) any = any || w != 0;
    if (!any) throw std::runtime_error("grammar: no token may follow (the grammar ended without a stop token)");
  };
}

}  // namespace mla
