// HTTP routes, streaming and metrics of the OpenAI-compatible server (see server.h).
#include "server/server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "server/agent_api.h"
#include "server/choice.h"
#include "server/connection.h"
#include "server/generation.h"
#include "server/openai.h"
#include "server/structured.h"

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
  std::unique_ptr<StructuredOutputs> structured;
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
    ctx.vocab_size = model.vocab_size;
    ChosenParsers parsers =
        choose_parsers(model.model_type, tokenizer.chat_template(), opt.tool_call_parser, opt.reasoning_parser);
    ctx.tool_parser = parsers.tool;
    ctx.reasoning_parser = parsers.reasoning;
    ctx.chat_template_kwargs = opt.chat_template_kwargs;
    structured = std::make_unique<StructuredOutputs>(tokenizer, model.vocab_size);
    ctx.structured = structured.get();
    routes();
  }

  void routes();
  void generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
  void stream(std::shared_ptr<const ParsedRequest> p, const httplib::Request& req, httplib::Response& res);
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
  // Agents: /v1/* behind --api-key; the tokenizer's endpoints.
  if (!opt.api_key.empty())
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (req.path.rfind("/v1/", 0) != 0 || authorized(req.get_header_value("Authorization"), opt.api_key))
        return httplib::Server::HandlerResponse::Unhandled;
      ++http_errors;
      send_error(res, 401, "a valid API key is required: Authorization: Bearer KEY", {}, "authentication_error",
                 "invalid_api_key");
      return httplib::Server::HandlerResponse::Handled;
    });
  for (const char* path : {"/tokenize", "/detokenize"})
    http.Post(path, [this, path](const httplib::Request& req, httplib::Response& res) {
      try {
        json body = json::parse(req.body, nullptr, false);
        if (body.is_discarded()) throw ApiError(400, "the body is not valid JSON");
        json out = std::string(path) == "/tokenize" ? tokenize_body(body, tokenizer, engine.max_sequence_tokens())
                                                    : detokenize_body(body, tokenizer);
        res.set_content(dump(out), "application/json");
      } catch (const ApiError& e) {
        send_error(res, e.status, e.what(), e.param, e.type, e.code);
      }
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
    p = parse_request(endpoint, body, ctx, req.body);
    if (stopping) throw ApiError(503, "the server is shutting down");
    if (p.stream) {
      stream(std::make_shared<const ParsedRequest>(std::move(p)), req, res);
      return;
    }
    const std::string id = new_response_id(endpoint);
    const int64_t created = unix_time();
    std::optional<RequestEvent> failed;  // the first choice that ended with an error or cancelled
    // Throws RequestError before anything is queued: answered 400 below.
    Generation gen(engine, p, tokenizer);
    std::vector<ChoiceBuilder> choices;
    for (int64_t i = 0; i < gen.choices(); ++i) choices.emplace_back(p, tokenizer, int(i));
    ClientConnection conn(req.remote_addr, req.remote_port, req.local_addr, req.local_port);
    Usage u;
    int64_t open = gen.choices();
    bool client_gone = false;
    while (open > 0) {
      for (Generation::Event& ev : gen.wait(kConnectionPoll)) {
        const RequestEvent& e = ev.event;
        ChoiceBuilder& c = choices[size_t(ev.choice)];
        if (ev.choice == 0) u.prompt_tokens = e.prompt_tokens, u.cached_tokens = e.cached_tokens;
        if (e.finished && (e.reason == FinishReason::Error || e.reason == FinishReason::Cancelled)) {
          if (!client_gone) gen.cancel();  // the others have no answer to go into
          if (!failed) failed = e;
        } else {
          c.add(e);
        }
        if (e.finished) --open;
      }
      if (open > 0 && !client_gone && conn.closed()) {
        client_gone = true;
        gen.cancel();  // the last events come within one engine step
      }
    }
    if (client_gone) return;  // nobody to answer
    if (failed && failed->reason == FinishReason::Error) throw ApiError(500, "generation failed: " + failed->message);
    if (failed) throw ApiError(503, "the request was cancelled: " + failed->message);
    json list = json::array();
    for (const ChoiceBuilder& c : choices) {
      list.push_back(c.choice());
      u.completion_tokens += c.completion_tokens();
    }
    json out = completion_response(p, id, created, "", "stop", u);
    out["choices"] = list;
    res.set_content(dump(out), "application/json");
  } catch (const ApiError& e) {
    send_error(res, e.status, e.what(), e.param, e.type, e.code);
  } catch (const RequestError& e) {
    send_error(res, 400, e.what(), endpoint == Endpoint::Completions ? "prompt" : "messages");
  }
}

void Server::Impl::stream(std::shared_ptr<const ParsedRequest> p, const httplib::Request& req,
                          httplib::Response& res) {
  ++http_streams;
  // Throws RequestError before anything is sent: the caller answers 400.
  auto gen = std::make_shared<Generation>(engine, *p, tokenizer);
  struct StreamState {
    std::vector<ChoiceBuilder> choices;
    int64_t open = 0;
    bool sent_role = false;
    Usage usage;
  };
  auto st = std::make_shared<StreamState>();
  for (int64_t i = 0; i < gen->choices(); ++i) st->choices.emplace_back(*p, tokenizer, int(i));
  st->open = gen->choices();
  const std::string id = new_response_id(p->endpoint);
  const int64_t created = unix_time();
  auto conn = std::make_shared<ClientConnection>(req.remote_addr, req.remote_port, req.local_addr, req.local_port);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [p, gen, st, id, created, conn](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
        auto chunk = [&](json choice) {
          json c = stream_chunk(*p, id, created, "", nullptr);
          c["choices"] = json::array({std::move(choice)});
          return write(sse_event(c));
        };
        bool ok = true;
        if (p->endpoint == Endpoint::ChatCompletions && !st->sent_role) {
          st->sent_role = true;
          for (size_t i = 0; i < st->choices.size() && ok; ++i)
            ok = chunk({{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                        {"finish_reason", nullptr}});
        }
        std::deque<Generation::Event> events;
        while (ok && events.empty()) {
          events = gen->wait(kConnectionPoll);
          if (events.empty() && conn->closed()) ok = false;
        }
        for (Generation::Event& ev : events) {
          if (!ok) break;
          const RequestEvent& e = ev.event;
          if (ev.choice == 0) st->usage.prompt_tokens = e.prompt_tokens, st->usage.cached_tokens = e.cached_tokens;
          if (e.finished && (e.reason == FinishReason::Error || e.reason == FinishReason::Cancelled)) {
            int status = e.reason == FinishReason::Error ? 500 : 503;
            gen->cancel();
            ok = write(sse_event(error_body(status, std::string("generation ended: ") + finish_reason_name(e.reason) +
                                                        (e.message.empty() ? "" : ": " + e.message))));
            if (ok) ok = write(kSseDone);
            if (ok) sink.done();
            return ok;
          }
          for (json& c : st->choices[size_t(ev.choice)].stream(e))
            if (ok) ok = chunk(std::move(c));
          if (!e.finished) continue;
          st->usage.completion_tokens += st->choices[size_t(ev.choice)].completion_tokens();
          if (--st->open > 0) continue;
          if (ok && p->include_usage) ok = write(sse_event(usage_chunk(*p, id, created, st->usage)));
          if (ok) ok = write(kSseDone);
          if (ok) sink.done();
          return ok;
        }
        if (!ok) gen->cancel();  // the client went away
        return ok;
      },
      [gen](bool success) {
        if (!success) gen->cancel();
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
  // Speculative decoding (engine/speculative.h): drafts verified and accepted, and what a
  // verify step yields.
  line("mla_spec_draft_tokens_total", "draft tokens verified", "counter", s.spec_draft_tokens);
  line("mla_spec_accepted_tokens_total", "draft tokens accepted", "counter", s.spec_accepted_tokens);
  line("mla_spec_verify_steps_total", "sequence-steps that verified drafts", "counter", s.spec_steps);
  o << "# HELP mla_spec_acceptance_rate accepted / drafted\n# TYPE mla_spec_acceptance_rate gauge\n"
    << "mla_spec_acceptance_rate " << s.spec_acceptance_rate() << "\n"
    << "# HELP mla_spec_tokens_per_step tokens a verify step yields\n# TYPE mla_spec_tokens_per_step gauge\n"
    << "mla_spec_tokens_per_step " << s.spec_tokens_per_step() << "\n";
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
