// Serving under mpirun (`mpirun -np N mla serve ...`): rank 0 runs the one Engine (HTTP, the
// scheduler, sampling) and every other rank replays its forward passes over a latent pool of
// its own, so that each MoE layer's combine (parallel/expert_parallel.h) meets the same pass on
// every rank. There is no second engine loop: a follower runs Model::forward and nothing else.
//
// The engine runs each pass through Leader::forward, which reserves the pass's pages, broadcasts
// what the pass needs (per sequence its page table and new token ids, and the pass's options)
// and runs it on rank 0. A follower's pool holds in each page what rank 0's holds, because every write to a
// page is a forward pass that both ran, or a page of the prompt cache's RAM or disk tier that
// rank 0 copied in and sent (page_in); sharing a cached prefix shares its pages by reference
// and copies nothing. The tiers themselves live on rank 0 only. A follower's logits are
// dropped; rank 0 samples.
//
// While the engine is idle, rank 0 sends a heartbeat every timeout / 4 seconds, so a follower
// tells a quiet server from a hung rank 0 (it throws parallel::CommError when neither a pass nor
// a heartbeat comes within the timeout); at the end, a stop message. A collective that fails on
// rank 0 (a follower hung past the timeout, or an interrupt) reaches the engine as JobFailed:
// the engine ends every request and calls failed(), and serving ends the job.
#pragma once
#include <functional>
#include <span>
#include <string>

#include "engine/engine.h"
#include "parallel/comm.h"

namespace mla {

class Leader final : public PassLeader {
 public:
  // Sends the pool's shape (pages, page size, cache dtype): follow() checks its own against it.
  // on_failure: called once, on the engine thread, when a pass's collective failed.
  Leader(parallel::Comm& comm, int64_t num_pages, int64_t page_size, KvDType dtype,
         std::function<void(const std::string&)> on_failure);

  void forward(Model& model, std::span<SeqSlice> batch, LatentPool& pool, const ForwardOptions& opt,
               std::vector<float>& logits) override;
  void page_in(int32_t page, std::span<const uint8_t> bytes) override;
  void idle() override;
  double idle_seconds() const override;
  void failed(const std::string& why) override;
  // Ends the followers' follow() (call once the engine has stopped).
  void stop();

 private:
  void send_pass(std::span<const SeqSlice> batch, const ForwardOptions& opt);
  parallel::Comm& comm_;
  std::function<void(const std::string&)> on_failure_;
};

// A follower's part of the job: replays rank 0's passes over `pool` (built from the same
// options as rank 0's) until rank 0 stops. Throws parallel::CommError when rank 0 sends nothing
// within the timeout, std::runtime_error when rank 0's pool has another shape (pages, page
// size, cache dtype) or a message is malformed.
void follow(parallel::Comm& comm, Model& model, LatentPool& pool);

}  // namespace mla
