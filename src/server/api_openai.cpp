// Chat completions and completions over the shared request path (see api_openai.h).
#include "server/api_openai.h"

#include <chrono>
#include <vector>

#include "server/choice.h"
#include "server/openai.h"

namespace mla::server {

using nlohmann::json;

namespace {

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class OpenAiExchange : public Exchange {
 public:
  OpenAiExchange(ParsedRequest parsed, const Tokenizer& tokenizer)
      : id_(new_response_id(parsed.endpoint)), created_(unix_time()) {
    request = std::move(parsed);
    for (int64_t i = 0; i < request.agent.n; ++i) choices_.emplace_back(request, tokenizer, int(i));
  }

  void add(int choice, const RequestEvent& e) override { choices_[size_t(choice)].add(e); }

  json body(const Usage& usage) override {
    json list = json::array();
    for (const ChoiceBuilder& c : choices_) list.push_back(c.choice());
    json out = completion_response(request, id_, created_, "", "stop", usage);
    out["choices"] = list;
    return out;
  }

  // Chat streams open with each choice's role.
  std::string stream_begin(const Usage&) override {
    std::string out;
    if (request.endpoint != Endpoint::ChatCompletions) return out;
    for (size_t i = 0; i < choices_.size(); ++i)
      out += chunk({{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                    {"finish_reason", nullptr}});
    return out;
  }

  std::string stream_event(int choice, const RequestEvent& e) override {
    std::string out;
    for (json& c : choices_[size_t(choice)].stream(e)) out += chunk(std::move(c));
    return out;
  }

  std::string stream_end(const Usage& usage) override {
    std::string out;
    if (request.include_usage) out += sse_event(usage_chunk(request, id_, created_, usage));
    return out + kSseDone;
  }

  std::string stream_error(const ErrorInfo& e, const Usage&) override {
    return sse_event(server::error_body(e.status, e.message, e.param, e.type, e.code)) + kSseDone;
  }

  int64_t completion_tokens() const override {
    int64_t n = 0;
    for (const ChoiceBuilder& c : choices_) n += c.completion_tokens();
    return n;
  }

 private:
  std::string chunk(json choice) const {
    json c = stream_chunk(request, id_, created_, "", nullptr);
    c["choices"] = json::array({std::move(choice)});
    return sse_event(c);
  }

  std::string id_;
  int64_t created_;
  std::vector<ChoiceBuilder> choices_;
};

}  // namespace

std::unique_ptr<Exchange> OpenAiProtocol::parse(const json& body, std::string_view raw) {
  return std::make_unique<OpenAiExchange>(parse_request(endpoint_, body, ctx_, raw), *ctx_.tokenizer);
}

json OpenAiProtocol::error_body(const ErrorInfo& e) const {
  return server::error_body(e.status, e.message, e.param, e.type, e.code);
}

}  // namespace mla::server
