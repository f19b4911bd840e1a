// End-to-end tests of the OpenAI-compatible server on the deepseek-v3-tiny fixture with a
// byte-level tokenizer: the server runs in-process on 127.0.0.1 (a free port) and httplib's
// client sends completions, chat completions, streamed requests (checking the SSE framing),
// concurrent requests and bad requests (OpenAI's error object). A client that closes its
// connection, streamed or not, has its request cancelled and its pages back within bounded
// time. Speculative decoding under concurrent load loses and repeats no token. A last test runs
// the `mla serve` binary and stops it with SIGTERM.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "engine/generation_config.h"
#include "engine/engine.h"
#include "server/openai.h"
#include "server/server.h"
#include "server/serve_process.h"
#include "test_util.h"
#include "chat/chat_template.h"
#include "tokenizer/tokenizer.h"


namespace mla {
namespace {

using nlohmann::json;

class ServerTest : public ::testing::Test {
 protected:
  struct Shared {
    std::unique_ptr<Model> model;
    std::unique_ptr<test::TempDir> dir;
    std::unique_ptr<Tokenizer> tokenizer;
    GenerationConfig generation;
    std::unique_ptr<Engine> engine;
    std::unique_ptr<server::Server> server;
    std::thread thread;
    int port = 0;
  };
  static inline Shared* s = nullptr;

  static void SetUpTestSuite() {
    s = new Shared;
    s->model = Model::load(test::fixture("deepseek-v3-tiny"));
    s->dir = std::make_unique<test::TempDir>("server-tok");
    Tokenizer::write_byte_level_tokenizer(s->dir->str(), 512);
    s->tokenizer = std::make_unique<Tokenizer>(Tokenizer::load(s->dir->str()));
    s->generation = GenerationConfig::load(test::fixture("deepseek-v3-tiny"), s->model->config());
    EngineOptions eo;
    eo.kv_pages = 48;
    eo.page_size = 16;
    eo.kv_dtype = KvDType::F32;
    eo.max_batch_tokens = 64;
    s->engine = std::make_unique<Engine>(*s->model, s->tokenizer.get(), eo);
    s->engine->start();
    server::ServerOptions opt;
    opt.host = "127.0.0.1";
    opt.port = 0;
    opt.model_name = "tiny";
    // The byte-level tokenizer spends a token per byte: the tools' system-prompt section (some
    // 500 bytes, chat_request.h) would not fit the fixture's 256 positions. The section is
    // tested in AnthropicApiRequest.ToolsReachATemplateWithoutThem and by the agent clients.
    opt.tool_prompt = false;
    s->server = std::make_unique<server::Server>(*s->engine, *s->tokenizer, s->generation, s->model->config(), opt);
    s->port = s->server->bind();
    s->thread = std::thread([] { s->server->listen(); });
  }
  static void TearDownTestSuite() {
    s->server->stop();
    s->thread.join();
    s->engine->stop();
    delete s;
    s = nullptr;
  }

  static httplib::Client client() {
    httplib::Client c("127.0.0.1", s->port);
    c.set_read_timeout(120, 0);
    return c;
  }
  static httplib::Result post(const std::string& path, const json& body) {
    return client().Post(path.c_str(), body.dump(), "application/json");
  }
  // The events of an SSE body; checks the framing: "data: ...\n\n" blocks, the last [DONE].
  static std::vector<json> sse_events(const std::string& body) {
    std::vector<json> out;
    size_t pos = 0;
    bool done = false;
    while (pos < body.size()) {
      size_t end = body.find("\n\n", pos);
      EXPECT_NE(end, std::string::npos) << "an event without its blank line";
      if (end == std::string::npos) break;
      std::string ev = body.substr(pos, end - pos);
      pos = end + 2;
      EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
      EXPECT_FALSE(done) << "an event after [DONE]";
      std::string data = ev.substr(6);
      if (data == "[DONE]") {
        done = true;
        continue;
      }
      out.push_back(json::parse(data));
    }
    EXPECT_TRUE(done) << "no data: [DONE]";
    return out;
  }
  static void expect_error(const httplib::Result& r, int status, const std::string& param = {}) {
    ASSERT_TRUE(r) << "no response";
    EXPECT_EQ(r->status, status) << r->body;
    json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
    EXPECT_TRUE(j["error"]["type"].is_string());
    EXPECT_TRUE(j["error"].contains("param") && j["error"].contains("code"));
    if (!param.empty()) {
      EXPECT_EQ(j["error"]["param"], param) << r->body;
    }
  }
  // The reference: the engine's own greedy output for these prompt tokens.
  static RequestResult direct(const std::vector<int32_t>& prompt, int64_t max_new, std::vector<std::string> stop = {}) {
    Request r;
    r.prompt = prompt;
    r.sampling.temperature = 0;
    r.max_new_tokens = max_new;
    r.stop = std::move(stop);
    r.eos_token_ids = s->generation.eos_token_ids;
    if (s->tokenizer->eos_id() >= 0) r.eos_token_ids.push_back(s->tokenizer->eos_id());
    return s->engine->generate(r);
  }
};

TEST_F(ServerTest, CompletionMatchesEngine) {
  auto r = post("/v1/completions", {{"model", "tiny"}, {"prompt", "The cat sat"}, {"max_tokens", 10}, {"temperature", 0}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_NE(r->get_header_value("Content-Type").find("application/json"), std::string::npos);
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  ASSERT_EQ(j["choices"].size(), 1u);
  auto ref = direct(s->tokenizer->encode("The cat sat", true), 10);
  EXPECT_EQ(j["choices"][0]["text"], ref.text);
  EXPECT_EQ(j["choices"][0]["finish_reason"], server::openai_finish_reason(ref.reason));
  EXPECT_EQ(j["usage"]["prompt_tokens"], int64_t(s->tokenizer->encode("The cat sat", true).size()));
  EXPECT_EQ(j["usage"]["completion_tokens"], int64_t(ref.tokens.size()));
  EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int64_t>() + int64_t(ref.tokens.size()));

  // Token ids as the prompt give the same completion.
  json ids = s->tokenizer->encode("The cat sat", true);
  auto r2 = post("/v1/completions", {{"prompt", ids}, {"max_tokens", 10}, {"temperature", 0}});
  ASSERT_TRUE(r2);
  ASSERT_EQ(r2->status, 200) << r2->body;
  EXPECT_EQ(json::parse(r2->body)["choices"][0]["text"], ref.text);
}

TEST_F(ServerTest, SeededSamplingRepeats) {
  json body = {{"prompt", "Once upon"}, {"max_tokens", 12}, {"temperature", 0.9}, {"top_p", 0.95},
               {"top_k", 50},         {"min_p", 0.01},     {"seed", 1234},      {"presence_penalty", 0.3},
               {"frequency_penalty", 0.2}, {"repetition_penalty", 1.1}};
  auto a = post("/v1/completions", body), b = post("/v1/completions", body);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a->status, 200) << a->body;
  EXPECT_EQ(json::parse(a->body)["choices"][0]["text"], json::parse(b->body)["choices"][0]["text"]);
}

TEST_F(ServerTest, StopStringEndsWithStop) {
  auto prompt = s->tokenizer->encode("Hello world", true);
  auto ref = direct(prompt, 24);
  ASSERT_GE(ref.text.size(), 6u);
  // Three ASCII bytes from the second half (a cut through a UTF-8 character would not be JSON).
  std::string stop;
  for (size_t i = ref.text.size() / 2; i + 3 <= ref.text.size() && stop.empty(); ++i)
    if ((ref.text[i] & 0x80) == 0 && (ref.text[i + 1] & 0x80) == 0 && (ref.text[i + 2] & 0x80) == 0)
      stop = ref.text.substr(i, 3);
  ASSERT_FALSE(stop.empty()) << "no ASCII run in " << ref.text;
  auto r = post("/v1/completions", {{"prompt", "Hello world"}, {"max_tokens", 24}, {"temperature", 0}, {"stop", stop}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["text"], ref.text.substr(0, ref.text.find(stop)));
}

TEST_F(ServerTest, ChatCompletionUsesTheTemplate) {
  json messages = json::array({{{"role", "system"}, {"content", "Be brief."}},
                               {{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "Hi there"}}})}}});
  auto r = post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  json plain = json::array({{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi there"}}});
  std::string text = render_chat_template(s->tokenizer->chat_template(), plain, true,
                                          {{"bos_token", s->tokenizer->bos_token()}, {"eos_token", s->tokenizer->eos_token()}});
  auto ids = s->tokenizer->encode(text, false);
  EXPECT_EQ(j["usage"]["prompt_tokens"], int64_t(ids.size()));
  auto ref = direct(ids, 8);
  EXPECT_EQ(j["choices"][0]["message"]["content"], ref.text);
  EXPECT_EQ(j["usage"]["completion_tokens"], int64_t(ref.tokens.size()));
}

TEST_F(ServerTest, StreamedCompletionFraming) {
  auto ref_r = post("/v1/completions", {{"prompt", "Streaming text"}, {"max_tokens", 12}, {"temperature", 0}});
  ASSERT_TRUE(ref_r);
  json ref = json::parse(ref_r->body);
  auto r = post("/v1/completions", {{"prompt", "Streaming text"}, {"max_tokens", 12}, {"temperature", 0},
                                    {"stream", true}, {"stream_options", {{"include_usage", true}}}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  auto events = sse_events(r->body);
  ASSERT_GE(events.size(), 3u);
  std::string text;
  std::string finish;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json& e = events[i];
    EXPECT_EQ(e["object"], "text_completion");
    EXPECT_EQ(e["id"], events[0]["id"]);
    ASSERT_EQ(e["choices"].size(), 1u);
    text += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) {
      EXPECT_TRUE(finish.empty()) << "one chunk carries the finish reason";
      finish = e["choices"][0]["finish_reason"];
    }
  }
  EXPECT_EQ(text, ref["choices"][0]["text"]);
  EXPECT_EQ(finish, ref["choices"][0]["finish_reason"]);
  const json& usage = events.back();
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], ref["usage"]["completion_tokens"]);
  EXPECT_EQ(usage["usage"]["prompt_tokens"], ref["usage"]["prompt_tokens"]);
}

TEST_F(ServerTest, StreamedChatStartsWithTheRole) {
  json messages = json::array({{{"role", "user"}, {"content", "Tell me"}}});
  auto ref_r = post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 9}, {"temperature", 0}});
  ASSERT_TRUE(ref_r);
  json ref = json::parse(ref_r->body);
  auto r = post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 9}, {"temperature", 0}, {"stream", true}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  auto events = sse_events(r->body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (auto& e : events) {
    EXPECT_FALSE(e.contains("usage")) << "no usage chunk unless asked for";
    const json& d = e["choices"][0]["delta"];
    if (d.contains("content")) text += d["content"].get<std::string>();
  }
  EXPECT_EQ(text, ref["choices"][0]["message"]["content"]);
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], ref["choices"][0]["finish_reason"]);
  EXPECT_EQ(events.back()["choices"][0]["delta"], json::object());
}

TEST_F(ServerTest, ConcurrentRequestsEqualSequential) {
  const std::vector<std::string> prompts = {"alpha beta", "a much longer prompt that spans several pages of the cache",
                                            "x", "numbers 12345 67890", "the same prefix for two", "the same prefix for one"};
  std::vector<std::string> seq, par(prompts.size());
  for (auto& p : prompts) {
    auto r = post("/v1/completions", {{"prompt", p}, {"max_tokens", 15}, {"temperature", 0}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    seq.push_back(json::parse(r->body)["choices"][0]["text"]);
  }
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i)
    threads.emplace_back([&, i] {
      bool stream = i % 2 == 1;
      auto r = post("/v1/completions", {{"prompt", prompts[i]}, {"max_tokens", 15}, {"temperature", 0}, {"stream", stream}});
      if (!r || r->status != 200) return;
      if (!stream) {
        par[i] = json::parse(r->body)["choices"][0]["text"];
      } else {
        for (auto& e : sse_events(r->body)) par[i] += e["choices"][0]["text"].get<std::string>();
      }
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(par[i], seq[i]) << prompts[i];
}

TEST_F(ServerTest, BadRequestsGetOpenAIErrors) {
  auto c = client();
  expect_error(c.Post("/v1/completions", "{not json", "application/json"), 400);
  expect_error(c.Post("/v1/completions", "[1, 2]", "application/json"), 400);
  expect_error(post("/v1/completions", {{"max_tokens", 4}}), 400, "prompt");
  expect_error(post("/v1/completions", {{"prompt", ""}}), 400, "prompt");
  expect_error(post("/v1/completions", {{"prompt", json::array()}}), 400, "prompt");
  expect_error(post("/v1/completions", {{"prompt", {"one", "two"}}}), 400, "prompt");
  expect_error(post("/v1/completions", {{"prompt", {1, 2, 9999}}}), 400, "prompt");
  expect_error(post("/v1/completions", {{"prompt", 42}}), 400, "prompt");
  expect_error(post("/v1/completions", {{"prompt", "hi"}, {"n", 0}}), 400, "n");
  expect_error(post("/v1/completions", {{"prompt", "hi"}, {"n", 17}}), 400, "n");
  expect_error(post("/v1/completions", {{"prompt", "hi"}, {"temperature", "hot"}}), 400, "temperature");
  expect_error(post("/v1/completions", {{"prompt", "hi"}, {"temperature", -1}}), 400, "temperature");
  expect_error(post("/v1/completions", {{"prompt", "hi"}, {"top_p", 0}}), 400, "top_p");
  expect_error(post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 0}}), 400, "max_tokens");
  expect_error(post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2.5}}), 400, "max_tokens");
  expect_error(post("/v1/completions", {{"prompt", "hi"}, {"stream", "yes"}}), 400, "stream");
  expect_error(post("/v1/completions", {{"prompt", "hi"}, {"stop", {1, 2}}}), 400, "stop");
  expect_error(post("/v1/completions", {{"prompt", "hi"}, {"seed", "s"}}), 400, "seed");
  expect_error(post("/v1/completions", {{"prompt", "hi"}, {"model", "gpt-4"}}), 404, "model");
  // Longer than the model's context of 256 tokens (the cache holds 768).
  std::vector<int32_t> long_ids(300, 65);
  expect_error(post("/v1/completions", {{"prompt", long_ids}}), 400, "prompt");
  expect_error(post("/v1/completions", {{"prompt", long_ids}, {"stream", true}}), 400, "prompt");
  expect_error(post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 300}}), 400, "max_tokens");
  expect_error(post("/v1/chat/completions", {{"prompt", "hi"}}), 400, "prompt");  // a field of /v1/completions
  expect_error(post("/v1/chat/completions", {{"max_tokens", 2}}), 400, "messages");
  expect_error(post("/v1/chat/completions", {{"messages", json::array()}}), 400, "messages");
  expect_error(post("/v1/chat/completions", {{"messages", {{{"content", "no role"}}}}}), 400, "messages");
  expect_error(post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", 5}}}}}), 400, "messages");
  expect_error(c.Get("/v1/nothing"), 404);
  // A field the server does not implement is named; harmless metadata is accepted.
  expect_error(post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}, {"unknown_field", {1, 2}}}), 400,
               "unknown_field");
  // The server still answers after all of that.
  auto ok = post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}, {"user", "u-1"}, {"metadata", {{"k", "v"}}}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

// n choices: the later ones are submitted once the first has read the prompt, so they take its
// full pages from the prefix cache; each samples with seed + its index.
TEST_F(ServerTest, NChoicesSharePromptPagesAndSeedPerChoice) {
  const std::string prompt = "choices that share one prompt of more than two pages of the cache, forty tokens";
  auto ids = s->tokenizer->encode(prompt, true);
  ASSERT_GT(ids.size(), 33u);
  auto ref = direct(ids, 6);
  const int64_t hits0 = s->engine->stats().prefix_hit_tokens;
  auto r = post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"n", 3}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], ref.text) << "greedy choices are the greedy output";
  }
  EXPECT_EQ(j["usage"]["completion_tokens"], 3 * int64_t(ref.tokens.size()));
  EXPECT_EQ(j["usage"]["prompt_tokens"], int64_t(ids.size()));
  EXPECT_GE(s->engine->stats().prefix_hit_tokens - hits0, 2 * 32) << "choices 1 and 2 read two full pages from the cache";

  json sampled = {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 1.0}, {"seed", 41}};
  json two = sampled;
  two["n"] = 2;
  json next = sampled;
  next["seed"] = 42;
  auto a = post("/v1/completions", two), b = post("/v1/completions", next);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a->status, 200) << a->body;
  EXPECT_EQ(json::parse(a->body)["choices"][1]["text"], json::parse(b->body)["choices"][0]["text"])
      << "choice 1 samples with seed + 1";
}

// Without node (tests/e2e), the same guarantees in process: a forced call and a schema hold
// whatever the model says; chat logprobs agree with the greedy choice.
TEST_F(ServerTest, ConstrainedOutputsAndLogprobs) {
  const json schema = {{"type", "object"},
                       {"properties", {{"city", {{"type", "string"}, {"enum", {"Paris", "Lima"}}}},
                                       {"days", {{"type", "integer"}, {"minimum", 1}, {"maximum", 9}}}}},
                       {"required", {"city", "days"}},
                       {"additionalProperties", false}};
  const json tools = {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", schema}}}}};
  const json messages = {{{"role", "user"}, {"content", "Hi"}}};
  auto check_args = [](const json& args) {
    ASSERT_TRUE(args.is_object()) << args;
    EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Lima") << args;
    ASSERT_TRUE(args["days"].is_number_integer()) << args;
    EXPECT_GE(args["days"].get<int>(), 1);
    EXPECT_LE(args["days"].get<int>(), 9);
    EXPECT_EQ(args.size(), 2u) << args;
  };
  for (double temperature : {0.0, 1.0}) {
    auto r = post("/v1/chat/completions",
                  {{"messages", messages}, {"tools", tools}, {"max_tokens", 200}, {"temperature", temperature},
                   {"seed", 3}, {"parallel_tool_calls", false},
                   {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    json c = json::parse(r->body)["choices"][0];
    EXPECT_EQ(c["finish_reason"], "tool_calls") << c;
    ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << c;
    EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get_weather");
    check_args(json::parse(c["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()));

    auto j = post("/v1/chat/completions",
                  {{"messages", messages}, {"max_tokens", 120}, {"temperature", temperature}, {"seed", 4},
                   {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "w"}, {"schema", schema}}}}}});
    ASSERT_TRUE(j);
    ASSERT_EQ(j->status, 200) << j->body;
    json jc = json::parse(j->body)["choices"][0];
    EXPECT_EQ(jc["finish_reason"], "stop") << jc;
    check_args(json::parse(jc["message"]["content"].get<std::string>()));
  }
  auto l = post("/v1/chat/completions",
                {{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 4}});
  ASSERT_TRUE(l);
  ASSERT_EQ(l->status, 200) << l->body;
  json lc = json::parse(l->body)["choices"][0];
  ASSERT_TRUE(lc["logprobs"]["content"].is_array()) << lc;
  EXPECT_FALSE(lc["logprobs"]["content"].empty());
  for (const json& e : lc["logprobs"]["content"]) {
    ASSERT_EQ(e["top_logprobs"].size(), 4u);
    EXPECT_EQ(e["top_logprobs"][0]["bytes"], e["bytes"]) << "greedy samples the most likely token";
    EXPECT_FLOAT_EQ(e["top_logprobs"][0]["logprob"].get<float>(), e["logprob"].get<float>());
    EXPECT_LE(e["logprob"].get<double>(), 0.0);
  }
}

TEST_F(ServerTest, ModelsHealthMetrics) {
  auto c = client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->status, 200);
  json j = json::parse(m->body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "tiny");
  EXPECT_EQ(j["data"][0]["object"], "model");

  // Sampled: the random model may end on EOS before max_tokens, so the count to expect is the
  // response's own.
  auto done = post("/v1/completions", {{"prompt", "count me"}, {"max_tokens", 3}});
  ASSERT_TRUE(done);
  ASSERT_EQ(done->status, 200) << done->body;
  const int64_t generated = json::parse(done->body)["usage"]["completion_tokens"].get<int64_t>();
  ASSERT_GE(generated, 1);
  auto t = c.Get("/metrics");
  ASSERT_TRUE(t);
  ASSERT_EQ(t->status, 200);
  const std::string& body = t->body;
  auto value = [&](const std::string& name) -> int64_t {
    std::smatch sm;
    std::regex re("\n" + std::regex_replace(name, std::regex(R"([{}"\[\]])"), R"(\$&)") + " (-?[0-9]+)\n");
    if (!std::regex_search(body, sm, re)) {
      ADD_FAILURE() << "no metric " << name << " in\n" << body;
      return -1;
    }
    return std::stoll(sm[1]);
  };
  EXPECT_GE(value("mla_requests_finished_total"), 1);
  EXPECT_GE(value("mla_generation_tokens_total"), generated);
  EXPECT_EQ(value("mla_kv_pages_total"), 48);
  EXPECT_EQ(value("mla_kv_pages_used") + value("mla_kv_pages_free"), 48);
  EXPECT_EQ(value("mla_kv_bytes_per_token"), s->engine->pool().bytes_per_token());
  EXPECT_GE(value("mla_batches_total{path=\"absorb\"}") + value("mla_batches_total{path=\"expand\"}") +
                value("mla_batches_total{path=\"chunked\"}"),
            1);
  EXPECT_GE(value("mla_http_requests_total{endpoint=\"completions\"}"), 1);
}

TEST(OpenAiNames, FinishReasons) {
  EXPECT_STREQ(server::openai_finish_reason(FinishReason::Eos), "stop");
  EXPECT_STREQ(server::openai_finish_reason(FinishReason::StopString), "stop");
  EXPECT_STREQ(server::openai_finish_reason(FinishReason::MaxTokens), "length");
  EXPECT_STREQ(server::openai_finish_reason(FinishReason::ContextLength), "length");
  EXPECT_STREQ(server::openai_finish_reason(FinishReason::KvCacheFull), "length");
  EXPECT_STREQ(server::openai_finish_reason(FinishReason::Cancelled), "cancelled");
}

// The engine is stepped by the test (no engine thread), so the request cannot finish on its
// own while the test looks: it runs a few steps, the client closes its socket, and within a
// bounded number of steps the request is cancelled and every page is free again.
TEST(ServerDisconnect, ClientGoneCancelsTheRequestAndFreesItsPages) {
  auto model = Model::load(test::fixture("deepseek-v3-tiny"));
  test::TempDir dir("server-gone-tok");
  Tokenizer::write_byte_level_tokenizer(dir.str(), 512);
  Tokenizer tokenizer = Tokenizer::load(dir.str());
  GenerationConfig generation = GenerationConfig::load(test::fixture("deepseek-v3-tiny"), model->config());
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "not streamed");
    EngineOptions eo;
    eo.kv_pages = 32;
    eo.page_size = 16;
    eo.prefix_cache = false;  // every page comes back to the free list
    Engine engine(*model, &tokenizer, eo);
    server::ServerOptions opt;
    opt.port = 0;
    opt.model_name = "tiny";
    server::Server srv(engine, tokenizer, generation, model->config(), opt);
    const int port = srv.bind();
    std::thread http([&] { srv.listen(); });
    struct Join {  // on every way out: end the request, stop the server
      Engine& engine;
      server::Server& srv;
      std::thread& t;
      ~Join() {
        engine.cancel_all();
        engine.step();
        srv.stop();
        t.join();
      }
    } join{engine, srv, http};

    const int64_t max_tokens = 200;
    // A client that sends its request and then closes the connection, never reading.
    test::RawConnection client(port);
    const json body = {{"prompt", "a request whose client goes away"}, {"max_tokens", max_tokens},
                       {"temperature", 0}, {"ignore_eos", true}, {"stream", stream}};
    ASSERT_TRUE(client.send(test::post_request("/v1/completions", body.dump())));
    for (int i = 0; i < 1000 && engine.stats().requests_submitted == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_EQ(engine.stats().requests_submitted, 1);
    for (int i = 0; i < 3; ++i) engine.step();
    ASSERT_EQ(engine.stats().running, 1);
    EXPECT_LT(engine.stats().kv_pages_free, 32);
    client.close();

    int steps = 0;
    const auto t0 = std::chrono::steady_clock::now();
    while (engine.stats().requests_cancelled == 0 && steps < 100) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      engine.step();
      ++steps;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto st = engine.stats();
    EXPECT_EQ(st.requests_cancelled, 1) << "after " << steps << " steps";
    EXPECT_EQ(st.running, 0);
    EXPECT_EQ(st.kv_pages_free, 32) << "the request's pages are back";
    EXPECT_LT(st.generation_tokens, max_tokens) << "it did not run to its end";
    EXPECT_LT(seconds, 5.0);
  }
}

// `mla serve` as a program: a temporary model folder (the fixture and a tokenizer), a free
// port printed on stderr, a request, then SIGTERM ends it with status 0.
TEST(ServeBinary, ServesAndStopsOnSigterm) {
  namespace fs = std::filesystem;
  test::TempDir dir("serve-bin");
  test::make_served_model(dir.path);
  // Killed on every way out of this test, failed assertions included.
  test::ServeProcess child(dir / "serve.log", {"-m", dir.str(), "--threads", "1", "--kv-cache-gb", "0.001",
                                               "--served-model-name", "bin-model"});
  ASSERT_NE(child.port, 0) << "mla serve printed no address or exited early:\n" << child.log_text();
  const int port = child.port;
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  auto r = c.Post("/v1/completions", json({{"model", "bin-model"}, {"prompt", "hi"}, {"max_tokens", 4}}).dump(),
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["model"], "bin-model");
  ::kill(child.pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(waitpid(child.pid, &status, 0), child.pid);
  child.pid = 0;  // reaped
  EXPECT_TRUE(WIFEXITED(status)) << "ended by a signal";
  EXPECT_EQ(WEXITSTATUS(status), 0);
  const std::string text = child.log_text();
  EXPECT_NE(text.find("stopped after 1 requests"), std::string::npos) << text;
}


}  // namespace
}  // namespace mla

namespace mla {
namespace {

// An engine on its own thread and the server over it on another, both stopped on every way out
// of a test.
struct RunningServer {
  Engine& engine;
  server::Server srv;
  int port = 0;
  std::thread http;
  RunningServer(Engine& e, const Tokenizer& tok, const GenerationConfig& g, const ModelConfig& c,
                const server::ServerOptions& opt)
      : engine(e), srv(e, tok, g, c, opt) {
    engine.start();
    port = srv.bind();
    http = std::thread([this] { srv.listen(); });
  }
  ~RunningServer() {
    srv.stop();
    http.join();
    engine.stop();
  }
};

// Kimi's tool-call markers are special tokens: a forced call in Kimi's format, with logit_bias
// making the model write each marker as its special token where the grammar allows it, comes
// back as a tool call (the markers stay in the text the parser reads, the grammar's token table
// allows them), and no marker reaches the content.
TEST(ServerSpecialMarkers, KimiForcedCallWithSpecialMarkerTokens) {
  auto model = Model::load(test::fixture("deepseek-v3-tiny"));
  test::TempDir dir("server-kimi-tok");
  Tokenizer::write_byte_level_tokenizer(dir.str(), 507);  // 503..506: the writer's specials
  const std::vector<std::string> markers = {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                                            "<|tool_call_begin|>", "<|tool_call_end|>",
                                            "<|tool_call_argument_begin|>"};
  {
    std::ifstream in(dir / "tokenizer.json");
    json t = json::parse(in);
    int id = 507;
    for (const std::string& m : markers)
      t["added_tokens"].push_back({{"id", id++}, {"content", m}, {"single_word", false}, {"lstrip", false},
                                   {"rstrip", false}, {"normalized", false}, {"special", true}});
    std::ofstream(dir / "tokenizer.json") << t.dump(1);
  }
  Tokenizer tokenizer = Tokenizer::load(dir.str());
  ASSERT_EQ(tokenizer.vocab_size(), 512u);
  json bias = json::object();
  for (const std::string& m : markers) {
    auto id = tokenizer.token_id(m);
    ASSERT_TRUE(id && tokenizer.is_special(*id)) << m;
    bias[std::to_string(*id)] = 100;
  }
  GenerationConfig generation = GenerationConfig::load(test::fixture("deepseek-v3-tiny"), model->config());
  EngineOptions eo;
  eo.kv_pages = 32;
  eo.page_size = 16;
  Engine engine(*model, &tokenizer, eo);
  server::ServerOptions opt;
  opt.port = 0;
  opt.model_name = "kimi";
  opt.tool_call_parser = "kimi_k2";
  opt.tool_prompt = false;  // the section would not fit 256 positions of bytes (see ServerTest)
  RunningServer live(engine, tokenizer, generation, model->config(), opt);
  const int port = live.port;

  const json tools = {{{"type", "function"},
                       {"function",
                        {{"name", "ping"},
                         {"parameters",
                          {{"type", "object"},
                           {"properties", {{"n", {{"type", "integer"}, {"minimum", 0}, {"maximum", 9}}}}},
                           {"required", {"n"}}}}}}}};
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "not streamed");
    json body = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                 {"tools", tools},
                 {"tool_choice", "required"},
                 {"parallel_tool_calls", false},
                 {"logit_bias", bias},
                 {"temperature", 0},
                 {"max_tokens", 60},
                 {"stream", stream}};
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    std::string name, args, content, finish;
    if (!stream) {
      json ch = json::parse(r->body)["choices"][0];
      finish = ch["finish_reason"];
      if (ch["message"]["content"].is_string()) content = ch["message"]["content"];
      ASSERT_EQ(ch["message"]["tool_calls"].size(), 1u) << ch;
      name = ch["message"]["tool_calls"][0]["function"]["name"];
      args = ch["message"]["tool_calls"][0]["function"]["arguments"];
      EXPECT_EQ(ch["message"]["tool_calls"][0]["id"].get<std::string>().rfind("functions.ping:", 0), 0u) << ch;
    } else {
      for (size_t pos = 0; (pos = r->body.find("data: {", pos)) != std::string::npos; ++pos) {
        json e = json::parse(r->body.substr(pos + 6, r->body.find("\n\n", pos) - pos - 6));
        const json& ch = e["choices"][0];
        if (ch["delta"].contains("content")) content += ch["delta"]["content"].get<std::string>();
        for (const json& tc : ch["delta"].value("tool_calls", json::array())) {
          if (tc["function"].contains("name")) name += tc["function"]["name"].get<std::string>();
          args += tc["function"]["arguments"].get<std::string>();
        }
        if (ch["finish_reason"].is_string()) finish = ch["finish_reason"];
      }
    }
    EXPECT_EQ(finish, "tool_calls");
    EXPECT_EQ(name, "ping");
    json a = json::parse(args);
    ASSERT_TRUE(a["n"].is_number_integer()) << args;
    EXPECT_EQ(content.find("<|"), std::string::npos) << content;
  }
}


// Speculative decoding (the MTP module's drafts, every step) under concurrent load: requests
// sent at once, streamed and not, one with a long prompt sent while the others decode, so that
// its prefill chunks share passes with their verify rows. Each gets exactly the tokens a plain
// engine gives it alone: none lost, none repeated. (A verify row in a pass with prefill rows runs
// on the batch's kernels as a plain decode row there does; on this fixture's logits the tokens
// are the same.)
TEST(ServerSpeculative, ConcurrentLoadLosesNoToken) {
  auto model = Model::load(test::fixture("deepseek-v3-tiny"), {}, false, /*with_mtp=*/true);
  test::TempDir dir("server-spec-tok");
  Tokenizer::write_byte_level_tokenizer(dir.str(), 512);
  Tokenizer tokenizer = Tokenizer::load(dir.str());
  GenerationConfig generation = GenerationConfig::load(test::fixture("deepseek-v3-tiny"), model->config());
  EngineOptions eo;
  eo.kv_pages = 64;
  eo.page_size = 16;
  eo.kv_dtype = KvDType::F32;
  eo.max_batch_tokens = 48;
  std::string long_prompt;
  for (int i = 0; i < 12; ++i) long_prompt += "a long prompt read in chunks ";
  const std::vector<std::string> prompts = {"alpha beta", "x", "numbers 12345 67890", "the same prefix for two",
                                            "the same prefix for one", long_prompt};
  const int64_t max_tokens = 24;
  std::vector<std::vector<int32_t>> want;
  {
    Engine plain(*model, &tokenizer, eo);
    for (auto& p : prompts) {
      Request r;
      r.prompt = tokenizer.encode(p, true);
      r.sampling.temperature = 0;
      r.max_new_tokens = max_tokens;
      want.push_back(plain.generate(r).tokens);
      ASSERT_EQ(int64_t(want.back().size()), max_tokens);
    }
  }
  eo.speculative.enabled = true;
  eo.speculative.draft_tokens = 2;
  eo.speculative.adaptive = false;  // every decode step drafts
  Engine engine(*model, &tokenizer, eo);
  server::ServerOptions opt;
  opt.port = 0;
  opt.model_name = "tiny";
  RunningServer live(engine, tokenizer, generation, model->config(), opt);
  const int port = live.port;

  // Each request's tokens, from logprobs (one entry per token, in order), and its text.
  std::vector<std::vector<std::string>> got(prompts.size());
  std::vector<std::string> text(prompts.size());
  std::vector<int64_t> usage(prompts.size(), -1);
  auto send = [&](size_t i) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    const bool stream = i % 2 == 1;
    const json body = {{"prompt", prompts[i]}, {"max_tokens", max_tokens}, {"temperature", 0},
                       {"ignore_eos", true}, {"stream", stream}, {"logprobs", 0}};
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    auto take = [&](const json& ch) {
      text[i] += ch["text"].get<std::string>();
      if (ch.contains("logprobs") && ch["logprobs"].is_object())
        for (const json& t : ch["logprobs"]["tokens"]) got[i].push_back(t.get<std::string>());
    };
    if (!stream) {
      const json j = json::parse(r->body);
      take(j["choices"][0]);
      usage[i] = j["usage"]["completion_tokens"].get<int64_t>();
      return;
    }
    size_t pos = 0;
    while ((pos = r->body.find("data: ", pos)) != std::string::npos) {
      const size_t end = r->body.find("\n\n", pos);
      const std::string data = r->body.substr(pos + 6, end - pos - 6);
      pos = end;
      if (data == "[DONE]") break;
      const json e = json::parse(data);
      if (!e["choices"].empty()) take(e["choices"][0]);
    }
  };
  std::vector<std::thread> threads;
  for (size_t i = 0; i + 1 < prompts.size(); ++i) threads.emplace_back(send, i);
  for (int i = 0; i < 1000 && engine.stats().generation_tokens < 4; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  threads.emplace_back(send, prompts.size() - 1);  // the long prompt, while the others decode
  for (auto& t : threads) t.join();

  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(text[i], tokenizer.decode(want[i]));
    EXPECT_EQ(int64_t(got[i].size()), max_tokens) << "one logprobs entry per token";
    if (usage[i] >= 0) {
      EXPECT_EQ(usage[i], max_tokens);
    }
  }
  const EngineStats st = engine.stats();
  EXPECT_GT(st.spec_steps, 0);
  EXPECT_GT(st.spec_passes_with_prefill, 0) << "the long prompt's chunks were meant to meet verify rows";
  EXPECT_EQ(st.generation_tokens, int64_t(prompts.size()) * max_tokens) << "no token sampled twice";
}

}  // namespace
}  // namespace mla
