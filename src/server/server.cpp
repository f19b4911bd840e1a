// The routes of the server (see server.h) and the one request path under every generation
// API: serve_generation, and stream for server-sent events. The listener is the HTTP layer's
// (http_listener.h), admission and drain are admission.h's, the /metrics text metrics.h's.
#include "server/server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>

#include "server/admission.h"
#include "server/agent_api.h"
#include "server/api_anthropic.h"
#include "server/api_openai.h"
#include "server/api_responses.h"
#include "server/choice.h"
#include "server/connection.h"
#include "server/generation.h"
#include "server/http_io.h"
#include "server/http_listener.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/structured.h"
#include "server/webui.h"

namespace mla::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param = {},
                const std::string& type = {}, const std::string& code = {}) {
  res.status = status;
  res.set_content(dump(error_body(status, message, param, type, code)), "application/json");
}

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::max(0.0, s)));
}

// How often a waiting HTTP thread looks at its client's connection, its timeout and shutdown.
constexpr std::chrono::milliseconds kConnectionPoll{20};

// The routes each method is allowed on (405 with Allow for another method).
const std::map<std::string, std::string, std::less<>>& known_routes() {
  static const std::map<std::string, std::string, std::less<>> routes = {
      {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"}, {"/v1/models", "GET"},
      {"/health", "GET"},          {"/metrics", "GET"},           {"/tokenize", "POST"},
      {"/detokenize", "POST"},     {"/v1/messages", "POST"},      {"/v1/messages/count_tokens", "POST"},
      {"/v1/responses", "POST"},   {"/", "GET"}};
  return routes;
}

// Generation requests admitted at once: the engine's running ones plus max_queued_requests.
int64_t admission_limit(const Engine& engine, const ServerOptions& opt) {
  if (opt.max_queued_requests < 0) throw std::invalid_argument("server: max_queued_requests must not be negative");
  return std::max<int64_t>(engine.options().max_running, 1) + opt.max_queued_requests;
}

// Why a request that the server (not the engine) ended was ended.
enum class Cut { None, ClientGone, Timeout, Shutdown };

// The error a request cut by the server gets.
ErrorInfo cut_error(Cut cut, double timeout, int64_t tokens) {
  const std::string after = " after " + std::to_string(tokens) + " generated tokens";
  if (cut == Cut::Timeout) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", timeout);
    return {504, std::string("the request's timeout of ") + buf + " s passed" + after, "timeout", "timeout_error",
            "request_timeout"};
  }
  return {503, "the server is shutting down: the request was cut" + after, {}, "service_unavailable",
          "server_shutdown"};
}

// What a waiting handler looks at between polls: the client gone, the request's timeout, the
// shutdown's cut; the first of them cancels the request's choices (their last events come
// within one engine step).
struct Watch {
  ServerMetrics& metrics;
  std::shared_ptr<Admission::Flight> flight;
  ClientConnection conn;
  Clock::time_point deadline;
  double timeout = 0;
  Cut cut = Cut::None;

  void check(Generation& gen) {
    if (cut != Cut::None) return;
    if (conn.closed()) cut = Cut::ClientGone, ++metrics.client_gone;
    else if (Clock::now() >= deadline) cut = Cut::Timeout, ++metrics.request_timeouts;
    else if (flight->cut()) cut = Cut::Shutdown, ++metrics.shutdown_cuts;
    if (cut != Cut::None) gen.cancel();
  }
  // A request cancelled by something else while the shutdown cuts (the second signal's
  // cancel_all) counts as cut by the shutdown.
  void settle(FinishReason reason) {
    if (cut == Cut::None && reason == FinishReason::Cancelled && flight->cut())
      cut = Cut::Shutdown, ++metrics.shutdown_cuts;
  }
};

}  // namespace

struct Server::Impl {
  Engine& engine;
  const Tokenizer& tokenizer;
  const GenerationConfig& generation;
  const ModelConfig& model;
  ServerOptions opt;
  ServingContext ctx;
  // The protocols (protocol.h), each over ctx.
  OpenAiProtocol completions_api{Endpoint::Completions, ctx}, chat_api{Endpoint::ChatCompletions, ctx};
  AnthropicMessages messages_api{ctx};
  std::unique_ptr<ResponsesApi> responses_api;
  // The protocol whose error shape a path's errors take: Anthropic's under /v1/messages,
  // OpenAI's elsewhere.
  const Protocol& errors_for(const std::string& path) const {
    if (path.rfind("/v1/messages", 0) == 0) return messages_api;
    return chat_api;
  }
  void send_protocol_error(httplib::Response& res, const std::string& path, const ErrorInfo& e) const {
    res.status = e.status;
    res.set_content(dump(errors_for(path).error_body(e)), "application/json");
  }
  std::unique_ptr<StructuredOutputs> structured;
  HttpCore http;
  int64_t started = unix_time();
  ServerMetrics metrics;  // what /metrics shows beside the engine's figures (metrics.h)
  // The generation requests admitted, the 429 / 503 and the shutdown's drain (admission.h).
  Admission admission;
  // Last: its pools, which run the handlers over everything above, end first.
  HttpListener listener;

  Impl(Engine& e, const Tokenizer& t, const GenerationConfig& g, const ModelConfig& m, ServerOptions o)
      : engine(e),
        tokenizer(t),
        generation(g),
        model(m),
        opt(std::move(o)),
        admission(admission_limit(engine, opt), [this] { listener.wake(); }),
        listener(http, metrics.http, listener_limits(), listener_hooks()) {
    ctx.tokenizer = &tokenizer;
    ctx.generation = &generation;
    ctx.model_name = opt.model_name;
    ctx.context_length = model.max_position_embeddings;
    ctx.max_sequence_tokens = engine.max_sequence_tokens();
    ctx.vocab_size = model.vocab_size;
    ctx.max_output_tokens = opt.max_output_tokens;
    ChosenParsers parsers =
        choose_parsers(model.model_type, tokenizer.chat_template(), opt.tool_call_parser, opt.reasoning_parser);
    ctx.tool_parser = parsers.tool;
    ctx.reasoning_parser = parsers.reasoning;
    ctx.tool_prompt = opt.tool_prompt;
    ctx.chat_template_kwargs = opt.chat_template_kwargs;
    ctx.chat_format = chat_format_for(model.model_type, tokenizer.chat_template());
    structured = std::make_unique<StructuredOutputs>(tokenizer, model.vocab_size);
    ctx.structured = structured.get();
    responses_api = std::make_unique<ResponsesApi>(ctx, opt.responses_store);
    routes();
  }

  HttpListener::Limits listener_limits() const {
    HttpListener::Limits l;
    l.read_timeout = opt.read_timeout;
    l.write_timeout = opt.write_timeout;
    l.max_header_bytes = opt.max_header_bytes;
    l.max_body_bytes = opt.max_body_bytes;
    l.max_connections = opt.max_connections;
    l.work_threads = opt.http_threads > 0 ? size_t(opt.http_threads) : size_t(admission.limit() + 4);
    l.liveness_threads = size_t(std::max(opt.liveness_threads, 1));
    return l;
  }
  // What the listener asks: stopping and the drain are admission's; liveness (GET /health,
  // /metrics, /v1/models) has its own pool, so that it answers whatever the generation load;
  // the listener's own errors take OpenAI's error object.
  HttpListener::Hooks listener_hooks() {
    HttpListener::Hooks h;
    h.stopping = [this] { return admission.stopping(); };
    h.done = [this](Clock::time_point now) { return admission.drained(now); };
    h.liveness = [](const Head& head) {
      return head.method == "GET" &&
             (head.target == "/health" || head.target == "/metrics" || head.target == "/v1/models");
    };
    h.error_body = [](int status, const std::string& message) { return dump(error_body(status, message)); };
    return h;
  }

  void routes();
  // The one request path of every generation endpoint (protocol.h).
  void serve_generation(Protocol& protocol, const httplib::Request& req, httplib::Response& res);
  void stream(std::shared_ptr<Exchange> ex, std::shared_ptr<Watch> watch, httplib::Response& res);
};

void Server::Impl::routes() {
  http.set_payload_max_length(opt.max_body_bytes);
  http.set_keep_alive_timeout(time_t(std::max(1.0, opt.read_timeout)));
  http.set_keep_alive_max_count(1000);

  auto generation_route = [this](const char* path, Protocol& protocol) {
    std::atomic<int64_t>& count = metrics.requests_by_protocol[protocol.name()];
    http.Post(path, [this, &protocol, &count](const httplib::Request& req, httplib::Response& res) {
      ++count;
      serve_generation(protocol, req, res);
    });
  };
  generation_route("/v1/completions", completions_api);
  generation_route("/v1/chat/completions", chat_api);
  generation_route("/v1/messages", messages_api);
  generation_route("/v1/responses", *responses_api);
  http.Post("/v1/messages/count_tokens", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      res.set_content(dump(messages_api.count_tokens(parse_json_body(req.body), req.body)), "application/json");
    } catch (const ApiError& e) {
      send_protocol_error(res, req.path, ErrorInfo::from(e));
    }
  });
  // A stored response (previous_response_id): read or deleted by its id.
  const char* stored = R"(/v1/responses/([A-Za-z0-9_\-]+))";
  http.Get(stored, [this](const httplib::Request& req, httplib::Response& res) {
    try {
      res.set_content(dump(responses_api->get(req.matches[1])), "application/json");
    } catch (const ApiError& e) {
      send_protocol_error(res, req.path, ErrorInfo::from(e));
    }
  });
  http.Delete(stored, [this](const httplib::Request& req, httplib::Response& res) {
    try {
      res.set_content(dump(responses_api->remove(req.matches[1])), "application/json");
    } catch (const ApiError& e) {
      send_protocol_error(res, req.path, ErrorInfo::from(e));
    }
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    ++metrics.liveness_requests;
    json m = {{"id", opt.model_name},
              {"object", "model"},
              {"created", started},
              {"owned_by", "mla"},
              {"max_model_len", engine.max_sequence_tokens()}};
    res.set_content(dump({{"object", "list"}, {"data", json::array({m})}}), "application/json");
  });
  // Agents: /v1/* behind --api-key; the tokenizer's endpoints.
  if (!opt.api_key.empty())
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (req.path.rfind("/v1/", 0) != 0 ||
          authorized(req.get_header_value("Authorization"), req.get_header_value("x-api-key"), opt.api_key))
        return httplib::Server::HandlerResponse::Unhandled;
      ++metrics.http.errors;
      // Refused before its body was read: the connection closes, so that the body is not
      // taken for the next request.
      res.set_header("Connection", "close");
      send_protocol_error(res, req.path,
                          {401, "a valid API key is required: Authorization: Bearer KEY or x-api-key: KEY", {},
                           "authentication_error", "invalid_api_key"});
      return httplib::Server::HandlerResponse::Handled;
    });
  for (const char* path : {"/tokenize", "/detokenize"})
    http.Post(path, [this, path](const httplib::Request& req, httplib::Response& res) {
      try {
        json body = parse_json_body(req.body);
        json out = std::string(path) == "/tokenize" ? tokenize_body(body, tokenizer, engine.max_sequence_tokens())
                                                    : detokenize_body(body, tokenizer);
        res.set_content(dump(out), "application/json");
      } catch (const ApiError& e) {
        send_error(res, e.status, e.what(), e.param, e.type, e.code);
      }
    });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    ++metrics.liveness_requests;
    if (admission.stopping()) {
      res.status = 503;
      res.set_header("Retry-After", "1");
      res.set_content(R"({"status":"draining"})", "application/json");
      return;
    }
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    ++metrics.liveness_requests;
    res.set_content(metrics_text(metrics, admission, engine.stats()), "text/plain; version=0.0.4");
  });
  // The chat page (webui.h): "/" and each of its files, on the work pool, without the API key
  // (the page asks for it when /v1/* answers 401). no-cache: a restarted server's page is
  // fetched again.
  if (opt.webui) {
    auto serve_asset = [](const httplib::Request& req, httplib::Response& res) {
      const WebAsset* a = webui_asset(req.path);
      if (!a) {
        res.status = 404;  // a path the route's pattern matched loosely: the error handler answers
        return;
      }
      res.set_header("Cache-Control", "no-cache");
      res.set_content(std::string(a->body), std::string(a->content_type));
    };
    http.Get("/", serve_asset);
    for (const WebAsset& a : webui_assets()) http.Get(std::string(a.path), serve_asset);
  } else {
    // HEAD / still answers 200: clients such as Claude Code send it to see that the server is up.
    http.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("mla serve: the chat page is off (--no-webui); the API is under /v1\n", "text/plain; charset=utf-8");
    });
  }
  // Statuses without a body (unknown route, wrong method ...) get OpenAI's error object too;
  // a known route asked with another method is a 405 with Allow.
  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                      httplib::Response& res) {
    ++metrics.http.errors;
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg = "request failed with HTTP status " + std::to_string(res.status);
    if (res.status == 400) msg = "malformed request: its request line or headers could not be parsed";
    else if (res.status == 413) msg = "the request body exceeds the limit of " + std::to_string(opt.max_body_bytes) + " bytes";
    else if (res.status == 414) msg = "the request's target is too long";
    if (res.status == 404) {
      auto it = known_routes().find(req.path);
      if (it != known_routes().end() && req.method != it->second) {
        res.status = 405;
        res.set_header("Allow", it->second);
        msg = req.method + " is not allowed on " + req.path + " (only " + it->second + ")";
      } else {
        msg = "no route for " + req.method + " " + req.path;
      }
    }
    send_protocol_error(res, req.path, {res.status, msg, {}, {}, {}});
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg += std::string(": ") + e.what();
    } catch (...) {
    }
    send_error(res, 500, msg);
  });
}

void Server::Impl::serve_generation(Protocol& protocol, const httplib::Request& req, httplib::Response& res) {
  auto fail = [&](const ErrorInfo& e) {
    res.status = e.status;
    res.set_content(dump(protocol.error_body(e)), "application/json");
  };
  try {
    Admission::Refusal refused;
    std::shared_ptr<Admission::Flight> flight = admission.admit(refused);  // from here on it counts in flight
    if (!flight) {
      ++(refused == Admission::Refusal::Draining ? metrics.rejected_draining : metrics.rejected_queue_full);
      res.set_header("Retry-After", "1");
      throw admission.refusal_error(refused);
    }
    std::shared_ptr<Exchange> ex = protocol.parse(parse_json_body(req.body), req.body);
    const ParsedRequest& p = ex->request;
    auto watch = std::make_shared<Watch>(Watch{
        metrics, flight,
        serving_socket() >= 0 ? ClientConnection(serving_socket())
                            : ClientConnection(req.remote_addr, req.remote_port, req.local_addr, req.local_port),
        p.timeout_seconds > 0 ? Clock::now() + seconds(p.timeout_seconds) : Clock::time_point::max(),
        p.timeout_seconds});
    if (p.stream) {
      stream(ex, watch, res);
      return;
    }
    std::optional<RequestEvent> failed;  // the first choice that ended with an error or cancelled
    // Throws RequestError before anything is queued: answered 400 below.
    Generation gen(engine, p, tokenizer);
    Usage u;
    u.prompt_tokens = int64_t(p.request.prompt.size());
    int64_t open = gen.choices();
    while (open > 0) {
      for (Generation::Event& ev : gen.wait(kConnectionPoll)) {
        const RequestEvent& e = ev.event;
        if (ev.choice == 0) u.prompt_tokens = e.prompt_tokens, u.cached_tokens = e.cached_tokens;
        if (e.finished && (e.reason == FinishReason::Error || e.reason == FinishReason::Cancelled)) {
          if (watch->cut == Cut::None) gen.cancel();  // the others have no answer to go into
          if (!failed) failed = e;
          if (e.reason == FinishReason::Cancelled) watch->settle(e.reason);
        } else {
          ex->add(ev.choice, e);
        }
        if (e.finished) --open;
      }
      if (open > 0) watch->check(gen);
    }
    if (watch->cut == Cut::ClientGone) return;  // nobody to answer
    u.completion_tokens = ex->completion_tokens();
    if (failed && failed->reason == FinishReason::Cancelled && watch->cut != Cut::None)
      return fail(cut_error(watch->cut, watch->timeout, u.completion_tokens));
    if (failed && failed->reason == FinishReason::Error) throw ApiError(500, "generation failed: " + failed->message);
    if (failed) throw ApiError(503, "the request was cancelled: " + failed->message);
    res.set_content(dump(ex->body(u)), "application/json");
  } catch (const ApiError& e) {
    fail(ErrorInfo::from(e));
  } catch (const RequestError& e) {
    fail({400, e.what(), "messages", {}, {}});
  }
}

void Server::Impl::stream(std::shared_ptr<Exchange> ex, std::shared_ptr<Watch> watch, httplib::Response& res) {
  ++metrics.http_streams;
  // Throws RequestError before anything is sent: the caller answers 400.
  auto gen = std::make_shared<Generation>(engine, ex->request, tokenizer);
  struct StreamState {
    int64_t open = 0;
    bool begun = false;
    Usage usage;
    Clock::time_point last_write = Clock::now();
  };
  auto st = std::make_shared<StreamState>();
  st->open = gen->choices();
  st->usage.prompt_tokens = int64_t(ex->request.request.prompt.size());
  const auto keepalive = seconds(opt.keepalive_seconds);
  res.set_header("Cache-Control", "no-cache");
  // The provider holds the watch (and with it the flight) until the response is written.
  res.set_chunked_content_provider(
      "text/event-stream",
      [ex, gen, st, watch, keepalive](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) {
          st->last_write = Clock::now();
          return s.empty() || sink.write(s.data(), s.size());
        };
        bool ok = true;
        if (!st->begun) {
          st->begun = true;
          ok = write(ex->stream_begin(st->usage));
        }
        std::deque<Generation::Event> events;
        // The watch is checked after every wait, not only an idle one: a stream whose tokens
        // never stop coming must still see its client go, its timeout pass and the shutdown cut.
        // While nothing comes (a long prompt being read) the client gets keep-alives.
        while (ok && events.empty()) {
          events = gen->wait(kConnectionPoll);
          watch->check(*gen);
          if (watch->cut == Cut::ClientGone) ok = false;
          else if (events.empty() && Clock::now() - st->last_write >= keepalive) ok = write(ex->stream_keepalive());
        }
        for (Generation::Event& ev : events) {
          if (!ok) break;
          const RequestEvent& e = ev.event;
          if (ev.choice == 0) st->usage.prompt_tokens = e.prompt_tokens, st->usage.cached_tokens = e.cached_tokens;
          if (e.finished && (e.reason == FinishReason::Error || e.reason == FinishReason::Cancelled)) {
            gen->cancel();
            if (e.reason == FinishReason::Cancelled) watch->settle(e.reason);
            st->usage.completion_tokens = ex->completion_tokens();
            ErrorInfo error;
            if (e.reason == FinishReason::Cancelled && watch->cut != Cut::None) {
              error = cut_error(watch->cut, watch->timeout, st->usage.completion_tokens);
            } else {
              error.status = e.reason == FinishReason::Error ? 500 : 503;
              error.message = std::string("generation ended: ") + finish_reason_name(e.reason) +
                              (e.message.empty() ? "" : ": " + e.message);
            }
            ok = write(ex->stream_error(error, st->usage));
            if (ok) sink.done();
            return ok;
          }
          ok = write(ex->stream_event(ev.choice, e));
          if (!e.finished || --st->open > 0) continue;
          st->usage.completion_tokens = ex->completion_tokens();
          if (ok) ok = write(ex->stream_end(st->usage));
          if (ok) sink.done();
          return ok;
        }
        if (!ok) gen->cancel();  // the client went away (or never read): free the pages
        return ok;
      },
      [gen](bool success) {
        if (!success) gen->cancel();
      });
}

Server::Server(Engine& engine, const Tokenizer& tokenizer, const GenerationConfig& generation,
               const ModelConfig& model, ServerOptions opt)
    : impl_(std::make_unique<Impl>(engine, tokenizer, generation, model, std::move(opt))) {}

Server::~Server() {
  stop_now();
  impl_->listener.stop_pools();
}

int Server::bind() { return impl_->listener.bind(impl_->opt.host, impl_->opt.port); }

void Server::listen() {
  Impl& m = *impl_;
  if (!m.listener.bound()) throw std::logic_error("server: listen() before bind()");
  m.listener.run();
}

void Server::stop() {
  Impl& m = *impl_;
  m.admission.stop(Clock::now() + seconds(m.opt.shutdown_timeout));
  m.listener.wake();
}

void Server::stop_now() {
  Impl& m = *impl_;
  m.admission.stop_now(Clock::now() + seconds(m.opt.shutdown_timeout));
  m.listener.wake();
}

bool Server::draining() const { return impl_->admission.stopping(); }

int Server::port() const { return impl_->listener.port(); }

std::string Server::metrics() const { return metrics_text(impl_->metrics, impl_->admission, impl_->engine.stats()); }

}  // namespace mla::server
