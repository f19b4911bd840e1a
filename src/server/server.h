// The HTTP server (cpp-httplib) over the Engine, one request path under every API (protocol.h):
//   POST /v1/completions, POST /v1/chat/completions (OpenAI; api_openai.h)
//   POST /v1/messages, POST /v1/messages/count_tokens (Anthropic; api_anthropic.h)
//   POST /v1/responses, GET and DELETE /v1/responses/{id} (OpenAI Responses; api_responses.h)
//   GET  /v1/models, /health, /metrics (plain text)
//   POST /tokenize, /detokenize (llama-server / vLLM shapes; agent_api.h)
//   GET  / and its files: the chat page (webui.h; off with ServerOptions::webui = false)
// Each generation endpoint answers JSON, or server-sent events with "stream": true. The layers:
// the HTTP layer, which knows no API (http_io.h, http_listener.h); admission and drain
// (admission.h) and the /metrics text (metrics.h); one adapter per protocol (protocol.h); the
// routes and the one request path over them (server.cpp).
//
// Connections: one listener thread accepts every connection and reads each request (head and
// body) without blocking, under limits: the head's size (431), the body's size (413, from its
// Content-Length, before it is read), a deadline for the whole request (slow senders get 408,
// idle keep-alive connections are closed), a number of open connections (503). Only a
// complete request is handed to a thread, of one of two pools: the work pool (generation,
// /tokenize, /detokenize, errors) or the liveness pool (GET /health, /metrics, /v1/models), so
// liveness answers in milliseconds whatever the generation load. cpp-httplib parses, routes and
// writes the response on that thread (its process_request over the listener's stream).
//
// Back-pressure: at most max_running + max_queued_requests generation requests are admitted
// at once; the next is answered 429 at once (OpenAI's error object, Retry-After). Each
// admitted request is parsed (the body's nesting depth is checked before anything recursive
// touches it, api_common.h) and tokenised, submitted to the engine, and waits for (or streams) its
// tokens. While it waits it watches the client's connection (connection.h): a client that
// goes away, streamed or not, has its request cancelled, and its pages freed, within one
// engine step; a request's own "timeout" ends it the same way, answered 504 (or an error
// event).
//
// Shutdown: stop() stops admitting (503 for new generation requests, /health 503
// "draining"), lets the requests in flight run up to shutdown_timeout seconds, then cuts the
// rest: a stream gets an error event and data: [DONE], a plain request a 503; stop_now()
// cuts at once. Bad requests get OpenAI's error object with a 4xx status; nothing a client
// sends ends the process.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/generation_config.h"
#include "engine/engine.h"
#include "model/config.h"
#include "tokenizer/tokenizer.h"

namespace mla::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;          // 0: a free port, chosen at bind()
  std::string model_name;   // the name /v1/models lists and responses carry
  int http_threads = 0;     // work-pool threads; 0: max_running + max_queued_requests + 4
  // Agents (see agent_api.h): the output parsers ("": chosen from the checkpoint; "none": off),
  // the chat template variables every request starts from, and the key /v1/* require.
  std::string tool_call_parser, reasoning_parser;
  // A chat template that never reads `tools` (DeepSeek-V3 / R1's) gets the request's tools
  // written into the system prompt in the tool parser's syntax (chat_request.h); false: never.
  bool tool_prompt = true;
  nlohmann::json chat_template_kwargs = nlohmann::json::object();
  std::string api_key;      // empty: no authentication
  bool webui = true;        // GET / serves the chat page (webui.h), outside the API key
  // Limits (see above).
  int64_t max_queued_requests = 128;  // generation requests admitted beyond the running ones
  double shutdown_timeout = 30;       // seconds stop() lets the requests in flight run
  double read_timeout = 10;           // seconds for a whole request to arrive (and keep-alive idling)
  double write_timeout = 10;          // seconds a client may leave one write unread
  double keepalive_seconds = 5;       // a stream with nothing to send for this long gets a keep-alive event
  size_t max_body_bytes = size_t(16) << 20;
  size_t max_header_bytes = size_t(16) << 10;  // request line and headers
  int max_connections = 1024;                   // open connections; more are answered 503
  int liveness_threads = 2;
  int64_t max_output_tokens = 0;  // the most tokens one request generates (0: the room left)
  size_t responses_store = 256;   // responses kept for previous_response_id (0: none)
};

class Server {
 public:
  // The engine (with its engine thread started), tokenizer and configs must outlive the server.
  Server(Engine& engine, const Tokenizer& tokenizer, const GenerationConfig& generation,
         const ModelConfig& model, ServerOptions opt);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port; returns the port. Throws std::runtime_error when it cannot.
  int bind();
  // Serves until stop() (call bind() first). Returns once the requests in flight are answered
  // or cut.
  void listen();
  // Graceful shutdown: no new generation requests (503), the ones in flight run up to
  // shutdown_timeout seconds, then are cut. Thread-safe, also before listen() runs.
  void stop();
  // Cuts the requests in flight now (a stream's error event and [DONE]; a 503) and ends
  // listen() as soon as they are answered. Thread-safe.
  void stop_now();
  bool draining() const;
  int port() const;
  // The /metrics text.
  std::string metrics() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mla::server
