#include "engine/lockstep.h"

#include <bit>
#include <stdexcept>
#include <utility>
#include <vector>

namespace mla {

namespace {

// A message is a header {kind, words} broadcast from rank 0, then `words` int64 of body.
// PageIn's body is {page, bytes}; the page's bytes follow in a broadcast of their own.
enum Kind : int64_t { Shape = 1, Pass = 2, Heartbeat = 3, Stop = 4, PageIn = 5 };

void send(parallel::Comm& comm, Kind kind, std::vector<int64_t> body = {}) {
  int64_t head[2] = {kind, int64_t(body.size())};
  comm.broadcast(head, sizeof head, 0);
  if (!body.empty()) comm.broadcast(body.data(), body.size() * sizeof(int64_t), 0);
}

// A follower's wait for the next message: idle (it may be long) but not past the timeout.
std::pair<Kind, std::vector<int64_t>> receive(parallel::Comm& comm) {
  int64_t head[2] = {0, 0};
  comm.broadcast_idle(head, sizeof head, 0);
  if (head[1] < 0 || head[1] > (int64_t(1) << 32)) throw std::runtime_error("a malformed message from rank 0");
  std::vector<int64_t> body(static_cast<size_t>(head[1]));
  if (!body.empty()) comm.broadcast(body.data(), body.size() * sizeof(int64_t), 0);
  return {Kind(head[0]), std::move(body)};
}

// The pass's options that travel: what Engine::step_inner sets. Captures, contexts and
// final_hidden are rank 0's own (speculation is off under mpirun).
void encode_options(const ForwardOptions& o, std::vector<int64_t>& out) {
  out.push_back(int64_t(o.path));
  out.push_back(o.policy.prefix_chunk);
  out.push_back(std::bit_cast<int64_t>(o.policy.expand_margin));
  out.push_back(o.last_logits_only);
  out.push_back(o.dense_attention);
  out.push_back(int64_t(o.logits_last.size()));
  out.insert(out.end(), o.logits_last.begin(), o.logits_last.end());
}

// Reads `n` words at `at`, checking the body holds them.
std::span<const int64_t> take(const std::vector<int64_t>& body, size_t& at, int64_t n) {
  if (n < 0 || size_t(n) > body.size() - at) throw std::runtime_error("a malformed pass message from rank 0");
  std::span<const int64_t> s(body.data() + at, size_t(n));
  at += size_t(n);
  return s;
}

// A collective of the job that failed: the engine's JobFailed.
template <class F>
void collective(F&& f) {
  try {
    f();
  } catch (const parallel::CommError& e) {
    throw JobFailed(e.what());
  }
}

}  // namespace

Leader::Leader(parallel::Comm& comm, int64_t num_pages, int64_t page_size, KvDType dtype,
               std::function<void(const std::string&)> on_failure)
    : comm_(comm), on_failure_(std::move(on_failure)) {
  send(comm_, Shape, {num_pages, page_size, int64_t(dtype)});
}

void Leader::forward(Model& model, std::span<SeqSlice> batch, LatentPool& pool, const ForwardOptions& opt,
                     std::vector<float>& logits) {
  // The followers get the pages with the pass: reserve them first (all or nothing; when they do
  // not fit, Model::forward throws KvCacheExhausted before its first collective and nobody is told).
  int64_t need = 0;
  for (const SeqSlice& s : batch) need += pool.pages_needed(*s.seq, s.seq->length + int64_t(s.ids.size()));
  collective([&] {
    if (need <= pool.free_pages()) {
      for (const SeqSlice& s : batch) pool.reserve(*s.seq, s.seq->length + int64_t(s.ids.size()));
      send_pass(batch, opt);
    }
    model.forward(batch, pool, opt, logits);
  });
}

void Leader::send_pass(std::span<const SeqSlice> batch, const ForwardOptions& opt) {
  std::vector<int64_t> body;
  encode_options(opt, body);
  body.push_back(int64_t(batch.size()));
  for (const SeqSlice& s : batch) {
    body.push_back(s.seq->length);
    body.push_back(int64_t(s.seq->pages.size()));
    body.push_back(int64_t(s.ids.size()));
    body.insert(body.end(), s.seq->pages.begin(), s.seq->pages.end());
    body.insert(body.end(), s.ids.begin(), s.ids.end());
  }
  send(comm_, Pass, std::move(body));
}

void Leader::page_in(int32_t page, std::span<const uint8_t> bytes) {
  collective([&] {
    send(comm_, PageIn, {page, int64_t(bytes.size())});
    comm_.broadcast(const_cast<uint8_t*>(bytes.data()), bytes.size(), 0);
  });
}

void Leader::idle() {
  collective([&] { send(comm_, Heartbeat); });
}

double Leader::idle_seconds() const { return comm_.timeout() / 4; }

void Leader::failed(const std::string& why) {
  if (on_failure_) on_failure_(why);
}

void Leader::stop() { send(comm_, Stop); }

void follow(parallel::Comm& comm, Model& model, LatentPool& pool) {
  const int64_t num_pages = pool.num_pages();
  auto [kind, shape] = receive(comm);
  if (kind != Shape || shape.size() != 3) throw std::runtime_error("rank 0 did not start with the pool's shape");
  if (shape[0] != num_pages || shape[1] != pool.page_size() || shape[2] != int64_t(pool.dtype()))
    throw std::runtime_error("rank 0's KV cache is " + std::to_string(shape[0]) + " pages of " +
                             std::to_string(shape[1]) + " tokens, this rank's " + std::to_string(num_pages) + " of " +
                             std::to_string(pool.page_size()) +
                             " (or another cache dtype): start every rank with the same options");
  std::vector<PageTable> tables;
  std::vector<std::vector<int32_t>> ids;
  std::vector<SeqSlice> slices;
  std::vector<int64_t> logits_last;
  std::vector<float> logits;
  std::vector<uint8_t> page_bytes;
  while (true) {
    auto [kind, body] = receive(comm);
    if (kind == Stop) return;
    if (kind == Heartbeat) continue;
    if (kind == PageIn) {
      if (body.size() != 2 || body[0] < 0 || body[0] >= num_pages || body[1] != pool.bytes_per_page())
        throw std::runtime_error("a malformed page message from rank 0");
      page_bytes.resize(size_t(body[1]));
      comm.broadcast(page_bytes.data(), page_bytes.size(), 0);
      pool.copy_page_in(int32_t(body[0]), page_bytes.data());
      continue;
    }
    if (kind != Pass) throw std::runtime_error("an unknown message from rank 0 (kind " + std::to_string(kind) + ")");
    size_t at = 0;
    auto o = take(body, at, 6);
    ForwardOptions fo;
    fo.path = AttnPath(o[0]);
    fo.policy.prefix_chunk = o[1];
    fo.policy.expand_margin = std::bit_cast<double>(o[2]);
    fo.last_logits_only = o[3] != 0;
    fo.dense_attention = o[4] != 0;
    auto ll = take(body, at, o[5]);
    logits_last.assign(ll.begin(), ll.end());
    fo.logits_last = logits_last;
    const int64_t n = take(body, at, 1)[0];
    if (n < 0 || n > int64_t(body.size())) throw std::runtime_error("a malformed pass message from rank 0");
    tables.assign(size_t(n), {});
    ids.resize(size_t(n));
    slices.clear();
    for (int64_t b = 0; b < n; ++b) {
      auto h = take(body, at, 3);
      auto pages = take(body, at, h[1]);
      auto new_ids = take(body, at, h[2]);
      PageTable& t = tables[size_t(b)];
      t.length = h[0];
      t.pages.assign(pages.begin(), pages.end());
      for (int32_t p : t.pages)
        if (p < 0 || p >= num_pages) throw std::runtime_error("a pass message from rank 0 names page " + std::to_string(p));
      ids[size_t(b)].assign(new_ids.begin(), new_ids.end());
      slices.push_back({&t, std::span<const int32_t>(ids[size_t(b)])});
    }
    model.forward(slices, pool, fo, logits);
  }
}

}  // namespace mla
