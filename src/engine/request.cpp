// FinishReason names and RequestResult's gathering of events (see request.h).
#include "engine/request.h"

namespace mla {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Eos: return "eos";
    case FinishReason::StopString: return "stop string";
    case FinishReason::MaxTokens: return "max tokens";
    case FinishReason::ContextLength: return "context length";
    case FinishReason::KvCacheFull: return "kv cache full";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "?";
}

void RequestResult::add(const RequestEvent& e) {
  const auto now = Clock::now();
  if (e.token >= 0) {
    tokens.push_back(e.token);
    if (!have_first_) {
      have_first_ = true;
      first_ = now;
      prompt_seconds = std::chrono::duration<double>(now - start_).count();
    }
  }
  text += e.text;
  prompt_tokens = e.prompt_tokens;
  cached_tokens = e.cached_tokens;
  if (e.finished) {
    finished = true;
    reason = e.reason;
    message = e.message;
    if (have_first_) decode_seconds = std::chrono::duration<double>(now - first_).count();
  }
}

}  // namespace mla
