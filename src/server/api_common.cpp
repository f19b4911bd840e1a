// The errors, the bounded body parse and the agent fields' lookup (see api_common.h).
#include "server/api_common.h"

namespace mla::server {

using nlohmann::json;

std::string default_error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

ApiError::ApiError(int status_, const std::string& message, std::string param_, std::string type_, std::string code_)
    : std::runtime_error(message),
      status(status_),
      type(type_.empty() ? default_error_type(status_) : std::move(type_)),
      param(std::move(param_)),
      code(std::move(code_)) {}

ContextLengthError::ContextLengthError(const std::string& message, std::string param, int64_t prompt_tokens_,
                                       int64_t limit_)
    : ApiError(400, message, std::move(param), "invalid_request_error", "context_length_exceeded"),
      prompt_tokens(prompt_tokens_),
      limit(limit_) {}

void bad_field(const std::string& param, const std::string& message) { throw ApiError(400, message, param); }

json parse_json_body(std::string_view body, size_t max_depth) {
  size_t at = 0;
  if (json_nesting_depth(body, max_depth, &at) > max_depth)
    throw ApiError(400, "the body nests arrays and objects deeper than " + std::to_string(max_depth) +
                            " levels (at byte " + std::to_string(at) + ")");
  try {
    return json::parse(body);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e999
    std::string what = e.what();        // names the byte; its "last read" may quote a long token
    if (what.size() > 200) what = what.substr(0, 197) + "...";
    throw ApiError(400, "the body is not valid JSON: " + what);
  }
}

const nlohmann::ordered_json* AgentFields::tool(const std::string& name) const {
  if (!tools.is_array()) return nullptr;
  for (const nlohmann::ordered_json& t : tools)
    if (t["function"]["name"] == name) return &t;
  return nullptr;
}

}  // namespace mla::server
