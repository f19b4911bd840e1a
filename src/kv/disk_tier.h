// The prefix cache's third tier: pages in files under --cache-dir, kept across restarts and
// shared by every server pointed at the directory.
//
//   DIR/<fingerprint>/<key>.page   one file a page
//
// The fingerprint names everything that changes a latent value (the checkpoint, the way it is
// computed, the cache's format; kv/prefix_cache.h), so another checkpoint or cache dtype on the
// same directory never meets these pages. A file holds a header (magic, version, fingerprint,
// key, page size, payload size, the payload's checksum), the page's tokens, the header's
// checksum, then the payload (LatentPool::page_parts in order).
//
// Nothing wrong is ever served: a read checks every field, the tokens and both checksums, and
// deletes a file that fails (the page is then recomputed). Writes run on a background thread
// (a write never delays a token): each file is written under a temporary name and renamed into
// place, so a crash or SIGKILL mid-write leaves a temporary file, never a half entry (a later
// start removes temporaries over ten minutes old); two servers writing one key write the same
// bytes, and the rename replaces atomically. The budget counts every page file under DIR;
// past it the least recently used (modification time; a hit touches its file) are deleted
// down to 90%. An unwritable or full disk stops the writes with one warning; reads go on.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kv/host_tier.h"
#include "kv/page_hash.h"

namespace mla {

struct DiskTierOptions {
  std::string dir;
  int64_t budget_bytes = 0;
  Hash128 fingerprint;
  int64_t page_size = 0;
  std::vector<int64_t> part_bytes;                 // a page's parts, LatentPool::page_parts' sizes
  int64_t max_pending_bytes = int64_t(1) << 30;    // queued writes at most; past it writes are skipped
  std::function<void(const std::string&)> warn;    // default: a line on stderr
};

// A page to write: key, tokens and bytes (as parts); `keep` keeps the parts alive until the
// write is done, and `done` then runs on the writer thread.
struct PageWrite {
  Hash128 key;
  std::vector<int32_t> tokens;
  std::vector<std::span<const uint8_t>> parts;
  std::shared_ptr<const void> keep;
  std::function<void()> done;
};

class DiskTier {
 public:
  explicit DiskTier(DiskTierOptions opt);
  ~DiskTier();  // finishes the queued writes
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  bool readable() const { return readable_; }
  bool writable() const;
  std::string folder() const { return folder_; }
  int64_t page_bytes() const { return payload_bytes_; }
  int64_t file_bytes() const;  // the size of one page's file

  // Whether this process wrote or found the key (another server may have deleted it since).
  bool contains(const Hash128& key) const;
  // The page under key holding these tokens, checked; null when absent or bad (then deleted).
  PageBlockPtr read(const Hash128& key, std::span<const int32_t> tokens);
  // Asks the kernel to start reading these pages' files (posix_fadvise WILLNEED), so that the
  // reads that follow find them in memory instead of waiting for the disk one file at a time.
  void will_need(std::span<const Hash128> keys) const;
  // Queues a write and returns at once; false (and `done` never runs) when the tier does not
  // write, holds or queues the key already, or the queue is full.
  bool write(PageWrite w);
  void flush();  // waits for the queued writes

  struct Stats {
    int64_t files = 0, bytes = 0;                // page files and their bytes under DIR, as last counted
    int64_t written = 0, written_bytes = 0;      // by this process
    int64_t read = 0, read_bytes = 0;            // hits
    double read_seconds = 0;                     // spent reading and checking them
    int64_t rejected = 0;                        // files that failed a check, deleted
    int64_t skipped = 0;                         // writes not queued (queue full, tier off)
    int64_t evicted = 0;                         // files deleted for the budget
  };
  Stats stats() const;

 private:
  std::string path_of(const Hash128& key) const;
  void writer_loop();
  bool write_file(const PageWrite& w);  // false: the tier stops writing
  void enforce_budget();                // on the writer thread (and at start)
  void scan_own_folder();
  void turn_off_writes(const std::string& why);

  DiskTierOptions opt_;
  std::string folder_;
  int64_t payload_bytes_ = 0;
  bool readable_ = false;

  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  bool writable_ = false, stop_ = false, busy_ = false;
  std::deque<PageWrite> queue_;
  int64_t pending_bytes_ = 0;
  std::unordered_set<Hash128, Hash128Hasher> known_, queued_;
  Stats stats_;
  uint64_t tmp_counter_ = 0, nonce_ = 0;
  std::thread writer_;
};

}  // namespace mla
