// Constrained decoding through Request::logits_processor: a grammar matcher (grammar/matcher.h)
// per sequence that, at each step, first advances by the tokens sampled since its last call,
// then sets every logit the grammar does not allow next to -infinity. It runs before the
// sampler, so before the penalties and the temperature; the stop ids of the grammar's token
// table (the request's EOS ids) are allowed exactly when the grammar can end, and only they
// once it has ended.
//
// activate_after: the mask starts once the output's text ends with it (e.g. "</think>": a
// reasoning model thinks freely, then answers under the grammar); empty: from the first token.
// Recompute after preemption does not call the processor again, so each sampled token is
// accepted once. The processor follows the token list it is given: tokens that are gone from
// it since the last call (speculative drafts it saw and the engine rejected) are rolled back
// from the matcher (Matcher::rollback) before the new ones are accepted. A token the grammar refuses (impossible unless the engine sampled outside the
// mask) throws: the sequence ends with an error.
#pragma once
#include <memory>
#include <string>

#include "engine/request.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace mla {

// prompt_len: the request's prompt length (the processor sees prompt + output). The tokenizer
// (for activate_after) and the grammar must outlive the processor's sequence.
LogitsProcessor grammar_processor(std::shared_ptr<const grammar::CompiledGrammar> grammar, size_t prompt_len,
                                  const Tokenizer* tokenizer = nullptr, std::string activate_after = {});

}  // namespace mla
