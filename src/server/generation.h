// A parsed request's choices running on the engine: n requests for one prompt, each sampling
// with its own seed (seed + i), logits processor (logit_bias; the grammar of a response_format
// or a forced tool call, each choice with its own matcher) and events gathered into one queue
// for the HTTP thread. Choices after the first are submitted when the first has read the
// prompt (its first event), so that they take the prompt's full pages from the prefix cache
// instead of computing them again (with --no-prefix-cache they compute them).
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/engine.h"
#include "server/api_common.h"

namespace mla::server {

// The request of choice i: seed + i, its own logits processor (logit_bias, then the grammar's
// mask, which starts after "</think>" when the prompt opened a reasoning block).
Request choice_request(const ParsedRequest& p, int64_t choice, const Tokenizer& tokenizer);

class Generation {
 public:
  struct Event {
    int choice = 0;
    RequestEvent event;
  };
  // Submits the first choice; throws RequestError (nothing queued) as Engine::submit.
  Generation(Engine& engine, const ParsedRequest& p, const Tokenizer& tokenizer);
  ~Generation();  // cancels what is still running
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // The events so far; waits up to timeout for the first.
  std::deque<Event> wait(std::chrono::milliseconds timeout);
  void cancel();
  int64_t choices() const { return n_; }

 private:
  struct State;
  std::shared_ptr<State> state_;
  int64_t n_;
};

}  // namespace mla::server
