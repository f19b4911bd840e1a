// A chat template and its messages from the fuzzer's bytes: the template before a
// "\n#MESSAGES#\n" line, a JSON list of messages after it (or a fixed conversation). Parsing
// and rendering either give text or throw ChatTemplateError; never another exception, never UB.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "chat/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (64 << 10)) return 0;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  nlohmann::json messages = {{{"role", "system"}, {"content", "Be brief."}},
                             {{"role", "user"}, {"content", "Hi"}},
                             {{"role", "assistant"}, {"content", "Hello."}},
                             {{"role", "user"}, {"content", "Bye"}}};
  const size_t cut = in.find("\n#MESSAGES#\n");
  if (cut != std::string_view::npos) {
    const std::string_view text = in.substr(cut + 12);
    nlohmann::json m = mla::fuzz::shallow_json(text) ? nlohmann::json::parse(text, nullptr, false) : nlohmann::json();
    if (!m.is_discarded() && !m.is_null()) messages = std::move(m);
    in = in.substr(0, cut);
  }
  try {
    (void)mla::render_chat_template(std::string(in), messages, true,
                                    {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  } catch (const mla::ChatTemplateError&) {
  }
  return 0;
}
