// Unit tests of the shared steps from an adapter's typed fields to the engine's request
// (server/chat_request.h), apart from any wire format: what every adapter's RequestFields become,
// and the checks every protocol shares, each naming the chat field.
#include <gtest/gtest.h>

#include <string>

#include "server/chat_request.h"
#include "tokenizer/deepseek_fixture.h"

namespace mla {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using server::ApiError, server::RequestFields, server::ToolChoice;

const Tokenizer& tokenizer() { return test::deepseek_v3_tokenizer(); }

server::ServingContext context() {
  server::ServingContext ctx;
  ctx.tokenizer = &tokenizer();
  ctx.model_name = "served";
  ctx.context_length = 64;
  ctx.chat_format.kind = ChatFormat::Kind::Jinja;
  ctx.chat_format.jinja = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}[assistant]{{ mode }}";
  ctx.chat_template_kwargs = {{"mode", "x"}, {"keep", 1}};
  return ctx;
}

RequestFields hello() {
  RequestFields f;
  f.messages = ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  return f;
}

// The param of the ApiError the fields raise ("" when they make a request).
std::string param_of(RequestFields f) {
  try {
    server::chat_request(server::Endpoint::Messages, std::move(f), context());
  } catch (const ApiError& e) {
    return e.param;
  }
  return "";
}

TEST(ChatRequest, FieldsBecomeTheEnginesRequest) {
  RequestFields f = hello();
  f.sampling.temperature = 0.5;
  f.sampling.top_k = -1;
  f.sampling.seed = 7;
  f.stop = {"END"};
  f.limits.max_tokens = 8;
  f.agent.template_kwargs = {{"mode", "y"}};
  const server::ParsedRequest p = server::chat_request(server::Endpoint::Messages, std::move(f), context());
  EXPECT_EQ(p.endpoint, server::Endpoint::Messages);
  EXPECT_EQ(p.model, "served") << "no name given: the served one";
  EXPECT_EQ(p.prompt_text, "[user]hi[assistant]y") << "the request's template variables over the server's";
  EXPECT_EQ(p.agent.template_kwargs, json({{"mode", "y"}, {"keep", 1}}));
  EXPECT_EQ(p.request.prompt, tokenizer().encode("[user]hi[assistant]y", false));
  EXPECT_FLOAT_EQ(p.request.sampling.temperature, 0.5f);
  EXPECT_EQ(p.request.sampling.top_k, 0);
  EXPECT_EQ(p.request.sampling.seed, 7u);
  EXPECT_EQ(p.request.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(p.request.max_new_tokens, 8);
  EXPECT_FALSE(p.request.eos_token_ids.empty());
  EXPECT_FALSE(p.grammar);

  // Without max_tokens, the room left; beyond it, capped where the adapter asks for that.
  const int64_t n = int64_t(p.request.prompt.size());
  EXPECT_EQ(server::chat_request(server::Endpoint::Messages, hello(), context()).request.max_new_tokens, 64 - n);
  RequestFields capped = hello();
  capped.limits.max_tokens = 1000;
  capped.limits.cap_max_tokens = true;
  EXPECT_EQ(server::chat_request(server::Endpoint::Messages, std::move(capped), context()).request.max_new_tokens,
            64 - n);
}

TEST(ChatRequest, SharedChecksNameTheChatField) {
  EXPECT_EQ(param_of(hello()), "");
  RequestFields f = hello();
  f.sampling.temperature = 3;
  EXPECT_EQ(param_of(f), "temperature");
  f = hello();
  f.sampling.top_k = -2;
  EXPECT_EQ(param_of(f), "top_k");
  f = hello();
  f.stop.assign(65, "x");
  EXPECT_EQ(param_of(f), "stop");
  f = hello();
  f.limits.max_tokens = 0;
  EXPECT_EQ(param_of(f), "max_tokens");
  f = hello();
  f.limits.max_tokens = 1000;
  EXPECT_EQ(param_of(f), "max_tokens") << "beyond the room, not capped";
  f.messages = ordered_json::array();
  EXPECT_EQ(param_of(f), "messages");
  f = hello();
  std::string words;
  for (int i = 0; i < 100; ++i) words += " word" + std::to_string(i);
  f.messages[0]["content"] = words;
  try {
    server::chat_request(server::Endpoint::Messages, std::move(f), context());
    ADD_FAILURE() << "a prompt past the context";
  } catch (const server::ContextLengthError& e) {
    EXPECT_EQ(e.param, "messages");
    EXPECT_EQ(e.limit, 64);
  }

  // The agent fields, as every adapter writes its tools.
  const ordered_json tool = {{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}};
  server::AgentFields a;
  EXPECT_THROW(server::set_tool_choice(a, {ToolChoice::Kind::Required, {}}), ApiError) << "no tools";
  a.tools = ordered_json::array({tool});
  EXPECT_NO_THROW(server::check_tools(a.tools));
  EXPECT_THROW(server::set_tool_choice(a, {ToolChoice::Kind::Named, "nope"}), ApiError);
  server::set_tool_choice(a, {ToolChoice::Kind::Named, "get_weather"});
  EXPECT_TRUE(a.forces_call());
  a.format = server::ResponseFormat::JsonObject;
  EXPECT_THROW(server::check_format_and_choice(a), ApiError);
  ordered_json bad = tool;
  bad["function"]["name"] = "a b";
  EXPECT_THROW(server::check_tools(ordered_json::array({bad})), ApiError);
  EXPECT_THROW(server::check_tools(ordered_json::array({tool, tool})), ApiError) << "a second tool of one name";
  const ordered_json not_schema = 3;
  EXPECT_THROW(server::set_json_schema(a, &not_schema, nullptr), ApiError);
}

}  // namespace
}  // namespace mla
