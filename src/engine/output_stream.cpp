// OutputStream: detokenising and stop strings of one sequence (see output_stream.h).
#include "engine/output_stream.h"

#include <algorithm>

namespace mla {

OutputStream::OutputStream(const Tokenizer* tokenizer, bool skip_special_tokens, std::vector<std::string> stop,
                           std::vector<int32_t> keep_special)
    : tokenizer_(tokenizer),
      skip_special_(skip_special_tokens),
      keep_special_(std::move(keep_special)),
      stops_(std::move(stop)) {
  if (tokenizer) decoder_.emplace(*tokenizer, false);
}

std::string OutputStream::push(int32_t id) {
  if (!decoder_ || finished_ || stops_.stopped()) return {};
  if (skip_special_ && tokenizer_->is_special(id) &&
      std::find(keep_special_.begin(), keep_special_.end(), id) == keep_special_.end())
    return {};
  return stops_.push(decoder_->push(id));
}

std::string OutputStream::finish() {
  if (finished_) return {};
  finished_ = true;
  if (!decoder_ || stops_.stopped()) return {};
  std::string text = stops_.push(decoder_->flush());
  if (!stops_.stopped()) text += stops_.flush();
  return text;
}

}  // namespace mla
