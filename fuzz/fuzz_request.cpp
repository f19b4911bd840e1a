// An HTTP request body from the fuzzer's bytes (the first byte picks the endpoint) through
// what the server does with it: the bounded parse (nesting depth checked before anything
// recursive), then parse_request with a byte-level tokenizer, DeepSeek-V3's tool-call and
// reasoning parsers and the grammars of constrained outputs (tools, response_format). Every
// input is accepted or raises ApiError (a 4xx) or RequestError (a 400); nothing else may
// escape (it would be a 500), and an accepted request fits its limits.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>

#include "engine/generation_config.h"
#include "fuzz_util.h"
#include "server/openai.h"
#include "server/structured.h"
#include "tokenizer/tokenizer.h"

namespace {

struct Context {
  mla::Tokenizer tokenizer;
  mla::GenerationConfig generation;
  mla::server::ServingContext ctx;
  std::unique_ptr<mla::server::StructuredOutputs> structured;
  Context() : tokenizer(load()) {
    ctx.tokenizer = &tokenizer;
    ctx.generation = &generation;
    ctx.model_name = "tiny";
    ctx.context_length = 256;
    ctx.max_sequence_tokens = 128;
    ctx.vocab_size = int64_t(tokenizer.vocab_size());
    ctx.tool_parser = "deepseek_v3";
    ctx.reasoning_parser = "deepseek_r1";
    ctx.chat_format = mla::chat_format_for("deepseek_v3", tokenizer.chat_template());
    structured = std::make_unique<mla::server::StructuredOutputs>(tokenizer, ctx.vocab_size);
    ctx.structured = structured.get();
  }
  static mla::Tokenizer load() {
    const std::string dir = (mla::fuzz::temp_dir() / "tok").string();
    mla::Tokenizer::write_byte_level_tokenizer(dir, 512);
    return mla::Tokenizer::load(dir);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Context c;
  if (size < 1 || size > (256 << 10)) return 0;
  const auto endpoint = data[0] & 1 ? mla::server::Endpoint::ChatCompletions : mla::server::Endpoint::Completions;
  std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    nlohmann::json j = mla::server::parse_json_body(body);
    mla::server::ParsedRequest p = mla::server::parse_request(endpoint, j, c.ctx, body);
    const int64_t n = int64_t(p.request.prompt.size());
    if (n < 1 || n > c.ctx.max_sequence_tokens) __builtin_trap();
    if (p.request.max_new_tokens < 0 || p.request.max_new_tokens > c.ctx.max_sequence_tokens - n) __builtin_trap();
    try {
      p.request.sampling.validate();  // the engine's check (a 400 from submit)
    } catch (const std::invalid_argument&) {
    }
    for (int32_t id : p.request.prompt)
      if (id < 0 || size_t(id) >= c.tokenizer.vocab_size()) __builtin_trap();
  } catch (const mla::server::ApiError& e) {
    if (e.status < 400 || e.status > 499) __builtin_trap();
  } catch (const mla::RequestError&) {
  }
  return 0;
}
