// Admission and drain of the generation requests (see admission.h).
#include "server/admission.h"

#include <string>

namespace mla::server {

Admission::Flight::~Flight() {
  {
    std::lock_guard lk(admission_.flights_mu_);
    admission_.flights_.erase(this);
  }
  --admission_.in_flight_;
  admission_.on_end_();
}

std::shared_ptr<Admission::Flight> Admission::admit(Refusal& refused) {
  refused = Refusal::None;
  if (stopping_) {
    refused = Refusal::Draining;
    return nullptr;
  }
  if (in_flight_.fetch_add(1) >= limit_) {
    --in_flight_;
    refused = Refusal::QueueFull;
    return nullptr;
  }
  // From here on the flight counts in in_flight_ (its destructor gives the place back).
  std::shared_ptr<Flight> flight(new Flight(*this));
  std::lock_guard lk(flights_mu_);
  flights_.insert(flight.get());
  return flight;
}

ApiError Admission::refusal_error(Refusal refused) const {
  if (refused == Refusal::Draining)
    return ApiError(503, "the server is shutting down", {}, "service_unavailable", "server_shutdown");
  return ApiError(429,
                  "the server is at its limit of " + std::to_string(limit_) +
                      " requests running and queued; retry later",
                  {}, "rate_limit_exceeded", "queue_full");
}

void Admission::stop(Clock::time_point deadline) {
  if (!stop_called_.exchange(true)) {  // the deadline first: the listener reads it once stopping
    drain_deadline_ns_ = deadline.time_since_epoch().count();
    stopping_ = true;
  }
}

void Admission::stop_now(Clock::time_point deadline) {
  stop_hard_ = true;
  stop(deadline);
  cut_all();
}

void Admission::cut_all() {
  if (cut_sent_.exchange(true)) return;
  std::lock_guard lk(flights_mu_);
  for (Flight* f : flights_) f->cut_ = true;
}

bool Admission::drained(Clock::time_point now) {
  if (!stopping_) return false;
  if (in_flight_ == 0) return true;
  if (stop_hard_ || now.time_since_epoch().count() >= drain_deadline_ns_) {
    if (!cut_sent_) {
      cut_all();
      cut_time_ = now;
    } else if (now - cut_time_ > std::chrono::seconds(10)) {
      return true;  // a request that does not end when cut: stop waiting for it
    }
  }
  return false;
}

}  // namespace mla::server
