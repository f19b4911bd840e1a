// The prompt cache: page-aligned token prefixes whose latent pages outlive the sequences that
// wrote them, in three tiers.
//
//   pool  pages of the latent pool held by reference count: a hit shares them, never copies
//   RAM   pages that left the pool when it needed room (kv/host_tier.h), up to a byte budget
//   disk  every page the pool tier takes, written in the background, kept across restarts and
//         shared by servers on one directory (kv/disk_tier.h), up to a byte budget
//
// A page is found by its key, a hash chain over the tokens of every page up to it
// (kv/page_hash.h), and its tokens are checked on every hit, so a shared system prompt or tool
// list is one chain of pages for every session and a collision can never serve another
// prefix. A hit walks the chain from the first page, taking each page from the highest tier
// that holds it; a page from RAM or disk is copied into a free pool page and joins the pool
// tier (promotion); the walk ends at the first page no tier holds. Each tier drops its least
// recently used pages first; in the pool tier a page's parents are always more recent than
// the page, so a chain is shortened from its end, and only pages no sequence holds are dropped
// there (into RAM when that tier is on). Only full pages are kept, so a sequence that extends a
// cached one recomputes at most its last partial page.
//
// A page from disk is read straight into its pool page and checked there; a submitting thread
// first has the kernel read the prompt's segments into its page cache (prefetch), so that the
// engine's stepping thread, which does everything else, copies instead of waiting for the disk.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kv/disk_tier.h"
#include "kv/host_tier.h"
#include "kv/latent_pool.h"
#include "kv/page_hash.h"

namespace mla {

struct PrefixCacheOptions {
  int64_t ram_bytes = 0;  // the RAM tier's budget; 0: no RAM tier
  std::string disk_dir;   // the disk tier's directory; empty: no disk tier
  int64_t disk_bytes = 0;
  // What the pages belong to: the checkpoint and the way its latents are computed
  // (model/fingerprint.h). Required with a disk tier; the cache adds its own format.
  Hash128 fingerprint;
  int64_t disk_max_pending_bytes = int64_t(1) << 30;
  int64_t disk_segment_pages = 0;  // pages a disk segment holds at most; 0: DiskTier's choice
  std::function<void(const std::string&)> warn;  // default: stderr
  // Called after a page from the RAM or disk tier was copied into the pool: under mpirun the
  // other ranks' pools get the same bytes (engine/lockstep.h).
  std::function<void(int32_t page, std::span<const uint8_t> bytes)> on_page_in;
  std::function<void()> disk_before_write;  // DiskTierOptions::before_write
};

enum class CacheTier { Pool = 0, Ram = 1, Disk = 2 };

struct PrefixCacheStats {
  int64_t hit_tokens[3] = {0, 0, 0};  // prompt tokens served by each tier (CacheTier order)
  int64_t hit_bytes[3] = {0, 0, 0};   // their latent bytes
  int64_t pool_pages = 0;             // pages the pool tier holds
  int64_t ram_pages = 0, ram_bytes = 0, ram_budget = 0;
  bool disk_on = false, disk_writable = false;
  int64_t disk_files = 0, disk_bytes = 0, disk_budget = 0;  // segment files under the directory
  int64_t disk_pages = 0;                                   // pages in this server's folder
  int64_t disk_written = 0, disk_rejected = 0, disk_skipped = 0, disk_evicted = 0;  // kv/disk_tier.h's Stats
  int64_t disk_read_bytes = 0;   // bytes read from segment files for hits
  double disk_read_seconds = 0;  // the time those reads took, checks and prefetches' warming included
};

class PrefixCache {
 public:
  // The pool must outlive the cache.
  explicit PrefixCache(LatentPool& pool, PrefixCacheOptions opt = {});
  ~PrefixCache();  // finishes the disk tier's queued writes
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // Keeps the full pages of `table` under the tokens they hold (tokens[0, aligned) where
  // aligned = table.length rounded down to a page); pages already cached are refreshed.
  void insert(std::span<const int32_t> tokens, const PageTable& table);
  // The longest cached page-aligned prefix of tokens[0, max_len), from any tier: its pages
  // into *out (which must be empty) and its length returned; 0 (and *out unchanged) on a miss.
  // Pages read back from RAM or disk take free pool pages while more than keep_free are left.
  int64_t match(std::span<const int32_t> tokens, int64_t max_len, PageTable* out, int64_t keep_free = 0);
  // Any thread: has the disk tier warm the prompt's pages that neither the pool nor RAM holds
  // (DiskTier::warm), so that admitting it copies from the page cache instead of reading.
  void prefetch(std::span<const int32_t> tokens);
  // Gives up the least recently used pool page no sequence holds (into the RAM tier when it is
  // on). Where every such page still waits for its disk write, waits for the next write to
  // finish (one segment, not the disk tier's whole queue) and looks again. False when there is
  // none.
  bool evict_one();
  // Releases the pool pages whose disk writes are done (the scheduler calls it every step).
  void poll();
  void flush();            // waits for the disk tier's queued writes, then polls
  void wait_for_writes();  // any thread: waits for the disk tier's queued writes
  void clear();  // the pool and RAM tiers (the disk keeps its pages)

  int64_t entries() const { return int64_t(resident_.size()); }  // pages in the pool tier
  // Pool pages only the cache holds (they come back when it gives them up).
  int64_t pages_held_alone() const;
  PrefixCacheStats stats() const;
  const DiskTier* disk() const { return disk_.get(); }
  const HostTier* ram() const { return ram_.get(); }

 private:
  struct Resident {
    int32_t page = -1;
    std::vector<int32_t> tokens;
    uint64_t stamp = 0;
  };
  void touch(std::span<const Hash128> chain);  // most recent first from the chain's first page
  void add_resident(const Hash128& key, int32_t page, std::span<const int32_t> tokens);
  void remove_resident(const Hash128& key);
  // A pool page's disk write, the page pinned until it is done (poll releases it).
  PageWrite pinned_write(const Hash128& key, int32_t page, std::span<const int32_t> tokens);
  // Hands a run of consecutive pages of one chain (only non-empty with a disk tier) to the disk
  // tier, which writes them as segments, and empties it.
  void write_through(std::vector<PageWrite>& run);
  void wait_for_a_write();  // until a pinned page's write is done (pins_ not empty), then polls
  void persist(const PageBlockPtr& block);  // RAM block -> disk
  std::vector<std::span<const uint8_t>> split(std::span<const uint8_t> bytes) const;
  bool resident_key(const Hash128& key) const;

  LatentPool& pool_;
  PrefixCacheOptions opt_;
  std::vector<int64_t> part_bytes_;
  std::unordered_map<Hash128, Resident, Hash128Hasher> resident_;
  std::map<uint64_t, Hash128> lru_;  // stamp -> key, least recent first
  uint64_t clock_ = 0;
  std::unordered_map<int32_t, int> pins_;  // pool pages held for a disk write
  PrefixCacheStats counters_;

  mutable std::mutex keys_mu_;  // the pool tier's keys, for prefetch on other threads
  std::unordered_set<Hash128, Hash128Hasher> resident_keys_;
  std::mutex written_mu_;
  std::condition_variable written_cv_;  // written_ gained a page
  std::vector<int32_t> written_;  // pinned pages whose writes are done, for poll

  std::unique_ptr<HostTier> ram_;
  std::unique_ptr<DiskTier> disk_;  // last: its writer's callbacks use the members above
};

}  // namespace mla
