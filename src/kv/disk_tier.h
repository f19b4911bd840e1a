// The prefix cache's third tier: pages in files under --cache-dir, kept across restarts and
// shared by every server pointed at the directory.
//
//   DIR/<fingerprint>/<first key>.seg   one file a segment: consecutive pages of one chain
//
// A segment holds up to `segment_pages` pages that were written together (a prompt's new pages
// in chain order), so a restart reads a long prefix as a few large reads. With one file a page
// (format version 1) every page paid a file's fixed cost (an open, a first wait on the disk,
// the kernel's read-ahead starting over), and on small pages (442 KB on the 6-layer bench
// checkpoint) that cost, not the disk's rate, set the read rate (docs/prompt-cache.md). A
// segment is named after its first page's key: a server that meets a chain another server
// wrote after it started finds the segment by that name, and a page anywhere inside a segment
// is found through an index of every page's key that the tier builds from the segments'
// headers when it starts and keeps up to date.
//
// The fingerprint names everything that changes a latent value (the checkpoint, the way it is
// computed, the cache's format; kv/prefix_cache.h), so another checkpoint or cache dtype on the
// same directory never meets these pages. A file holds a header (magic, version, fingerprint,
// page size, page count, a page's payload size), a table with each page's key, payload checksum
// and tokens, the checksum of header and table, zeros up to the next 4 KiB, then the pages'
// payloads in table order (LatentPool::page_parts in order). The payloads start on a 4 KiB
// boundary so that the pages a read needs are whole file-system blocks.
//
// Nothing wrong is ever served: a read checks the header, the table, the size, the tokens and
// each page's checksum. A segment whose header, table or size is wrong is deleted and none of
// it is used; a page whose checksum is wrong ends the read there: the pages before it, each
// checked on its own, are used, and the segment is deleted (so the bad page and those after it
// are recomputed and written again). Files of format version 1 (`<key>.page`) are never read;
// the budget's walk deletes them, since they would otherwise hold disk space outside it.
//
// Writes run on a background thread (a write never delays a token): each segment is written
// under a temporary name and renamed into place, so a crash or SIGKILL mid-write leaves a
// temporary file, never a half entry (a later start removes temporaries over ten minutes old).
// Segments are not fsynced: after a power loss a renamed file may hold zeros or stale blocks,
// which the checksums above reject like any other corruption (the pages are recomputed), so
// durability would only save recomputation, at the cost of a flush per segment.
// Two servers writing the same first key write the same pages from it; when their counts
// differ the later rename wins, and a reader looks each page up in the file's own table, so a
// page the other file lacks is a miss, never a wrong page. The budget counts every segment file
// under DIR; past it the least recently used (modification time; a hit touches its file) are
// deleted down to 90%. An unwritable or full disk stops the writes with one warning; reads go on.
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
  // Pages a segment holds at most; 0: as many as fit in kSegmentBytes, and an eighth of the
  // budget (at least one).
  int64_t segment_pages = 0;
  int64_t max_pending_bytes = int64_t(1) << 30;    // queued writes at most; past it writes are skipped
  std::function<void(const std::string&)> warn;    // default: a line on stderr
  std::function<void()> before_write;  // runs on the writer thread before each segment (tests hold writes there)
};

// A page to write: key, tokens and bytes (as parts); `keep` keeps the parts alive until the
// write is done, and `done` then runs.
struct PageWrite {
  Hash128 key;
  std::vector<int32_t> tokens;
  std::vector<std::span<const uint8_t>> parts;
  std::shared_ptr<const void> keep;
  std::function<void()> done;
};

class DiskTier {
 public:
  // A segment's size when the options leave it open: large enough that a file's fixed cost is
  // small beside reading it, small enough that a long prompt's pages make several segments (a
  // partial hit reads only the pages it needs in any case).
  static constexpr int64_t kSegmentBytes = int64_t(32) << 20;

  explicit DiskTier(DiskTierOptions opt);
  ~DiskTier();  // finishes the queued writes
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  bool readable() const { return readable_; }
  bool writable() const;
  std::string folder() const { return folder_; }
  int64_t page_bytes() const { return payload_bytes_; }
  int64_t segment_pages() const { return segment_pages_; }
  int64_t segment_bytes(int64_t pages) const;  // the size of a segment file of that many pages
  // Where a segment file of that many pages holds its first page's payload.
  static int64_t payload_offset(int64_t pages, int64_t page_size);
  std::string path_of(const Hash128& first_key) const;

  // Whether a segment this process wrote, found or queued holds the key (another server may
  // have deleted it since).
  bool contains(const Hash128& key) const;
  // Where a read puts page i of the n it can read: the page's parts (part_bytes' sizes, in
  // order) to fill, or none to stop before page i.
  using PageSink = std::function<std::vector<std::span<uint8_t>>(int64_t i, int64_t n)>;
  // Reads the pages keys[0], keys[1], ... (consecutive pages of one chain; tokens holds their
  // tokens from keys[0]'s on, page_size a page) as far as the segment holding keys[0] holds
  // them in that order, each into the parts the sink gives and checked there. Returns the pages
  // read and checked, 0 when keys[0] is on no segment or its segment is bad (then deleted); a
  // page past that count may hold unchecked bytes.
  int64_t read_into(std::span<const Hash128> keys, std::span<const int32_t> tokens, const PageSink& sink);
  // The same pages in blocks of their own (one allocation), for tools and tests.
  std::vector<PageBlockPtr> read(std::span<const Hash128> keys, std::span<const int32_t> tokens);
  // Any thread: has the kernel read the segments' bytes for these pages (those the index holds)
  // into its page cache, so that a read_into of them copies instead of waiting for the disk.
  // Returns the pages warmed.
  int64_t warm(std::span<const Hash128> keys);
  // Queues pages for writing and returns at once: consecutive pages of one chain in order go
  // into segments of up to segment_pages(); a page this tier already holds or queues, or whose
  // size is wrong, breaks the run. `done` runs for every page: on the writer thread once its
  // segment is written, or here, before returning, for a page not queued (tier off, queue full,
  // held already). Returns the pages queued.
  int64_t write(std::vector<PageWrite> pages);
  void flush();  // waits for the queued writes

  struct Stats {
    int64_t files = 0, bytes = 0;                // segment files and their bytes under DIR, as last counted
    int64_t pages = 0;                           // pages in this folder's segments that the index holds
    int64_t written = 0, written_bytes = 0;      // pages and file bytes written by this process
    int64_t read = 0, read_bytes = 0;            // pages served and the file bytes read for them
    int64_t warmed = 0;                          // pages warm() brought into the page cache
    double read_seconds = 0;                     // spent reading and checking them, warming included
    int64_t rejected = 0;                        // segment files that failed a check, deleted
    int64_t skipped = 0;                         // pages not queued (queue full, tier off)
    int64_t evicted = 0;                         // segment files deleted for the budget
  };
  Stats stats() const;

 private:
  struct Segment {
    std::vector<PageWrite> pages;
    int64_t bytes = 0;  // their payloads
  };
  struct Table;  // a segment file's header and table, read and checked (disk_tier.cpp)

  void writer_loop();
  bool write_file(const Segment& s);  // false: the tier stops writing
  void enforce_budget();              // on the writer thread (and at start)
  void scan_own_folder();
  void turn_off_writes(const std::string& why);
  // Reads and checks a segment's header and table; on a bad file, warns, deletes it and
  // returns false with *why set.
  bool read_table(int fd, const Hash128& name, Table* t, const char** why) const;
  void reject(const Hash128& name, const char* why);   // deletes a bad segment, forgets its pages
  void index_segment(const Hash128& name, std::vector<Hash128> keys);  // under mu_
  void forget_segment(const Hash128& name);                              // under mu_

  DiskTierOptions opt_;
  std::string folder_;
  int64_t payload_bytes_ = 0, segment_pages_ = 1;
  bool readable_ = false;

  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  bool writable_ = false, stop_ = false, busy_ = false;
  std::deque<Segment> queue_;
  int64_t pending_bytes_ = 0;
  std::unordered_map<Hash128, Hash128, Hash128Hasher> where_;                  // page key -> segment (first key)
  std::unordered_map<Hash128, std::vector<Hash128>, Hash128Hasher> segments_;  // segment -> its page keys
  std::unordered_set<Hash128, Hash128Hasher> queued_;
  Stats stats_;
  uint64_t tmp_counter_ = 0, nonce_ = 0;
  std::thread writer_;
};

}  // namespace mla
