// The text of one sequence as its tokens arrive: the tokenizer's StreamDecoder (bytes of an
// incomplete UTF-8 character wait for the rest) then the stop strings (text that could begin a
// stop string waits until it is decided). push() gives the text now safe to emit; finish() is
// the end flush, the same for every way a sequence ends (EOS, token limit, context, full
// cache, cancellation): what the decoder and the stop strings still hold, unless a stop
// string matched. Without a tokenizer there is no text and no stop string.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/generation_config.h"
#include "tokenizer/tokenizer.h"

namespace mla {

class OutputStream {
 public:
  OutputStream() = default;
  // The tokenizer, if given, must outlive the stream.
  // keep_special: special tokens shown even when skip_special_tokens is set.
  OutputStream(const Tokenizer* tokenizer, bool skip_special_tokens, std::vector<std::string> stop,
               std::vector<int32_t> keep_special = {});

  // An output token (not an EOS id): the text it completes. Empty once stopped().
  std::string push(int32_t id);
  // A stop string matched; later tokens give no text.
  bool stopped() const { return stops_.stopped(); }
  const std::string& matched_stop() const { return stops_.matched(); }  // the stop string, once stopped()
  // The end: the text still held back; empty after a stop or a first finish().
  std::string finish();

 private:
  std::optional<StreamDecoder> decoder_;  // keeps special tokens; push() skips them
  const Tokenizer* tokenizer_ = nullptr;
  bool skip_special_ = false;
  std::vector<int32_t> keep_special_;
  StopStrings stops_;
  bool finished_ = false;
};

}  // namespace mla
