// The server's /metrics text (see metrics.h).
#include "server/metrics.h"

#include <initializer_list>
#include <sstream>
#include <utility>

namespace mla::server {

std::string metrics_text(const ServerMetrics& m, const Admission& admission, const EngineStats& s) {
  std::ostringstream o;
  auto line = [&](const char* name, const char* help, const char* type, auto v) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n" << name << " " << v << "\n";
  };
  // A family with one label: {label="value"} v per entry.
  auto family = [&](const char* name, const char* help, const char* type, const char* label,
                    std::initializer_list<std::pair<const char*, int64_t>> values) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
    for (const auto& [value, v] : values) o << name << "{" << label << "=\"" << value << "\"} " << v << "\n";
  };
  // The server: the HTTP layer, admission, the request path.
  o << "# HELP mla_http_requests_total HTTP requests to the generation endpoints\n"
       "# TYPE mla_http_requests_total counter\n";
  for (const auto& [name, count] : m.requests_by_protocol)
    o << "mla_http_requests_total{endpoint=\"" << name << "\"} " << count.load() << "\n";
  line("mla_http_streams_total", "streamed (server-sent events) responses", "counter", m.http_streams.load());
  line("mla_http_errors_total", "responses with an error status", "counter", m.http.errors.load());
  line("mla_http_liveness_requests_total", "requests to /health, /metrics and /v1/models", "counter",
       m.liveness_requests.load());
  family("mla_http_rejected_total", "generation requests refused at once", "counter", "reason",
         {{"queue_full", m.rejected_queue_full.load()},
          {"draining", m.rejected_draining.load()},
          {"connections", m.http.rejected_connections.load()},
          {"descriptors", m.http.rejected_descriptors.load()}});
  family("mla_http_cut_total", "requests the server ended before the engine did", "counter", "reason",
         {{"client_gone", m.client_gone.load()},
          {"timeout", m.request_timeouts.load()},
          {"shutdown", m.shutdown_cuts.load()}});
  line("mla_http_read_timeouts_total", "requests that did not arrive within the read timeout (408)", "counter",
       m.http.read_timeouts.load());
  line("mla_http_requests_in_flight", "generation requests admitted and not yet answered", "gauge",
       admission.in_flight());
  line("mla_http_requests_limit", "generation requests admitted at most (running + queued)", "gauge",
       admission.limit());
  line("mla_http_connections_open", "open client connections", "gauge", m.http.open_connections.load());
  // The engine (EngineStats).
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
  line("mla_engine_step_seconds_total", "seconds in forward passes", "counter", s.step_seconds);
  line("mla_engine_decode_step_seconds_max", "the longest forward pass that carried a decoding sequence's next token",
       "gauge", s.decode_step_seconds_max);
  line("mla_kv_pages_total", "pages of the latent KV cache", "gauge", s.kv_pages_total);
  line("mla_kv_pages_used", "pages in use (sequences and prefix cache)", "gauge", s.kv_pages_total - s.kv_pages_free);
  line("mla_kv_pages_free", "free pages", "gauge", s.kv_pages_free);
  line("mla_kv_pages_prefix_cache", "pages only the prefix cache holds", "gauge", s.kv_pages_prefix_cache);
  line("mla_kv_pages_held_by_requests",
       "pages neither free nor held by the prefix cache alone (0 when no request runs: none leaked)", "gauge",
       s.kv_pages_total - s.kv_pages_free - s.kv_pages_prefix_cache);
  line("mla_kv_page_size_tokens", "tokens per page", "gauge", s.kv_page_size);
  line("mla_kv_bytes_per_token", "latent cache bytes per token, all layers", "gauge", s.kv_bytes_per_token);
  line("mla_prefix_cache_entries", "pages in the prompt cache's pool tier", "gauge", s.prefix_cache_entries);
  // The prompt cache's tiers (kv/prefix_cache.h): hits by the tier that served them, and sizes.
  const PrefixCacheStats& pc = s.prefix;
  family("mla_prompt_cache_hit_tokens_total", "prompt tokens served by each tier of the prompt cache", "counter",
         "tier", {{"pool", pc.hit_tokens[0]}, {"ram", pc.hit_tokens[1]}, {"disk", pc.hit_tokens[2]}});
  family("mla_prompt_cache_hit_bytes_total", "latent bytes of those tokens", "counter", "tier",
         {{"pool", pc.hit_bytes[0]}, {"ram", pc.hit_bytes[1]}, {"disk", pc.hit_bytes[2]}});
  family("mla_prompt_cache_bytes", "bytes each tier holds", "gauge", "tier",
         {{"pool", pc.pool_pages * (s.kv_bytes_per_token * s.kv_page_size)},
          {"ram", pc.ram_bytes},
          {"disk", pc.disk_bytes}});
  family("mla_prompt_cache_budget_bytes", "bytes each tier may hold (0: off)", "gauge", "tier",
         {{"ram", pc.ram_budget}, {"disk", pc.disk_budget}});
  family("mla_prompt_cache_pages", "pages each tier holds", "gauge", "tier",
         {{"pool", pc.pool_pages}, {"ram", pc.ram_pages}, {"disk", pc.disk_pages}});
  line("mla_prompt_cache_disk_writes_total", "pages written to disk", "counter", pc.disk_written);
  line("mla_prompt_cache_disk_rejected_total", "segment files that failed a check, deleted and recomputed", "counter",
       pc.disk_rejected);
  line("mla_prompt_cache_disk_skipped_total", "page writes not queued (queue full, tier off)", "counter",
       pc.disk_skipped);
  line("mla_prompt_cache_disk_evicted_total", "segment files deleted for the disk budget", "counter", pc.disk_evicted);
  line("mla_prompt_cache_disk_read_bytes_total", "bytes read from segment files", "counter", pc.disk_read_bytes);
  line("mla_prompt_cache_disk_read_seconds_total", "seconds spent reading and checking segment files", "counter",
       pc.disk_read_seconds);
  line("mla_prompt_cache_disk_writable", "1 while the disk tier writes", "gauge", pc.disk_writable ? 1 : 0);
  family("mla_batches_total", "forward passes by attention path", "counter", "path",
         {{"expand", s.paths.expand}, {"absorb", s.paths.absorb}, {"chunked", s.paths.chunked}});
  // Speculative decoding (engine/speculative.h): drafts verified and accepted, and what a
  // verify step yields.
  line("mla_spec_draft_tokens_total", "draft tokens verified", "counter", s.spec_draft_tokens);
  line("mla_spec_accepted_tokens_total", "draft tokens accepted", "counter", s.spec_accepted_tokens);
  line("mla_spec_verify_steps_total", "sequence-steps that verified drafts", "counter", s.spec_steps);
  line("mla_spec_acceptance_rate", "accepted / drafted", "gauge", s.spec_acceptance_rate());
  line("mla_spec_tokens_per_step", "tokens a verify step yields", "gauge", s.spec_tokens_per_step());
  return o.str();
}

}  // namespace mla::server
