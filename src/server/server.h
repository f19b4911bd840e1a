// The OpenAI-compatible HTTP server (cpp-httplib) over the Engine:
//   POST /v1/completions, POST /v1/chat/completions (JSON, or server-sent events with stream)
//   GET  /v1/models, /health, /metrics (plain text)
//   POST /tokenize, /detokenize (llama-server / vLLM shapes; agent_api.h)
// Each HTTP request runs on one of the server's threads: it parses and tokenises, submits to
// the engine and waits for (or streams) the tokens the engine thread produces. While it waits
// it watches the client's connection (connection.h): a client that goes away, streamed or
// not, has its request cancelled, and its pages freed, within one engine step. Bad requests
// get OpenAI's error object with a 4xx status; nothing a client sends ends the process.
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
  int http_threads = 0;     // 0: enough for the engine's running sequences and a few more
  // Agents (see agent_api.h): the output parsers ("": chosen from the checkpoint; "none": off),
  // the chat template variables every request starts from, and the key /v1/* require.
  std::string tool_call_parser, reasoning_parser;
  nlohmann::json chat_template_kwargs = nlohmann::json::object();
  std::string api_key;      // empty: no authentication
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
  // Serves until stop() (call bind() first). Returns once the requests in flight are answered.
  void listen();
  // Stops accepting; thread-safe, also before listen() runs.
  void stop();
  int port() const;
  // The /metrics text.
  std::string metrics() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mla::server
