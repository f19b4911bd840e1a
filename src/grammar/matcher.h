// Constrained decoding at run time: which tokens of the vocabulary may come next under a grammar.
//
// Three objects, from the longest-lived to the shortest:
//  - TokenTable, once per tokenizer: the bytes of every id, which ids may never appear inside a
//    grammar (special tokens, vocabulary gaps, empty tokens), the stop ids (EOS) allowed exactly
//    when the grammar can end, and all allowed ids sorted by their bytes with the length of the
//    prefix each shares with the previous one — a token trie laid out flat, so a walk over it
//    advances a shared prefix once and skips a dead prefix's whole subtree.
//  - CompiledGrammar, once per grammar (share it between requests with the same schema): the
//    grammar, its FOLLOW sets, and per terminal position (lazily, thread-safe) the tokens
//    accepted there whatever the stack below says, and the short list of tokens that depend on
//    it (those that leave the rule into an unknown context), as xgrammar does.
//  - Matcher, once per request: the set of parse stacks (a pushdown automaton over bytes, the
//    stacks persistent and shared), the per-token history for rollback, the mask of a step.
//
// A step: fill_mask() ORs, for each stack, the precomputed accepted set of its top position and
// checks only the context-dependent tokens against the real stack.
//
// Per decode step of a constrained sequence, the engine:
//   1. fill_mask(mask) — it reads only the matcher, so it may run while the forward pass runs;
//   2. apply_mask(logits_row, mask) on the raw logits, before Sampler::sample (whose penalties
//      keep -inf at -inf and whose filters drop non-finite logits: temperature, top-k, top-p and
//      min-p then act on the allowed tokens only, greedy picks the best allowed one);
//   3. accept_token(sampled) — true for any id the mask allowed; then Sampler::add_output_token;
//   4. finish with reason "stop" when the sampled id is a stop id (or is_done()).
// Speculative decoding: for k draft tokens, fill_mask / check / accept_token each in turn
// (a draft token outside its mask ends the accepted run), and rollback(n) the rejected ones.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"

namespace mla {
class Tokenizer;
}

namespace mla::grammar {

class TokenTable {
 public:
  // Per id in [0, vocab_size): its bytes, or nullopt for an id never allowed inside the
  // grammar. stop_ids (EOS) are allowed exactly where the grammar can end, whatever their bytes.
  TokenTable(std::vector<std::optional<std::string>> bytes, std::vector<int32_t> stop_ids);

  // From a tokenizer: vocab_size is the model's (config vocab_size, may exceed the tokenizer's:
  // those ids and any gap are never allowed); special tokens are never allowed; stop_ids
  // defaults to the tokenizer's EOS.
  static std::shared_ptr<const TokenTable> from_tokenizer(const Tokenizer& tokenizer, size_t vocab_size,
                                                          std::vector<int32_t> stop_ids = {});

  size_t vocab_size() const { return allowed_.size(); }
  size_t mask_words() const { return (vocab_size() + 31) / 32; }
  bool allowed(int32_t id) const { return id >= 0 && size_t(id) < allowed_.size() && allowed_[size_t(id)]; }
  bool is_stop(int32_t id) const;
  std::string_view bytes(int32_t id) const {
    return std::string_view(data_).substr(offset_[size_t(id)], offset_[size_t(id) + 1] - offset_[size_t(id)]);
  }
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }

  // The flat trie: allowed, non-stop ids sorted by bytes; lcp[i] = common prefix with id i-1.
  const std::vector<int32_t>& sorted_ids() const { return sorted_; }
  const std::vector<uint16_t>& sorted_lcp() const { return lcp_; }
  // The trie's subtree ends, to jump over a dead prefix (see build_skips in matcher.cpp).
  const std::vector<uint32_t>& skip_base() const { return skip_base_; }
  const std::vector<uint32_t>& skip_ends() const { return skip_ends_; }

 private:
  std::string data_;
  std::vector<uint32_t> offset_;  // vocab_size + 1
  std::vector<uint8_t> allowed_;
  std::vector<int32_t> stop_ids_;
  std::vector<int32_t> sorted_;
  std::vector<uint16_t> lcp_;
  std::vector<uint32_t> skip_base_, skip_ends_;
};

class CompiledGrammar {
 public:
  // tokens may be null: then only the byte-level calls of Matcher work (no fill_mask).
  CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenTable> tokens);
  ~CompiledGrammar();

  const Grammar& grammar() const { return grammar_; }
  const TokenTable* tokens() const { return tokens_.get(); }

  // Computes the per-position token sets of every terminal position now (they are otherwise
  // computed on first use). Returns the number of positions.
  size_t precompute_all() const;

  // Tokens at a terminal position: accepted whatever the stack below (a bitmask when dense, else
  // a sorted id list) and the ones to check against the real stack (sorted by bytes, with lcp).
  struct PositionTokens {
    std::vector<uint32_t> accept_mask;
    std::vector<int32_t> accept_ids;
    std::vector<int32_t> dependent_ids;
    std::vector<uint16_t> dependent_lcp;
    std::vector<uint32_t> dependent_skip_base, dependent_skip_ends;
  };
  const PositionTokens& position_tokens(int32_t pos) const;
  // Distinct token sets held (positions with equal sets share one).
  size_t distinct_position_sets() const;

  // Static analysis used by the precomputation (public for tests and tools).
  const ByteSet& follow(int32_t rule) const { return follow_[size_t(rule)]; }
  // The one place rule is called from (position of the kRef), or -1 when it has several
  // (self-calls in tail position do not count; the root counts its start as one).
  int32_t single_site(int32_t rule) const { return single_site_[size_t(rule)]; }

 private:
  Grammar grammar_;
  std::shared_ptr<const TokenTable> tokens_;
  std::vector<ByteSet> follow_;
  std::vector<int32_t> single_site_;
  std::vector<int32_t> exit_site_;
  mutable std::mutex mutex_;
  mutable std::vector<std::shared_ptr<const PositionTokens>> positions_;
  // Equal token sets are stored once (the counts of a long string bound far from the bound).
  mutable std::unordered_multimap<uint64_t, std::shared_ptr<const PositionTokens>> distinct_;
};

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar);
  ~Matcher();
  Matcher(Matcher&&) noexcept;
  Matcher& operator=(Matcher&&) noexcept;

  // Sets bit id of mask (word id / 32, bit id % 32) for every token allowed next and clears the
  // others; mask has TokenTable::mask_words() words. Stop ids are set exactly when can_end().
  void fill_mask(std::span<uint32_t> mask);

  // Advances by a token; false (and no change) when the token is not allowed here. A stop id is
  // accepted when can_end(), and then the matcher is done.
  bool accept_token(int32_t id);
  // Advances by raw bytes (all or nothing); false when they leave the language.
  bool accept_bytes(std::string_view bytes);

  bool can_end() const;   // the bytes so far are a complete sentence of the grammar
  bool is_done() const;   // a stop id was accepted, or the grammar ended and nothing can follow
  // Undoes the last n accept_token / accept_bytes calls (n <= num_accepted()).
  void rollback(size_t n);
  size_t num_accepted() const { return history_.size() - 1; }
  void reset();

  const CompiledGrammar& compiled() const { return *grammar_; }

  struct Impl;

 private:
  std::shared_ptr<const CompiledGrammar> grammar_;
  std::unique_ptr<Impl> impl_;
  struct Step {
    std::vector<int32_t> stacks;  // stack ids; -1 = the empty stack (the grammar has ended)
    bool terminated = false;
  };
  std::vector<Step> history_;
};

// Sets logits[i] to -infinity where bit i of mask is clear (i < logits.size()).
void apply_mask(std::span<float> logits, std::span<const uint32_t> mask);

}  // namespace mla::grammar
