// HTTP routes, streaming and metrics of the OpenAI-compatible server (see server.h).
#include "server/server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>

#include "server/connection.h"
#include "server/openai.h"

namespace mla::server {

using nlohmann::json;

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

// Events of one request, filled by the engine thread, drained by the HTTP thread.
struct EventQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<RequestEvent> events;
  void push(const RequestEvent& e) {
    {
      std::lock_guard lk(mu);
      events.push_back(e);
    }
    cv.notify_one();
  }
  // The events so far; waits up to `timeout` for the first.
  std::deque<RequestEvent> pop_for(std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu);
    cv.wait_for(lk, timeout, [&] { return !events.empty(); });
    std::deque<RequestEvent> out;
    out.swap(events);
    return out;
  }
};

// How often a waiting HTTP thread looks at its client's connection.
constexpr std::chrono::milliseconds kConnectionPoll{20};

}  // namespace

struct Server::Impl {
  Engine& engine;
  const Tokenizer& tokenizer;
  const GenerationConfig& generation;
  const ModelConfig& model;
  ServerOptions opt;
  ServingContext ctx;
  httplib::Server http;
  int port = -1;
  int64_t started = unix_time();
  std::atomic<bool> stopping{false}, in_listen{false}, stop_sent{false};
  // Counters for /metrics.
  std::atomic<int64_t> http_completions{0}, http_chat{0}, http_errors{0}, http_streams{0};

  Impl(Engine& e, const Tokenizer& t, const GenerationConfig& g, const ModelConfig& m, ServerOptions o)
      : engine(e), tokenizer(t), generation(g), model(m), opt(std::move(o)) {
    ctx.tokenizer = &tokenizer;
    ctx.generation = &generation;
    ctx.model_name = opt.model_name;
    ctx.context_length = model.max_position_embeddings;
    ctx.max_sequence_tokens = engine.max_sequence_tokens();
    routes();
  }

  void routes();
  void generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
  void stream(const ParsedRequest& p, const httplib::Request& req, httplib::Response& res);
  std::string metrics() const;
};

void Server::Impl::routes() {
  size_t threads = opt.http_threads > 0 ? size_t(opt.http_threads)
                                        : size_t(std::max<int64_t>(16, engine.options().max_running + 4));
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(64u << 20);

  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    ++http_completions;
    generate(Endpoint::Completions, req, res);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    ++http_chat;
    generate(Endpoint::ChatCompletions, req, res);
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json m = {{"id", opt.model_name},
              {"object", "model"},
              {"created", started},
              {"owned_by", "mla"},
              {"max_model_len", engine.max_sequence_tokens()}};
    res.set_content(dump({{"object", "list"}, {"data", json::array({m})}}), "application/json");
  });
  http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics(), "text/plain; version=0.0.4");
  });
  // Statuses without a body (unknown route, wrong method ...) get OpenAI's error object too.
  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                      httplib::Response& res) {
    ++http_errors;
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg = res.status == 404 ? "no route for " + req.method + " " + req.path
                                        : "request failed with HTTP status " + std::to_string(res.status);
    send_error(res, res.status, msg);
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

void Server::Impl::generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
  ParsedRequest p;
  try {
    json body;
    try {
      body = json::parse(req.body);
    } catch (const json::parse_error& e) {
      throw ApiError(400, std::string("the body is not valid JSON: ") + e.what());
    }
    p = parse_request(endpoint, body, ctx);
    if (stopping) throw ApiError(503, "the server is shutting down");
    if (p.stream) {
      stream(p, req, res);
      return;
    }
    const std::string id = new_response_id(endpoint);
    const int64_t created = unix_time();
    // Throws RequestError before anything is queued: answered 400 below.
    auto queue = std::make_shared<EventQueue>();
    const int64_t rid = engine.submit(p.request, [queue](const RequestEvent& e) { queue->push(e); });
    ClientConnection conn(req.remote_addr, req.remote_port, req.local_addr, req.local_port);
    RequestResult r;
    bool client_gone = false;
    while (!r.finished) {
      for (const RequestEvent& e : queue->pop_for(kConnectionPoll)) r.add(e);
      if (!r.finished && !client_gone && conn.closed()) {
        client_gone = true;
        engine.cancel(rid);  // its last event comes within one engine step
      }
    }
    if (client_gone) return;  // nobody to answer
    if (r.reason == FinishReason::Error) throw ApiError(500, "generation failed: " + r.message);
    if (r.reason == FinishReason::Cancelled) throw ApiError(503, "the request was cancelled: " + r.message);
    Usage u{r.prompt_tokens, int64_t(r.tokens.size()), r.cached_tokens};
    res.set_content(dump(completion_response(p, id, created, r.text, openai_finish_reason(r.reason), u)),
                    "application/json");
  } catch (const ApiError& e) {
    send_error(res, e.status, e.what(), e.param, e.type, e.code);
  } catch (const RequestError& e) {
    send_error(res, 400, e.what(), endpoint == Endpoint::Completions ? "prompt" : "messages");
  }
}

void Server::Impl::stream(const ParsedRequest& p, const httplib::Request& req, httplib::Response& res) {
  ++http_streams;
  auto queue = std::make_shared<EventQueue>();
  // Throws RequestError before anything is sent: the caller answers 400.
  const int64_t rid = engine.submit(p.request, [queue](const RequestEvent& e) { queue->push(e); });
  const std::string id = new_response_id(p.endpoint);
  const int64_t created = unix_time();
  auto sent_role = std::make_shared<bool>(false);
  auto conn = std::make_shared<ClientConnection>(req.remote_addr, req.remote_port, req.local_addr, req.local_port);
  Engine* eng = &engine;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [queue, p, id, created, rid, sent_role, conn, eng](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
        bool ok = true;
        if (p.endpoint == Endpoint::ChatCompletions && !*sent_role) {
          *sent_role = true;
          ok = write(sse_event(stream_chunk(p, id, created, "", nullptr, true)));
        }
        std::deque<RequestEvent> events;
        while (ok && events.empty()) {
          events = queue->pop_for(kConnectionPoll);
          if (events.empty() && conn->closed()) ok = false;
        }
        for (const RequestEvent& e : events) {
          if (!ok) break;
          if (!e.text.empty()) ok = write(sse_event(stream_chunk(p, id, created, e.text, nullptr)));
          if (!e.finished) continue;
          if (e.reason == FinishReason::Error || e.reason == FinishReason::Cancelled) {
            int status = e.reason == FinishReason::Error ? 500 : 503;
            ok = ok && write(sse_event(error_body(status, std::string("generation ended: ") +
                                                              finish_reason_name(e.reason) +
                                                              (e.message.empty() ? "" : ": " + e.message))));
          } else {
            ok = ok && write(sse_event(stream_chunk(p, id, created, "", openai_finish_reason(e.reason))));
          }
          if (ok && p.include_usage)
            ok = write(sse_event(usage_chunk(p, id, created, {e.prompt_tokens, e.completion_tokens, e.cached_tokens})));
          if (ok) ok = write(kSseDone);
          if (ok) sink.done();
          return ok;
        }
        if (!ok) eng->cancel(rid);  // the client went away
        return ok;
      },
      [eng, rid](bool success) {
        if (!success) eng->cancel(rid);
      });
}

std::string Server::Impl::metrics() const {
  EngineStats s = engine.stats();
  std::ostringstream o;
  auto line = [&](const char* name, const char* help, const char* type, int64_t v) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n" << name << " " << v << "\n";
  };
  o << "# HELP mla_http_requests_total HTTP requests to the generation endpoints\n"
    << "# TYPE mla_http_requests_total counter\n"
    << "mla_http_requests_total{endpoint=\"completions\"} " << http_completions.load() << "\n"
    << "mla_http_requests_total{endpoint=\"chat_completions\"} " << http_chat.load() << "\n";
  line("mla_http_streams_total", "streamed (server-sent events) responses", "counter", http_streams.load());
  line("mla_http_errors_total", "responses with an error status", "counter", http_errors.load());
  line("mla_requests_submitted_total", "requests given to the engine", "counter", s.requests_submitted);
  line("mla_requests_finished_total", "requests ended (any reason)", "counter", s.requests_finished);
  line("mla_requests_cancelled_total", "requests cancelled (client gone, shutdown)", "counter", s.requests_cancelled);
  line("mla_requests_running", "sequences in the running batch", "gauge", s.running);
  line("mla_requests_waiting", "requests queued for admission", "gauge", s.waiting);
  line("mla_prompt_tokens_total", "prompt tokens of admitted requests", "counter", s.prompt_tokens);
  line("mla_prefix_cache_hit_tokens_total", "prompt tokens taken from the prefix cache", "counter",
       s.prefix_hit_tokens);
  line("mla_generation_tokens_total", "tokens sampled", "counter", s.generation_tokens);
  line("mla_computed_tokens_total", "tokens run through the model (prefill, recompute, decode)", "counter",
       s.computed_tokens);
  line("mla_preemptions_total", "sequences preempted for pages (recomputed later)", "counter", s.preemptions);
  line("mla_engine_steps_total", "forward passes of the engine", "counter", s.steps);
  line("mla_kv_pages_total", "pages of the latent KV cache", "gauge", s.kv_pages_total);
  line("mla_kv_pages_used", "pages in use (sequences and prefix cache)", "gauge", s.kv_pages_total - s.kv_pages_free);
  line("mla_kv_pages_free", "free pages", "gauge", s.kv_pages_free);
  line("mla_kv_pages_prefix_cache", "pages only the prefix cache holds", "gauge", s.kv_pages_prefix_cache);
  line("mla_kv_page_size_tokens", "tokens per page", "gauge", s.kv_page_size);
  line("mla_kv_bytes_per_token", "latent cache bytes per token, all layers", "gauge", s.kv_bytes_per_token);
  line("mla_prefix_cache_entries", "entries of the prefix cache", "gauge", s.prefix_cache_entries);
  o << "# HELP mla_batches_total forward passes by attention path\n# TYPE mla_batches_total counter\n"
    << "mla_batches_total{path=\"expand\"} " << s.paths.expand << "\n"
    << "mla_batches_total{path=\"absorb\"} " << s.paths.absorb << "\n"
    << "mla_batches_total{path=\"chunked\"} " << s.paths.chunked << "\n";
  return o.str();
}

Server::Server(Engine& engine, const Tokenizer& tokenizer, const GenerationConfig& generation,
               const ModelConfig& model, ServerOptions opt)
    : impl_(std::make_unique<Impl>(engine, tokenizer, generation, model, std::move(opt))) {}

Server::~Server() { stop(); }

int Server::bind() {
  Impl& m = *impl_;
  if (m.opt.port < 0 || m.opt.port > 65535)
    throw std::runtime_error("server: port " + std::to_string(m.opt.port) + " is out of range");
  if (m.opt.port == 0) {
    m.port = m.http.bind_to_any_port(m.opt.host);
    if (m.port < 0) throw std::runtime_error("server: cannot bind " + m.opt.host + " on any port");
  } else {
    if (!m.http.bind_to_port(m.opt.host, m.opt.port))
      throw std::runtime_error("server: cannot bind " + m.opt.host + ":" + std::to_string(m.opt.port) +
                               " (in use, or not an address of this machine)");
    m.port = m.opt.port;
  }
  return m.port;
}

void Server::listen() {
  Impl& m = *impl_;
  if (m.port < 0) throw std::logic_error("server: listen() before bind()");
  m.in_listen = true;
  if (!m.stopping) m.http.listen_after_bind();
  m.in_listen = false;
}

void Server::stop() {
  Impl& m = *impl_;
  m.stopping = true;
  // listen() may be between its check and the accept loop: wait until it runs, then stop it.
  while (m.in_listen && !m.http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (m.http.is_running() && !m.stop_sent.exchange(true)) m.http.stop();
}

int Server::port() const { return impl_->port; }

std::string Server::metrics() const { return impl_->metrics(); }

}  // namespace mla::server
