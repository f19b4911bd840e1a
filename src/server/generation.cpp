// The choices of one request on the engine (see generation.h).
#include "server/generation.h"

#include "engine/grammar_processor.h"

namespace mla::server {

Request choice_request(const ParsedRequest& p, int64_t choice, const Tokenizer& tokenizer) {
  Request r = p.request;
  r.sampling.seed = p.request.sampling.seed + uint64_t(choice);
  LogitsProcessor inner = p.request.logits_processor;
  if (p.grammar) {
    LogitsProcessor mask =
        grammar_processor(p.grammar, p.request.prompt.size(), &tokenizer, p.reasoning_opened ? "</think>" : "");
    inner = inner ? LogitsProcessor([inner, mask](std::span<float> l, std::span<const int32_t> t) {
      inner(l, t);
      mask(l, t);
    })
                  : mask;
  }
  if (!p.agent.logit_bias.empty()) {
    auto bias = p.agent.logit_bias;
    r.logits_processor = [bias, inner](std::span<float> logits, std::span<const int32_t> tokens) {
      for (auto& [id, b] : bias)
        if (size_t(id) < logits.size()) logits[size_t(id)] += b;
      if (inner) inner(logits, tokens);
    };
  } else {
    r.logits_processor = inner;
  }
  return r;
}

struct Generation::State {
  Engine* engine = nullptr;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Event> events;
  std::vector<int64_t> ids;  // request id of each submitted choice
  std::vector<bool> done;
  bool cancelled = false;
  bool forked = false;

  void push(int choice, const RequestEvent& e) {
    {
      std::lock_guard lk(mu);
      if (e.finished) done[size_t(choice)] = true;
      events.push_back({choice, e});
    }
    cv.notify_one();
  }
};

Generation::Generation(Engine& engine, const ParsedRequest& p, const Tokenizer& tokenizer) : state_(std::make_shared<State>()), n_(p.agent.n) {
  State& st = *state_;
  st.engine = &engine;
  st.ids.assign(size_t(n_), -1);
  st.done.assign(size_t(n_), false);
  std::vector<Request> rest;
  for (int64_t i = 1; i < n_; ++i) rest.push_back(choice_request(p, i, tokenizer));
  auto shared_rest = std::make_shared<std::vector<Request>>(std::move(rest));
  std::weak_ptr<State> weak = state_;
  // The first choice's callback submits the others at its first event (on the engine thread,
  // which may submit): its prompt is then in the prefix cache.
  auto fork = [weak, shared_rest](const RequestEvent& e) {
    auto st = weak.lock();
    if (!st) return;
    bool skip;
    {
      std::lock_guard lk(st->mu);
      if (st->forked) return;
      st->forked = true;
      skip = st->cancelled || (e.finished && (e.reason == FinishReason::Cancelled || e.reason == FinishReason::Error));
    }
    if (skip) {  // the others end as the first did, unsubmitted
      for (size_t i = 0; i < shared_rest->size(); ++i) {
        RequestEvent end;
        end.finished = true;
        end.reason = e.finished ? e.reason : FinishReason::Cancelled;
        end.message = e.message;
        end.prompt_tokens = e.prompt_tokens;
        st->push(int(i + 1), end);
      }
      return;
    }
    for (size_t i = 0; i < shared_rest->size(); ++i) {
      const int choice = int(i + 1);
      int64_t id = -1;
      try {
        id = st->engine->submit((*shared_rest)[i], [st, choice](const RequestEvent& ev) { st->push(choice, ev); });
      } catch (const std::exception& ex) {
        RequestEvent err;
        err.finished = true;
        err.reason = FinishReason::Error;
        err.message = ex.what();
        st->push(choice, err);
        continue;
      }
      bool cancel_now;
      {
        std::lock_guard lk(st->mu);
        st->ids[size_t(choice)] = id;
        cancel_now = st->cancelled;
      }
      if (cancel_now) st->engine->cancel(id);
    }
  };
  std::shared_ptr<State> keep = state_;
  const int64_t id = engine.submit(choice_request(p, 0, tokenizer), [keep, fork, n = n_](const RequestEvent& e) {
    keep->push(0, e);
    if (n > 1) fork(e);
  });
  std::lock_guard lk(st.mu);
  st.ids[0] = id;
}

Generation::~Generation() { cancel(); }

std::deque<Generation::Event> Generation::wait(std::chrono::milliseconds timeout) {
  State& st = *state_;
  std::unique_lock lk(st.mu);
  st.cv.wait_for(lk, timeout, [&] { return !st.events.empty(); });
  std::deque<Event> out;
  out.swap(st.events);
  return out;
}

void Generation::cancel() {
  State& st = *state_;
  std::vector<int64_t> ids;
  {
    std::lock_guard lk(st.mu);
    st.cancelled = true;
    for (size_t i = 0; i < st.ids.size(); ++i)
      if (st.ids[i] >= 0 && !st.done[i]) ids.push_back(st.ids[i]);
  }
  for (int64_t id : ids) st.engine->cancel(id);
}

}  // namespace mla::server
