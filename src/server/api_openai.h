// OpenAI's chat completions (POST /v1/chat/completions) and legacy completions
// (POST /v1/completions) as Protocols (protocol.h): the request is parse_request's; each choice
// is a ChoiceBuilder; streams are `data: {chunk}` events closed by `data: [DONE]`.
#pragma once
#include "server/protocol.h"

namespace mla::server {

class OpenAiProtocol : public Protocol {
 public:
  // endpoint: Completions or ChatCompletions. ctx must outlive the protocol.
  OpenAiProtocol(Endpoint endpoint, const ServingContext& ctx) : endpoint_(endpoint), ctx_(ctx) {}
  const char* name() const override { return endpoint_ == Endpoint::Completions ? "completions" : "chat_completions"; }
  std::unique_ptr<Exchange> parse(const nlohmann::json& body, std::string_view raw) override;
  nlohmann::json error_body(const ErrorInfo& e) const override;

 private:
  Endpoint endpoint_;
  const ServingContext& ctx_;
};

}  // namespace mla::server
