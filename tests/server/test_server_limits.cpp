// A server a hostile or careless client cannot take down: bounded parsing (nesting depth,
// body and header sizes, slow senders), 405 with Allow, checked max_tokens against the
// context and the KV cache, back-pressure (429 with Retry-After), liveness apart from the
// generation load, the per-request timeout and the graceful drain, each on an in-process
// server on 127.0.0.1 (a free port), most over an engine the test steps itself so that
// requests stay in flight as long as it wants.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <thread>

#include "engine/engine.h"
#include "engine/generation_config.h"
#include "server/openai.h"
#include "server/server.h"
#include "server/serve_process.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace mla {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// The fixture's model and a byte-level tokenizer, loaded once.
struct Assets {
  std::unique_ptr<Model> model;
  test::TempDir dir{"limits-tok"};
  std::unique_ptr<Tokenizer> tokenizer;
  GenerationConfig generation;
  Assets() {
    model = Model::load(test::fixture("deepseek-v3-tiny"));
    Tokenizer::write_byte_level_tokenizer(dir.str(), 512);
    tokenizer = std::make_unique<Tokenizer>(Tokenizer::load(dir.str()));
    generation = GenerationConfig::load(test::fixture("deepseek-v3-tiny"), model->config());
  }
  static Assets& get() {
    static Assets a;
    return a;
  }
};

// An engine and a server listening on a thread; the engine runs its own thread or is stepped
// by the test (threaded = false). Stops everything on destruction.
struct Local {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<server::Server> srv;
  std::thread thread;
  int port = 0;
  bool threaded;
  Local(EngineOptions eo, server::ServerOptions so, bool threaded_engine) : threaded(threaded_engine) {
    Assets& a = Assets::get();
    engine = std::make_unique<Engine>(*a.model, a.tokenizer.get(), eo);
    if (threaded) engine->start();
    so.host = "127.0.0.1";
    so.port = 0;
    so.model_name = "tiny";
    srv = std::make_unique<server::Server>(*engine, *a.tokenizer, a.generation, a.model->config(), so);
    port = srv->bind();
    thread = std::thread([this] { srv->listen(); });
  }
  ~Local() {
    srv->stop_now();
    if (!threaded) {  // step until every handler has its last event
      for (int i = 0; i < 500 && thread.joinable(); ++i) {
        engine->cancel_all();
        engine->step();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        if (srv->metrics().find("\nmla_http_requests_in_flight 0\n") != std::string::npos) break;
      }
    }
    thread.join();
    engine->stop();
  }
  httplib::Client client(int timeout_s = 30) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(timeout_s, 0);
    c.set_connection_timeout(5, 0);
    return c;
  }
  int64_t metric(const std::string& name) const {
    const std::string m = srv->metrics();
    const size_t at = m.find("\n" + name + " ");
    if (at == std::string::npos) return -1;
    return std::stoll(m.substr(at + name.size() + 2));
  }
  // Waits (stepping the engine when it has no thread) until pred holds; false after `ms`.
  template <class P>
  bool wait_for(P pred, int ms = 5000) {
    const auto t0 = Clock::now();
    while (!pred()) {
      if (ms_since(t0) > ms) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }
};

EngineOptions small_engine(int64_t max_running = 4) {
  EngineOptions eo;
  eo.kv_pages = 48;
  eo.page_size = 16;
  eo.kv_dtype = KvDType::F32;
  eo.max_batch_tokens = 64;
  eo.max_running = max_running;
  eo.prefix_cache = false;
  return eo;
}

using Raw = test::RawConnection;
using test::post_head;

void expect_error(const httplib::Result& r, int status, const std::string& fragment = {}, const std::string& param = {}) {
  ASSERT_TRUE(r) << "no response";
  EXPECT_EQ(r->status, status) << r->body;
  json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
  EXPECT_TRUE(j["error"]["message"].is_string());
  if (!fragment.empty()) {
    EXPECT_NE(j["error"]["message"].get<std::string>().find(fragment), std::string::npos) << r->body;
  }
  if (!param.empty()) {
    EXPECT_EQ(j["error"]["param"], param) << r->body;
  }
}

TEST(ServerLimits, DeepNestingIsA400NotACrash) {
  Local l(small_engine(), {}, true);
  auto c = l.client();
  const int depth = 60000;  // a 60 KB body overflowed a worker's stack before
  const std::vector<std::string> bodies = {
      R"({"prompt": "hi", "stop": )" + std::string(depth, '[') + std::string(depth, ']') + "}",
      R"({"prompt": )" + std::string(depth, '[') + std::string(depth, ']') + "}",
      [&] {
        std::string s = R"({"prompt": "hi", "x": )";
        for (int i = 0; i < depth; ++i) s += R"({"a":)";
        s += "1" + std::string(depth, '}') + "}";
        return s;
      }(),
      R"({"messages": [{"role": "user", "content": )" + std::string(depth, '[') + std::string(depth, ']') + "}]}",
  };
  for (const std::string& b : bodies) {
    const bool chat = b.find("messages") != std::string::npos;
    expect_error(c.Post(chat ? "/v1/chat/completions" : "/v1/completions", b, "application/json"), 400, "nests");
  }
  // The tokenizer's endpoint parses the same way.
  expect_error(c.Post("/tokenize", R"({"prompt": )" + std::string(depth, '[') + std::string(depth, ']') + "}",
                      "application/json"),
               400, "nests");
  // A number past double's range is a 400 too (it was a 500: nlohmann's out_of_range).
  expect_error(c.Post("/v1/completions", R"({"prompt": "hi", "temperature": 6e4444})", "application/json"), 400,
               "not valid JSON");
  // Unclosed brackets too, and brackets inside strings do not count.
  expect_error(c.Post("/v1/completions", std::string(depth, '['), "application/json"), 400, "nests");
  auto ok = c.Post("/v1/completions", R"({"prompt": "[[[[{{{{", "max_tokens": 2, "stop": ["]]]]"]})", "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(server::json_nesting_depth(R"({"a": [1, {"b": "[[[["}]})"), 3u);
  EXPECT_THROW(server::parse_json_body(std::string(100, '[') + std::string(100, ']')), server::ApiError);
  EXPECT_NO_THROW(server::parse_json_body(std::string(64, '[') + std::string(64, ']')));
}

TEST(ServerLimits, SizesAndMalformedHeadsAre4xx) {
  server::ServerOptions so;
  so.max_body_bytes = 64 << 10;
  so.max_header_bytes = 4 << 10;
  Local l(small_engine(), so, true);
  {  // a body past the limit: 413 from its Content-Length, before it is read
    Raw r(l.port);
    ASSERT_TRUE(r.send(post_head("/v1/completions", 1 << 20)));
    const std::string resp = r.read_all();
    EXPECT_EQ(resp.rfind("HTTP/1.1 413", 0), 0u) << resp;
    EXPECT_NE(resp.find("exceeds the limit"), std::string::npos) << resp;
  }
  {  // headers past the limit: 431
    Raw r(l.port);
    ASSERT_TRUE(r.send("GET /health HTTP/1.1\r\nX-Big: " + std::string(8000, 'x') + "\r\n\r\n"));
    const std::string resp = r.read_all();
    EXPECT_EQ(resp.rfind("HTTP/1.1 431", 0), 0u) << resp.substr(0, 200);
  }
  {  // a chunked body: 411
    Raw r(l.port);
    ASSERT_TRUE(r.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"));
    EXPECT_EQ(r.read_all().rfind("HTTP/1.1 411", 0), 0u);
  }
  {  // a bad Content-Length: 400
    Raw r(l.port);
    ASSERT_TRUE(r.send("POST /v1/completions HTTP/1.1\r\nContent-Length: -4\r\n\r\n"));
    EXPECT_EQ(r.read_all().rfind("HTTP/1.1 400", 0), 0u);
  }
  {  // a request line that is not one: 400 naming it
    Raw r(l.port);
    ASSERT_TRUE(r.send("NOT A REQUEST LINE AT ALL\r\nHost: x\r\n\r\n"));
    const std::string resp = r.read_all();
    EXPECT_EQ(resp.rfind("HTTP/1.1 400", 0), 0u) << resp;
    EXPECT_NE(resp.find("malformed request"), std::string::npos) << resp;
  }
  {  // Expect: 100-continue is answered, then the request runs
    Raw r(l.port);
    const std::string body = R"({"prompt": "hi", "max_tokens": 2})";
    ASSERT_TRUE(r.send(post_head("/v1/completions", body.size(), "Expect: 100-continue\r\nConnection: close\r\n")));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(r.send(body));
    const std::string resp = r.read_all();
    EXPECT_EQ(resp.rfind("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200", 0), 0u) << resp;
  }
  // Wrong methods on known routes: 405 with Allow; unknown routes stay 404.
  auto c = l.client();
  auto g = c.Get("/v1/completions");
  expect_error(g, 405, "not allowed");
  EXPECT_EQ(g->get_header_value("Allow"), "POST");
  auto p = c.Post("/health", "", "text/plain");
  expect_error(p, 405);
  EXPECT_EQ(p->get_header_value("Allow"), "GET");
  auto t = c.Get("/tokenize");
  expect_error(t, 405);
  EXPECT_EQ(t->get_header_value("Allow"), "POST");
  expect_error(c.Get("/v1/nothing"), 404, "no route");
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

TEST(ServerLimits, SlowSenderGets408AndDoesNotBlockLiveness) {
  server::ServerOptions so;
  so.read_timeout = 1;
  Local l(small_engine(), so, true);
  std::vector<std::unique_ptr<Raw>> slow;
  for (int i = 0; i < 40; ++i) {  // more than the generation pool has threads
    slow.push_back(std::make_unique<Raw>(l.port));
    ASSERT_TRUE(slow.back()->send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le"));
  }
  auto c = l.client();
  for (int i = 0; i < 10; ++i) {
    const auto t0 = Clock::now();
    auto h = c.Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
    EXPECT_LT(ms_since(t0), 500.0) << "/health waited behind slow senders";
    auto r = c.Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 1})", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
  }
  const std::string resp = slow[0]->read_all(3000);
  EXPECT_EQ(resp.rfind("HTTP/1.1 408", 0), 0u) << resp;
  EXPECT_NE(resp.find("read timeout"), std::string::npos) << resp;
  EXPECT_GE(l.metric("mla_http_read_timeouts_total"), 1);
}

TEST(ServerLimits, LengthsAreCheckedWithoutOverflowAgainstContextAndCache) {
  EngineOptions eo = small_engine();
  eo.kv_pages = 8;  // 128 tokens: less than the model's context of 256
  Local l(eo, {}, true);
  auto c = l.client();
  auto post = [&](const json& b) { return c.Post("/v1/completions", b.dump(), "application/json"); };
  expect_error(post({{"prompt", "hi"}, {"max_tokens", INT64_MAX}}), 400, "to generate", "max_tokens");
  expect_error(post({{"prompt", "hi"}, {"max_tokens", INT64_MAX - 1}}), 400, {}, "max_tokens");
  expect_error(post({{"prompt", "hi"}, {"max_tokens", uint64_t(1) << 63}}), 400, "too large", "max_tokens");
  // Fits the context (256) but not the cache (128): refused, not silently cut short.
  expect_error(post({{"prompt", "hi"}, {"max_tokens", 200}}), 400, "KV cache", "max_tokens");
  std::vector<int32_t> ids(129, 65);
  expect_error(post({{"prompt", ids}, {"max_tokens", 1}}), 400, "KV cache", "prompt");
  // The most that fits is accepted and runs to its length.
  const auto prompt = Assets::get().tokenizer->encode("hi", true);
  auto r = post({{"prompt", "hi"}, {"max_tokens", 128 - int64_t(prompt.size())}, {"ignore_eos", true}, {"temperature", 0}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 128 - int64_t(prompt.size()));
  EXPECT_EQ(json::parse(r->body)["choices"][0]["finish_reason"], "length");

  // Without max_tokens a request may generate what is left of its room.
  server::ServingContext ctx;
  ctx.tokenizer = Assets::get().tokenizer.get();
  ctx.model_name = "tiny";
  ctx.context_length = 256;
  ctx.max_sequence_tokens = 128;
  auto p = server::parse_request(server::Endpoint::Completions, {{"prompt", "hi"}}, ctx);
  EXPECT_EQ(p.request.max_new_tokens, 128 - int64_t(prompt.size()));
  expect_error(post({{"prompt", "hi"}, {"timeout", -1}}), 400, {}, "timeout");
}

TEST(ServerLimits, RequestsBeyondTheQueueGet429AtOnce) {
  server::ServerOptions so;
  so.max_queued_requests = 1;
  Local l(small_engine(/*max_running=*/1), so, /*threaded=*/false);  // nothing finishes unless stepped
  const std::string body = R"({"prompt": "wait", "max_tokens": 8})";
  std::vector<std::unique_ptr<Raw>> held;
  for (int i = 0; i < 2; ++i) {
    held.push_back(std::make_unique<Raw>(l.port));
    ASSERT_TRUE(held.back()->send(post_head("/v1/completions", body.size(), "Connection: close\r\n") + body));
  }
  ASSERT_TRUE(l.wait_for([&] { return l.metric("mla_http_requests_in_flight") == 2; }));
  auto c = l.client();
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    auto r = c.Post("/v1/completions", body, "application/json");
    expect_error(r, 429, "limit");
    EXPECT_EQ(r->get_header_value("Retry-After"), "1");
    EXPECT_EQ(json::parse(r->body)["error"]["code"], "queue_full");
    EXPECT_LT(ms_since(t0), 1000.0);
  }
  EXPECT_EQ(l.metric("mla_http_rejected_total{reason=\"queue_full\"}"), 3);
  // /health and /metrics are not held by the waiting requests.
  const auto t0 = Clock::now();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_LT(ms_since(t0), 500.0);
  // Once the engine runs, the held requests are answered and new ones admitted.
  for (int i = 0; i < 100; ++i) l.engine->step();
  for (auto& r : held) EXPECT_NE(r->read_all(2000).find("HTTP/1.1 200"), std::string::npos);
  ASSERT_TRUE(l.wait_for([&] { return l.metric("mla_http_requests_in_flight") == 0; }));
}

TEST(ServerLimits, TimeoutFieldEndsTheRequestClearly) {
  Local l(small_engine(), {}, /*threaded=*/false);
  std::atomic<bool> stepping{true};
  std::thread stepper([&] {  // slow: one step each 20 ms, so 200 tokens take seconds
    while (stepping) {
      l.engine->step();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  auto c = l.client();
  const json body = {{"prompt", "slow"}, {"max_tokens", 200}, {"ignore_eos", true}, {"timeout", 0.3}};
  const auto t0 = Clock::now();
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  expect_error(r, 504, "timeout of 0.3 s");
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "request_timeout");
  EXPECT_LT(ms_since(t0), 3000.0);
  json sb = body;
  sb["stream"] = true;
  auto s = c.Post("/v1/completions", sb.dump(), "application/json");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->status, 200);
  EXPECT_NE(s->body.find("\"request_timeout\""), std::string::npos) << s->body;
  EXPECT_EQ(s->body.size() >= 14 ? s->body.substr(s->body.size() - 14) : s->body, "data: [DONE]\n\n");
  EXPECT_EQ(l.metric("mla_http_cut_total{reason=\"timeout\"}"), 2);
  stepping = false;
  stepper.join();
  EXPECT_EQ(l.metric("mla_kv_pages_held_by_requests"), 0);
}

TEST(ServerLimits, DrainFinishesThenCutsWithErrorEventAndDone) {
  server::ServerOptions so;
  so.shutdown_timeout = 0.5;
  Local l(small_engine(), so, /*threaded=*/false);
  std::atomic<bool> stepping{true};
  std::thread stepper([&] {
    while (stepping) {
      l.engine->step();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  auto c = l.client();
  std::string streamed;
  std::thread client([&] {
    auto s = c.Post("/v1/completions",
                    json({{"prompt", "long"}, {"max_tokens", 200}, {"ignore_eos", true}, {"stream", true}}).dump(),
                    "application/json");
    if (s) streamed = s->body;
  });
  std::optional<httplib::Result> plain;
  std::thread plain_client([&] {
    auto c3 = l.client();
    plain.emplace(c3.Post("/v1/completions", json({{"prompt", "long too"}, {"max_tokens", 200}, {"ignore_eos", true}}).dump(),
                          "application/json"));
  });
  ASSERT_TRUE(l.wait_for([&] { return l.metric("mla_http_requests_in_flight") == 2; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t0 = Clock::now();
  l.srv->stop();
  EXPECT_TRUE(l.srv->draining());
  auto c2 = l.client();
  expect_error(c2.Post("/v1/completions", R"({"prompt": "late", "max_tokens": 2})", "application/json"), 503,
               "shutting down");
  auto h = c2.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  client.join();
  plain_client.join();
  const double waited = ms_since(t0);
  // The request without a stream is cut with an error response.
  ASSERT_TRUE(plain.has_value());
  expect_error(*plain, 503, "shutting down");
  EXPECT_EQ(json::parse((*plain)->body)["error"]["code"], "server_shutdown");
  EXPECT_GE(waited, 400.0) << "cut before the drain deadline";
  EXPECT_LT(waited, 5000.0);
  EXPECT_NE(streamed.find("\"server_shutdown\""), std::string::npos) << streamed;
  ASSERT_GE(streamed.size(), 14u);
  EXPECT_EQ(streamed.substr(streamed.size() - 14), "data: [DONE]\n\n");
  EXPECT_EQ(l.metric("mla_http_cut_total{reason=\"shutdown\"}"), 2);
  l.thread.join();  // listen() returned
  l.thread = std::thread([] {});
  stepping = false;
  stepper.join();
  EXPECT_EQ(l.metric("mla_kv_pages_held_by_requests"), 0);
}


// curl -d labels a body application/x-www-form-urlencoded; every route reads JSON, so such a
// body is read as JSON whatever its size (cpp-httplib's form parser refuses forms past 8 KiB),
// with or without Expect: 100-continue before or after the label.
TEST(ServerLimits, BodiesLabelledAsFormsAreReadAsJson) {
  Local l(small_engine(), {}, /*threaded=*/true);
  // Past 8 KiB in stop strings: the tiny model's context holds 256 tokens.
  const std::string body = json({{"prompt", "a"},
                                 {"max_tokens", 1},
                                 {"stop", {std::string(4000, 'x'), std::string(4000, 'y'), std::string(4000, 'z')}}})
                               .dump();
  for (const std::string& headers :
       {std::string("Content-Type: application/x-www-form-urlencoded\r\n"),
        std::string("Expect: 100-continue\r\nContent-Type: application/x-www-form-urlencoded; charset=utf-8\r\n"),
        std::string("Content-Type: application/x-www-form-urlencoded\r\nExpect: 100-continue\r\n")}) {
    Raw c(l.port);
    const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers +
                             "Connection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n";
    ASSERT_TRUE(c.send(head));
    if (headers.find("Expect") != std::string::npos) {
      const std::string cont = c.read_until("100 Continue\r\n\r\n", 5000);
      ASSERT_NE(cont.find("HTTP/1.1 100 Continue"), std::string::npos) << cont;
    }
    ASSERT_TRUE(c.send(body));
    const std::string reply = c.read_all(30000);
    EXPECT_NE(reply.find("HTTP/1.1 200"), std::string::npos) << headers << reply.substr(0, 300);
    EXPECT_NE(reply.find("\"text_completion\""), std::string::npos) << reply.substr(0, 300);
  }
}

// The Messages and Responses endpoints run the same request path as chat completions: the
// same bound answers 429 (in each API's error shape), a client that goes away has its request
// cancelled, a waiting stream gets keep-alive events, and the shutdown cut ends a stream with
// each API's error event.
TEST(ServerLimits, MessagesAndResponsesShareTheLimits) {
  server::ServerOptions so;
  so.max_queued_requests = 0;
  so.keepalive_seconds = 0.05;
  Local l(small_engine(/*max_running=*/1), so, /*threaded=*/false);  // nothing finishes unless stepped
  const json messages = {{"model", "any"}, {"max_tokens", 8}, {"stream", true},
                         {"messages", {{{"role", "user"}, {"content", "wait"}}}}};
  // One streamed request holds the only place; no step runs, so it gets keep-alives only.
  Raw held(l.port);
  ASSERT_TRUE(held.send(post_head("/v1/messages", messages.dump().size(), "Connection: close\r\n") + messages.dump()));
  ASSERT_TRUE(l.wait_for([&] { return l.metric("mla_http_requests_in_flight") == 1; }));
  auto c = l.client();
  auto m = c.Post("/v1/messages", json({{"model", "any"}, {"max_tokens", 4}, {"messages", {{{"role", "user"}, {"content", "x"}}}}}).dump(),
                  "application/json");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 429) << m->body;
  EXPECT_EQ(json::parse(m->body)["type"], "error") << m->body;
  EXPECT_EQ(json::parse(m->body)["error"]["type"], "rate_limit_error") << m->body;
  auto r = c.Post("/v1/responses", json({{"model", "any"}, {"input", "x"}}).dump(), "application/json");
  expect_error(r, 429, "limit");
  const std::string early = held.read_until("event: ping", 3000);
  EXPECT_NE(early.find("event: message_start"), std::string::npos) << early;
  EXPECT_NE(early.find("event: ping"), std::string::npos) << "no keep-alive while the prompt waits: " << early;
  // The client goes away: the request is cancelled and leaves the bound.
  held.close();
  for (int i = 0; i < 20 && l.metric("mla_http_requests_in_flight") != 0; ++i) {
    l.engine->step();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(l.metric("mla_http_requests_in_flight"), 0);
  EXPECT_EQ(l.metric("mla_http_cut_total{reason=\"client_gone\"}"), 1);
}

TEST(ServerLimits, ShutdownCutEndsMessagesAndResponsesStreamsWithTheirErrorEvents) {
  server::ServerOptions so;
  so.shutdown_timeout = 0.3;
  Local l(small_engine(), so, /*threaded=*/false);
  std::atomic<bool> stepping{true};
  std::thread stepper([&] {
    while (stepping) {
      l.engine->step();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  std::string anthropic, responses;
  std::thread a([&] {
    auto s = l.client().Post("/v1/messages",
                             json({{"model", "any"}, {"max_tokens", 200}, {"stream", true},
                                   {"messages", {{{"role", "user"}, {"content", "long"}}}}}).dump(),
                             "application/json");
    if (s) anthropic = s->body;
  });
  std::thread b([&] {
    auto s = l.client().Post("/v1/responses",
                             json({{"model", "any"}, {"max_output_tokens", 200}, {"stream", true}, {"input", "long too"}}).dump(),
                             "application/json");
    if (s) responses = s->body;
  });
  ASSERT_TRUE(l.wait_for([&] { return l.metric("mla_http_requests_in_flight") == 2; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  l.srv->stop();
  a.join();
  b.join();
  l.thread.join();
  l.thread = std::thread([] {});
  stepping = false;
  stepper.join();
  // Unless the random model ended a reply first (EOS) before the cut.
  if (anthropic.find("event: message_stop") == std::string::npos) {
    EXPECT_NE(anthropic.find("event: error"), std::string::npos) << anthropic;
    EXPECT_NE(anthropic.find("overloaded_error"), std::string::npos) << anthropic;
  }
  if (responses.find("response.completed") == std::string::npos) {
    EXPECT_NE(responses.find("response.failed"), std::string::npos) << responses;
  }
  EXPECT_EQ(l.metric("mla_kv_pages_held_by_requests"), 0);
}

}  // namespace
}  // namespace mla
