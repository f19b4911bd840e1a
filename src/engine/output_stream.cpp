// OutputStream: detokenising and stop strings of one sequence (see output_stream.h).
#include "engine/output_stream.h"

namespace mla {

OutputStream::OutputStream(const Tokenizer* tokenizer, bool skip_special_tokens, std::vector<std::string> stop)
    : stops_(std::move(stop)) {
  if (tokenizer) decoder_.emplace(*tokenizer, skip_special_tokens);
}

std::string OutputStream::push(int32_t id) {
  if (!decoder_ || finished_ || stops_.stopped()) return {};
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
