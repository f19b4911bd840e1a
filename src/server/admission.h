// Admission and drain of the generation requests, between the HTTP layer and the protocols: at
// most `limit` (max_running + max_queued_requests) are admitted at once and the next is
// refused at once (429); once the server stops, every new one is refused (503). An admitted
// request holds its Flight until its response is written (a stream's content provider holds
// it). The shutdown's cut marks every flight: its handler sees the mark within one poll and
// cancels its choices. The listener asks drained() once per turn to know when it may end.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>

#include "server/api_common.h"

namespace mla::server {

class Admission {
 public:
  using Clock = std::chrono::steady_clock;

  // One admitted generation request, counted in flight while it lives.
  class Flight {
   public:
    ~Flight();
    Flight(const Flight&) = delete;
    Flight& operator=(const Flight&) = delete;
    // The shutdown cut it: its handler cancels the request's choices.
    bool cut() const { return cut_; }

   private:
    friend class Admission;
    explicit Flight(Admission& a) : admission_(a) {}
    Admission& admission_;
    std::atomic<bool> cut_{false};
  };

  // Why a request was not admitted.
  enum class Refusal { None, Draining, QueueFull };

  // on_end runs whenever a flight ends (the listener wakes to see a drain finish). The
  // admission must outlive its flights.
  Admission(int64_t limit, std::function<void()> on_end) : limit_(limit), on_end_(std::move(on_end)) {}
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // Admits one generation request: its Flight, to hold until the response is written; or null,
  // with `refused` saying why (Draining once stop() was called, QueueFull at the limit).
  std::shared_ptr<Flight> admit(Refusal& refused);
  // The error a refused request gets: 503 server_shutdown, or 429 queue_full. Both are answered
  // with Retry-After: 1.
  ApiError refusal_error(Refusal refused) const;

  // Stops admitting; the requests in flight may run until `deadline` (the first call's counts).
  // Thread-safe.
  void stop(Clock::time_point deadline);
  // stop(), then cuts the requests in flight at once. Thread-safe.
  void stop_now(Clock::time_point deadline);
  bool stopping() const { return stopping_; }
  // Marks every flight cut; once (later calls do nothing).
  void cut_all();
  // The listener's look at a drain, once per turn (one thread only): false while not stopping.
  // Once stopping: true when no request is in flight. Past the deadline the requests in flight
  // are cut, and it is true 10 s after that cut whatever still runs; after stop_now (whose cut
  // came first) it is true at once.
  bool drained(Clock::time_point now);

  int64_t in_flight() const { return in_flight_; }
  int64_t limit() const { return limit_; }

 private:
  const int64_t limit_;
  std::function<void()> on_end_;
  std::atomic<int64_t> in_flight_{0};
  std::mutex flights_mu_;
  std::set<Flight*> flights_;
  std::atomic<bool> stop_called_{false}, stopping_{false}, stop_hard_{false}, cut_sent_{false};
  std::atomic<int64_t> drain_deadline_ns_{0};
  Clock::time_point cut_time_{};  // drained()'s own
};

}  // namespace mla::server
