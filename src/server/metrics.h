// The server's counters and its /metrics text (Prometheus' text format, version 0.0.4): what
// the HTTP layer, admission and the request path count, beside the engine's EngineStats. The
// metric names are an interface: dashboards and tests scrape them.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <string>

#include "engine/engine.h"
#include "server/admission.h"
#include "server/http_listener.h"

namespace mla::server {

struct ServerMetrics {
  HttpCounters http;  // the listener's (http_listener.h); the routes count their errors there too
  // Requests per generation protocol (Protocol::name()); the map is filled before serving.
  std::map<std::string, std::atomic<int64_t>> requests_by_protocol;
  std::atomic<int64_t> http_streams{0};
  std::atomic<int64_t> rejected_queue_full{0}, rejected_draining{0};  // admission's refusals
  std::atomic<int64_t> request_timeouts{0}, shutdown_cuts{0}, client_gone{0};
  std::atomic<int64_t> liveness_requests{0};
};

// The /metrics text, all of it written here: a new counter or engine figure is one more line()
// (or a labelled family()).
std::string metrics_text(const ServerMetrics& m, const Admission& admission, const EngineStats& s);

}  // namespace mla::server
