// The prompt cache's RAM and disk tiers over a small latent pool of two layers with indexer keys
// (every part of a page): pages move from the pool to RAM to disk and back bit for bit, a
// restart reads the disk, a page inside a segment is found, prefetch warms the page cache from
// another thread, a full pool whose pages all wait for their writes frees one as soon as one
// write is done; and nothing wrong is ever served: flipped, truncated and foreign segments are dropped
// and recomputed (a bad page ends a read, the pages before it are used), a SIGKILL mid-write
// leaves no half entry, two caches on one directory never corrupt it, every budget holds (the
// disk's by whole segments), and an unwritable or full disk turns the tier off with a warning
// instead of failing.
#include <gtest/gtest.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <numeric>
#include <thread>

#include "kv/prefix_cache.h"
#include "test_util.h"

namespace mla {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kLayers = 2, kRank = 8, kRope = 4, kIndex = 8, kPage = 4;

LatentPool make_pool(int64_t pages, KvDType dtype = KvDType::BF16) {
  return LatentPool(kLayers, kRank, kRope, pages, kPage, dtype, kIndex);
}

// A sequence of the given tokens whose rows (every layer, and the indexer keys) are a function
// of the token and its position, as a model's would be.
PageTable written(LatentPool& pool, const std::vector<int32_t>& tokens) {
  PageTable t;
  EXPECT_TRUE(pool.reserve(t, int64_t(tokens.size())));
  for (int64_t pos = 0; pos < int64_t(tokens.size()); ++pos) {
    for (int64_t l = 0; l < kLayers; ++l) {
      std::vector<float> c(kRank), k(kRope), idx(kIndex);
      for (int64_t i = 0; i < kRank; ++i) c[size_t(i)] = float(tokens[size_t(pos)] % 97) * 0.25f + float(i + l) * 0.5f;
      for (int64_t i = 0; i < kRope; ++i) k[size_t(i)] = float(pos) - float(i);
      for (int64_t i = 0; i < kIndex; ++i) idx[size_t(i)] = float(pos * 3 + i + l);
      pool.write(l, t, pos, c.data(), k.data());
      pool.write_index(l, t, pos, idx.data());
    }
    t.length = pos + 1;
  }
  return t;
}

std::vector<int32_t> ids(int n, int32_t first = 100) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

// Every byte of the first `pages` pages of a table.
std::vector<uint8_t> page_bytes(const LatentPool& pool, const PageTable& t, int64_t pages) {
  std::vector<uint8_t> out(size_t(pool.bytes_per_page() * pages));
  for (int64_t i = 0; i < pages; ++i) pool.copy_page_out(t.pages[size_t(i)], out.data() + i * pool.bytes_per_page());
  return out;
}

struct Warnings {
  std::vector<std::string> lines;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& m) { lines.push_back(m); };
  }
  bool any(const std::string& part) const {
    for (auto& l : lines)
      if (l.find(part) != std::string::npos) return true;
    return false;
  }
};

PrefixCacheOptions tiers(int64_t ram, const std::string& dir, int64_t disk, Warnings* w = nullptr) {
  PrefixCacheOptions o;
  o.ram_bytes = ram;
  o.disk_dir = dir;
  o.disk_bytes = disk;
  o.fingerprint = Digest().add("a test checkpoint").finish();
  if (w) o.warn = w->sink();
  return o;
}

std::vector<fs::path> segment_files(const std::string& dir) {
  std::vector<fs::path> files;
  for (auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().extension() == ".seg") files.push_back(e.path());
  return files;
}

void flip(const fs::path& f, int64_t at) {
  std::fstream s(f, std::ios::in | std::ios::out | std::ios::binary);
  s.seekg(at);
  char c;
  s.get(c);
  s.seekp(at);
  s.put(char(c ^ 0x10));
}

TEST(PromptCacheTiers, PagesMoveFromPoolToRamToDiskAndBackBitForBit) {
  test::TempDir dir("tiers");
  LatentPool pool = make_pool(8);
  const int64_t block = pool.bytes_per_page() + kPage * 4;
  PrefixCache cache(pool, tiers(2 * block, dir.str(), int64_t(1) << 30));
  const auto tokens = ids(17);  // four full pages and one token
  PageTable a = written(pool, tokens);
  const std::vector<uint8_t> original = page_bytes(pool, a, 4);
  cache.insert(tokens, a);
  pool.release(a);
  cache.flush();
  EXPECT_EQ(segment_files(dir.str()).size(), 1u) << "a prompt's new pages are written through as one segment";
  EXPECT_EQ(cache.disk()->stats().pages, 4) << "every page the pool tier takes is written through to disk";

  // The pool needs every page: the four move to RAM, which keeps two (the chain's first ones,
  // the most recent) and lets the others go (the disk holds them).
  while (cache.evict_one()) {
  }
  EXPECT_EQ(pool.free_pages(), 8);
  EXPECT_EQ(cache.entries(), 0);
  EXPECT_EQ(cache.ram()->blocks(), 2);
  EXPECT_LE(cache.ram()->bytes(), 2 * block) << "the RAM budget holds";

  PageTable back;
  EXPECT_EQ(cache.match(tokens, 16, &back), 16) << "the last two pages, from the middle of the segment on";
  EXPECT_EQ(page_bytes(pool, back, 4), original) << "the pages came back bit for bit";
  const PrefixCacheStats s = cache.stats();
  EXPECT_EQ(s.hit_tokens[int(CacheTier::Ram)], 2 * kPage);
  EXPECT_EQ(s.hit_tokens[int(CacheTier::Disk)], 2 * kPage);
  EXPECT_EQ(s.hit_bytes[int(CacheTier::Disk)], 2 * pool.bytes_per_page());
  EXPECT_EQ(cache.ram()->blocks(), 0) << "promotion takes a page out of RAM";
  EXPECT_EQ(cache.entries(), 4);
  pool.release(back);
}

// A pool full of cached pages that all wait for their disk writes (a long prompt just inserted,
// the writer behind): evict_one waits for one write, not for the queue behind it (up to
// disk_max_pending_bytes), and the chain stays whole across the tiers.
TEST(PromptCacheTiers, AFullPoolWaitsForOneDiskWriteNotTheQueue) {
  test::TempDir dir("evict-wait");
  LatentPool pool = make_pool(4);
  std::mutex mu;
  std::condition_variable cv;
  int allowed = 0, started = 0;  // segment writes let through, and begun
  PrefixCacheOptions o = tiers(0, dir.str(), int64_t(1) << 30);
  o.disk_segment_pages = 1;  // a segment a page: four writes queued
  o.disk_before_write = [&] {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return started < allowed; });
    ++started;
  };
  auto let_through = [&](int n) {
    {
      std::lock_guard lock(mu);
      allowed = n;
    }
    cv.notify_all();
  };
  PrefixCache cache(pool, o);
  const auto tokens = ids(4 * kPage);
  PageTable a = written(pool, tokens);
  const std::vector<uint8_t> original = page_bytes(pool, a, 4);
  cache.insert(tokens, a);
  pool.release(a);
  ASSERT_EQ(pool.free_pages(), 0) << "the cache holds the four pages, each pinned by its write";
  auto evicting = std::async(std::launch::async, [&] { return cache.evict_one(); });
  EXPECT_EQ(evicting.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
      << "no page can go before its write is done";
  let_through(1);
  const bool finished = evicting.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  if (finished) {
    EXPECT_TRUE(evicting.get());
    EXPECT_EQ(pool.free_pages(), 1);
    std::lock_guard lock(mu);
    EXPECT_EQ(started, 1) << "the other three writes still wait";
  }
  let_through(4);  // (where evict_one waited for the whole queue, this lets it end)
  ASSERT_TRUE(finished) << "evict_one waited for the writes queued behind the first";
  cache.flush();
  EXPECT_EQ(cache.disk()->stats().pages, 4);
  PageTable back;
  EXPECT_EQ(cache.match(tokens, 16, &back), 16) << "the evicted page from disk, the others from the pool";
  EXPECT_EQ(page_bytes(pool, back, 4), original);
  EXPECT_EQ(cache.stats().hit_tokens[int(CacheTier::Disk)], kPage);
  EXPECT_EQ(cache.stats().hit_tokens[int(CacheTier::Pool)], 3 * kPage);
  pool.release(back);
}

TEST(PromptCacheTiers, ARestartReadsThePagesBackFromDisk) {
  test::TempDir dir("restart");
  const auto tokens = ids(13);
  std::vector<uint8_t> original;
  {
    LatentPool pool = make_pool(8);
    PrefixCache cache(pool, tiers(0, dir.str(), int64_t(1) << 30));
    PageTable a = written(pool, tokens);
    original = page_bytes(pool, a, 3);
    cache.insert(tokens, a);
    pool.release(a);
  }  // the cache's end finishes its writes
  LatentPool pool = make_pool(8);
  PrefixCache cache(pool, tiers(0, dir.str(), int64_t(1) << 30));
  PageTable t;
  EXPECT_EQ(cache.match(tokens, 12, &t, 0), 12);
  EXPECT_EQ(page_bytes(pool, t, 3), original);
  EXPECT_EQ(cache.stats().hit_tokens[int(CacheTier::Disk)], 12);
  pool.release(t);

  // Another cache format on the same directory never sees these pages.
  LatentPool f32 = make_pool(8, KvDType::F32);
  PrefixCache other(f32, tiers(0, dir.str(), int64_t(1) << 30));
  PageTable none;
  EXPECT_EQ(other.match(tokens, 12, &none), 0);
  PrefixCacheOptions o = tiers(0, dir.str(), int64_t(1) << 30);
  o.fingerprint = Digest().add("another checkpoint").finish();
  LatentPool same = make_pool(8);
  PrefixCache another(same, o);
  EXPECT_EQ(another.match(tokens, 12, &none), 0) << "another checkpoint's fingerprint: another folder";
}

// Writes the full pages of `tokens` into dir through a cache, finished.
void write_pages(const std::string& dir, const std::vector<int32_t>& tokens) {
  LatentPool pool = make_pool(16);
  PrefixCache cache(pool, tiers(0, dir, int64_t(1) << 30));
  PageTable a = written(pool, tokens);
  cache.insert(tokens, a);
  pool.release(a);
}

// Every byte of a fresh computation of the first `pages` pages of tokens.
std::vector<uint8_t> computed(const std::vector<int32_t>& tokens, int64_t pages) {
  LatentPool pool = make_pool(16);
  PageTable t = written(pool, tokens);
  return page_bytes(pool, t, pages);
}

// The share of a file's 4 KiB blocks in the page cache from byte `from` on (mincore).
double cached_share(const fs::path& file, int64_t from) {
  const int fd = ::open(file.c_str(), O_RDONLY);
  const size_t size = size_t(fs::file_size(file));
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  const size_t block = size_t(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((size + block - 1) / block);
  ::mincore(m, size, in.data());
  ::munmap(m, size);
  const size_t first = size_t(from) / block;
  return double(std::count_if(in.begin() + long(first), in.end(), [](unsigned char c) { return c & 1; })) /
         double(in.size() - first);
}

TEST(PromptCacheTiers, PrefetchWarmsThePageCacheOnAnotherThreadAndAdmissionReadsIntoThePool) {
  test::TempDir dir("prefetch");
  const auto tokens = ids(12);
  write_pages(dir.str(), tokens);
  const fs::path file = segment_files(dir.str()).at(0);
  const int64_t payloads_at = DiskTier::payload_offset(3, kPage);
  {  // out of the page cache (a clean file's pages go at once)
    const int fd = ::open(file.c_str(), O_RDONLY);
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  const double before = cached_share(file, payloads_at);
  LatentPool pool = make_pool(8);
  PrefixCache cache(pool, tiers(int64_t(1) << 20, dir.str(), int64_t(1) << 30));
  std::thread([&] { cache.prefetch(tokens); }).join();
  EXPECT_EQ(cache.disk()->stats().warmed, 3);
  EXPECT_EQ(cache.disk()->stats().read, 0) << "warming copies nothing";
  EXPECT_EQ(cache.ram()->blocks(), 0) << "nor fills the RAM tier";
  if (before < 0.5) EXPECT_EQ(cached_share(file, payloads_at), 1.0) << "every payload block in the page cache";
  else std::printf("the kernel kept the segment cached (%.2f): the page cache is not checked\n", before);
  PageTable t;
  EXPECT_EQ(cache.match(tokens, 12, &t), 12);
  EXPECT_EQ(page_bytes(pool, t, 3), computed(tokens, 3)) << "read straight into the pool, bit for bit";
  EXPECT_EQ(cache.stats().hit_tokens[int(CacheTier::Disk)], 12);
  EXPECT_EQ(cache.disk()->stats().read, 3) << "each page read once";
  pool.release(t);
}

TEST(PromptCacheTiers, FlippedTruncatedAndForeignSegmentsAreDroppedAndRecomputed) {
  test::TempDir dir("corrupt");
  const auto tokens = ids(12);  // three pages: one segment
  LatentPool probe = make_pool(1);
  const int64_t payload = probe.bytes_per_page();
  const int64_t payloads_at = DiskTier::payload_offset(3, kPage);
  const int64_t table_at = 48, entry = 24 + 4 * kPage;  // the header, then a table entry a page
  struct Case {
    const char* what;
    std::function<void(const fs::path&)> spoil;
    int64_t served;  // tokens still served from the segment
    const char* warning;
  };
  const std::vector<Case> cases = {
      {"a flipped payload byte in the second page", [&](const fs::path& f) { flip(f, payloads_at + payload + 5); }, 4,
       "payload's checksum"},
      {"a flipped payload byte in the first page", [&](const fs::path& f) { flip(f, payloads_at + 3); }, 0,
       "payload's checksum"},
      {"a flipped header byte", [&](const fs::path& f) { flip(f, 40); }, 0, "header's checksum"},
      {"a flipped key in the table", [&](const fs::path& f) { flip(f, table_at + entry + 3); }, 0, "header's checksum"},
      {"a flipped token", [&](const fs::path& f) { flip(f, table_at + entry + 24 + 2); }, 0, "header's checksum"},
      {"a truncated file", [&](const fs::path& f) { fs::resize_file(f, fs::file_size(f) - 100); }, 0, "size"},
      {"a file cut inside its table", [&](const fs::path& f) { fs::resize_file(f, table_at + 10); }, 0, "size"},
      {"another chain's segment under this name",
       [&](const fs::path& f) {
         test::TempDir other("corrupt-other");
         write_pages(other.str(), ids(12, 5000));
         fs::copy_file(segment_files(other.str()).at(0), f, fs::copy_options::overwrite_existing);
       },
       0, "key or geometry"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    fs::remove_all(dir.path);
    write_pages(dir.str(), tokens);
    const auto files = segment_files(dir.str());
    ASSERT_EQ(files.size(), 1u);
    c.spoil(files[0]);
    Warnings w;
    {
      LatentPool pool = make_pool(8);
      PrefixCache cache(pool, tiers(0, dir.str(), int64_t(1) << 30, &w));
      PageTable t;
      EXPECT_EQ(cache.match(tokens, 12, &t), c.served) << "only the pages before the bad one are served";
      if (c.served > 0) {
        EXPECT_EQ(page_bytes(pool, t, c.served / kPage), computed(tokens, c.served / kPage));
      }
      EXPECT_TRUE(w.any(c.warning)) << (w.lines.empty() ? "no warning" : w.lines[0]);
      EXPECT_EQ(cache.stats().disk_rejected, 1);
      cache.flush();
      if (c.served == 0) EXPECT_FALSE(fs::exists(files[0])) << "the bad segment is deleted";
      else EXPECT_EQ(int64_t(fs::file_size(files[0])), cache.disk()->segment_bytes(c.served / kPage))
          << "the bad segment is deleted, and the pages served from it are written again";
      // Recomputed, the pages are written again.
      PageTable again = written(pool, tokens);
      cache.insert(tokens, again);
      pool.release(again);
      pool.release(t);
    }
    LatentPool pool = make_pool(8);
    PrefixCache cache(pool, tiers(0, dir.str(), int64_t(1) << 30, &w));
    PageTable t;
    EXPECT_EQ(cache.match(tokens, 12, &t), 12) << "a restart reads every page again";
    EXPECT_EQ(page_bytes(pool, t, 3), computed(tokens, 3));
    EXPECT_EQ(cache.stats().disk_rejected, 0);
    pool.release(t);
  }
}

TEST(PromptCacheTiers, ABadPageEndsTheReadAndThePagesBeforeItAreUsed) {
  test::TempDir dir("bad-page");
  const auto tokens = ids(32);  // eight pages: one segment
  write_pages(dir.str(), tokens);
  const auto files = segment_files(dir.str());
  ASSERT_EQ(files.size(), 1u);
  LatentPool probe = make_pool(1);
  flip(files[0], DiskTier::payload_offset(8, kPage) + 5 * probe.bytes_per_page() + 7);  // the sixth page
  Warnings w;
  LatentPool pool = make_pool(16);
  PrefixCache cache(pool, tiers(0, dir.str(), int64_t(1) << 30, &w));
  EXPECT_EQ(cache.stats().disk_pages, 8) << "the header and table are whole";
  PageTable t;
  EXPECT_EQ(cache.match(tokens, 32, &t), 20) << "pages 0-4 are served, page 5 on are recomputed";
  EXPECT_EQ(page_bytes(pool, t, 5), computed(tokens, 5));
  EXPECT_EQ(cache.stats().hit_tokens[int(CacheTier::Disk)], 20);
  EXPECT_EQ(cache.stats().disk_rejected, 1);
  EXPECT_TRUE(w.any("payload's checksum")) << (w.lines.empty() ? "no warning" : w.lines[0]);
  pool.release(t);
}

TEST(PromptCacheTiers, APageInsideASegmentIsFoundAfterARestart) {
  test::TempDir dir("inside");
  const auto tokens = ids(32);  // eight pages: one segment
  write_pages(dir.str(), tokens);
  ASSERT_EQ(segment_files(dir.str()).size(), 1u);
  LatentPool pool = make_pool(32);
  PrefixCache cache(pool, tiers(0, dir.str(), int64_t(1) << 30));
  // The pool already holds the first three pages (computed here): the walk meets the disk at
  // the fourth page, inside the segment.
  const std::vector<int32_t> head(tokens.begin(), tokens.begin() + 12);
  PageTable a = written(pool, head);
  cache.insert(head, a);
  pool.release(a);
  cache.flush();
  EXPECT_EQ(segment_files(dir.str()).size(), 1u) << "pages the disk holds are not written again";
  PageTable t;
  EXPECT_EQ(cache.match(tokens, 32, &t), 32);
  EXPECT_EQ(cache.stats().hit_tokens[int(CacheTier::Pool)], 12);
  EXPECT_EQ(cache.stats().hit_tokens[int(CacheTier::Disk)], 20);
  EXPECT_EQ(page_bytes(pool, t, 8), computed(tokens, 8));
  pool.release(t);
  cache.clear();

  // A prompt that leaves the chain after five pages hits those five (a page boundary inside
  // the segment); one that extends the chain hits all eight.
  std::vector<int32_t> other = tokens;
  other[21] = 7;
  PageTable u;
  EXPECT_EQ(cache.match(other, 32, &u), 20);
  pool.release(u);
  cache.clear();
  std::vector<int32_t> longer = tokens;
  for (int32_t i = 0; i < 9; ++i) longer.push_back(9000 + i);
  PageTable v;
  EXPECT_EQ(cache.match(longer, int64_t(longer.size()), &v), 32);
  pool.release(v);

  // The tier itself, asked from the sixth page on: the rest of the segment, in one read.
  DiskTierOptions o;
  o.dir = dir.str();
  o.budget_bytes = int64_t(1) << 30;
  o.fingerprint = Hash128::from_hex(fs::path(cache.disk()->folder()).filename().string()).value();
  o.page_size = kPage;
  for (auto part : pool.page_parts(0)) o.part_bytes.push_back(int64_t(part.size()));
  DiskTier disk(o);
  const std::vector<Hash128> keys = page_keys(tokens, kPage, 8);
  const auto pages = disk.read(std::span(keys).subspan(5), std::span(tokens).subspan(5 * kPage));
  ASSERT_EQ(pages.size(), 3u);
  EXPECT_EQ(pages[2]->key, keys[7]);
  EXPECT_EQ(disk.stats().read_bytes, 48 + 8 * (24 + 4 * kPage) + 8 + 3 * pool.bytes_per_page())
      << "the header and table, then only the three pages asked for";
}

TEST(PromptCacheTiers, ASigkillMidWriteLeavesNoHalfEntry) {
  test::TempDir dir("sigkill");
  // A child writes chains of 16 pages (a segment of 4.7 MB each) as fast as it can; it is
  // killed mid-stream.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    LatentPool pool(kLayers, 512, 64, 64, 64, KvDType::F32, 0);
    PrefixCache cache(pool, tiers(0, dir.str(), int64_t(1) << 34));
    for (int32_t round = 0;; ++round) {
      auto tokens = ids(64 * 16, round * 100000);
      PageTable a;
      if (!pool.reserve(a, int64_t(tokens.size()))) {  // pages still held for their writes
        cache.flush();
        continue;
      }
      a.length = int64_t(tokens.size());
      cache.insert(tokens, a);
      pool.release(a);
      cache.clear();
      cache.poll();
    }
  }
  // Wait until files appear, then kill.
  for (int i = 0; i < 500 && segment_files(dir.str()).size() < 12; ++i) usleep(10000);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  const auto files = segment_files(dir.str());
  ASSERT_GE(files.size(), 3u);
  // Every segment file is whole: a fresh tier of the same format reads each without a rejection.
  Warnings w;
  DiskTierOptions o;
  o.dir = dir.str();
  o.budget_bytes = int64_t(1) << 34;
  LatentPool probe(kLayers, 512, 64, 1, 64, KvDType::F32, 0);
  for (auto part : probe.page_parts(0)) o.part_bytes.push_back(int64_t(part.size()));
  o.page_size = 64;
  o.warn = w.sink();
  o.fingerprint = Hash128::from_hex(files[0].parent_path().filename().string()).value();
  int64_t checked = 0;
  {
    DiskTier disk(o);
    for (int32_t round = 0; round < 1000; ++round) {
      const auto tokens = ids(64 * 16, round * 100000);
      const auto keys = page_keys(tokens, 64, 16);
      if (fs::exists(disk.path_of(keys[0]))) {
        EXPECT_EQ(disk.read(keys, tokens).size(), 16u);
        ++checked;
      }
    }
    EXPECT_EQ(disk.stats().rejected, 0) << (w.lines.empty() ? "" : w.lines[0]);
  }
  EXPECT_EQ(checked, int64_t(files.size()));
  // A temporary file left behind is removed by a later start once it is old.
  int64_t temps = 0;
  for (auto& e : fs::directory_iterator(files[0].parent_path()))
    if (e.path().filename().string().rfind(".tmp.", 0) == 0) {
      ++temps;
      timeval old[2] = {{1, 0}, {1, 0}};
      ::utimes(e.path().c_str(), old);
    }
  std::ofstream(files[0].parent_path() / ".tmp.stale.1.1") << "half";
  timeval old[2] = {{1, 0}, {1, 0}};
  ::utimes((files[0].parent_path() / ".tmp.stale.1.1").c_str(), old);
  DiskTier again(o);
  for (auto& e : fs::directory_iterator(files[0].parent_path()))
    EXPECT_NE(e.path().filename().string().rfind(".tmp.", 0), 0u) << e.path();
  std::printf("[ sigkill  ] %zu whole segment files, %lld temporary files left by the kill, removed\n", files.size(),
              (long long)temps);
}

TEST(PromptCacheTiers, TwoCachesOnOneDirectoryNeverCorruptIt) {
  test::TempDir dir("shared");
  auto run = [&](int32_t seed) {
    LatentPool pool = make_pool(64);
    PrefixCache cache(pool, tiers(0, dir.str(), int64_t(1) << 30));
    for (int round = 0; round < 30; ++round) {
      // Half the prompts are the same chain for both caches (the same first key, written at
      // once), ten pages long in one cache and six in the other: segments of the same name
      // and different lengths replace each other.
      const bool shared = round % 2 == 0;
      auto tokens = ids(shared && seed == 2 ? 24 : 40, (shared ? 7 : seed) * 1000 + round);
      PageTable a = written(pool, tokens);
      cache.insert(tokens, a);
      pool.release(a);
      while (cache.evict_one()) {
      }
    }
  };
  std::thread one(run, 1), two(run, 2);
  one.join();
  two.join();
  LatentPool pool = make_pool(64);
  PrefixCache cache(pool, tiers(0, dir.str(), int64_t(1) << 30));
  for (int32_t seed : {1, 2, 7})
    for (int round = 0; round < 30; ++round) {
      if ((round % 2 == 0) != (seed == 7)) continue;
      auto tokens = ids(40, seed * 1000 + round);
      PageTable t;
      const int64_t got = cache.match(tokens, 40, &t);
      if (seed == 7) EXPECT_GE(got, 24) << "the shorter writer's pages at least, round " << round;
      else EXPECT_EQ(got, 40) << seed << " " << round;
      EXPECT_EQ(page_bytes(pool, t, got / kPage), computed(tokens, got / kPage));
      pool.release(t);
      while (cache.evict_one()) {
      }
    }
  EXPECT_EQ(cache.stats().disk_rejected, 0);
}

TEST(PromptCacheTiers, AShorterSegmentOfTheSameNameIsAMissNeverAWrongPage) {
  test::TempDir dir("replaced");
  const auto tokens = ids(32);  // eight pages
  const std::vector<int32_t> head(tokens.begin(), tokens.begin() + 16);
  LatentPool pool_a = make_pool(16), pool_b = make_pool(16);
  PrefixCache a(pool_a, tiers(0, dir.str(), int64_t(1) << 30)), b(pool_b, tiers(0, dir.str(), int64_t(1) << 30));
  PageTable ta = written(pool_a, tokens);
  a.insert(tokens, ta);
  pool_a.release(ta);
  a.flush();
  // b started before a wrote: it does not know a's segment and writes the chain's first four
  // pages under the same name, replacing it.
  PageTable tb = written(pool_b, head);
  b.insert(head, tb);
  pool_b.release(tb);
  b.flush();
  ASSERT_EQ(segment_files(dir.str()).size(), 1u);
  a.clear();
  PageTable t;
  EXPECT_EQ(a.match(tokens, 32, &t), 16) << "the pages the file holds now; the others are a miss";
  EXPECT_EQ(page_bytes(pool_a, t, 4), computed(tokens, 4));
  EXPECT_EQ(a.stats().disk_rejected, 0);
  // Recomputed, the missing pages are written again, and the whole chain is on disk.
  PageTable again = written(pool_a, tokens);
  a.insert(tokens, again);
  pool_a.release(again);
  pool_a.release(t);
  a.flush();
  LatentPool pool = make_pool(16);
  PrefixCache c(pool, tiers(0, dir.str(), int64_t(1) << 30));
  PageTable all;
  EXPECT_EQ(c.match(tokens, 32, &all), 32);
  pool.release(all);

  // A chain that another cache wrote after this one started is found by its first key.
  const auto fresh = ids(32, 9000);
  PageTable tf = written(pool_a, fresh);
  a.insert(fresh, tf);
  pool_a.release(tf);
  a.flush();
  b.clear();
  PageTable u;
  EXPECT_EQ(b.match(fresh, 32, &u), 32);
  EXPECT_EQ(page_bytes(pool_b, u, 8), computed(fresh, 8));
  pool_b.release(u);
}

TEST(PromptCacheTiers, TheDiskBudgetEvictsWholeSegmentsAndKeepsTheRecentlyUsed) {
  test::TempDir dir("budget");
  PrefixCacheOptions o = tiers(0, dir.str(), int64_t(1) << 30);
  o.disk_segment_pages = 4;
  LatentPool probe = make_pool(1);
  const int64_t segment = PrefixCache(probe, o).disk()->segment_bytes(4);
  o.disk_bytes = segment * 7 / 2;  // three segments and a half
  std::vector<std::vector<int32_t>> chains = {ids(16, 5000)};  // four pages a chain: a segment
  {
    LatentPool pool = make_pool(64);
    PrefixCache cache(pool, o);
    const std::vector<int32_t> first = chains[0];  // used again every round
    PageTable a = written(pool, first);
    cache.insert(first, a);
    pool.release(a);
    for (int round = 0; round < 6; ++round) {
      cache.flush();
      PageTable hit;
      while (cache.evict_one()) {
      }
      EXPECT_EQ(cache.match(first, 16, &hit), 16) << "the recently used pages survive, round " << round;
      pool.release(hit);
      while (cache.evict_one()) {
      }
      chains.push_back(ids(16, 100 * round));
      PageTable b = written(pool, chains.back());
      cache.insert(chains.back(), b);
      pool.release(b);
    }
    cache.flush();
    EXPECT_GT(cache.stats().disk_evicted, 0);
  }
  int64_t bytes = 0;
  const auto files = segment_files(dir.str());
  for (auto& f : files) bytes += int64_t(fs::file_size(f));
  EXPECT_LE(bytes, o.disk_bytes);
  EXPECT_EQ(bytes, int64_t(files.size()) * segment) << "only whole segments";
  // Each chain is on disk whole or not at all.
  LatentPool pool = make_pool(64);
  PrefixCache cache(pool, o);
  int64_t whole = 0;
  for (const auto& chain : chains) {
    PageTable t;
    const int64_t got = cache.match(chain, 16, &t);
    EXPECT_TRUE(got == 0 || got == 16) << got;
    whole += got == 16;
    pool.release(t);
    cache.clear();
  }
  EXPECT_EQ(whole, int64_t(files.size()));
}

TEST(PromptCacheTiers, PageBlocksShareOneAllocationOfHugePagesWhenLarge) {
  struct Case {
    int64_t count, page_bytes;
    bool huge;  // a mapping aligned to 2 MiB
  };
  for (const Case& c : {Case{8, 512 << 10, true}, Case{1, 4096, false}, Case{3, 700000, false}}) {
    SCOPED_TRACE(std::to_string(c.count) + " x " + std::to_string(c.page_bytes));
    uint8_t* data = nullptr;
    auto blocks = new_page_blocks(c.count, c.page_bytes, &data);
    ASSERT_EQ(int64_t(blocks.size()), c.count);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(data) % (2 << 20) == 0, c.huge);
    for (int64_t i = 0; i < c.count * c.page_bytes; ++i) data[i] = uint8_t(i / c.page_bytes + 1);
    std::weak_ptr<void> memory = blocks[0]->memory;
    for (int64_t i = 0; i < c.count; ++i) {
      EXPECT_EQ(blocks[size_t(i)]->bytes.data(), data + i * c.page_bytes);
      EXPECT_EQ(int64_t(blocks[size_t(i)]->bytes.size()), c.page_bytes);
      EXPECT_EQ(blocks[size_t(i)]->bytes.back(), uint8_t(i + 1));
    }
    auto last = blocks.back();
    blocks.clear();
    EXPECT_FALSE(memory.expired()) << "the memory lives while a block does";
    last.reset();
    EXPECT_TRUE(memory.expired());
  }

  // Pages of 512 KiB through the disk tier: a segment of eight read into one such allocation.
  test::TempDir dir("large");
  DiskTierOptions o;
  o.dir = dir.str();
  o.budget_bytes = int64_t(1) << 30;
  o.fingerprint = Digest().add("large pages").finish();
  o.page_size = kPage;
  o.part_bytes = {256 << 10, 256 << 10};
  const auto tokens = ids(8 * kPage);
  const auto keys = page_keys(tokens, kPage, 8);
  std::vector<uint8_t> bytes(size_t(8) << 19);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 7 + i / 4099);
  DiskTier disk(o);
  std::vector<PageWrite> w(8);
  for (size_t p = 0; p < 8; ++p) {
    w[p].key = keys[p];
    w[p].tokens.assign(tokens.begin() + int64_t(p) * kPage, tokens.begin() + int64_t(p + 1) * kPage);
    w[p].parts = {{bytes.data() + (p << 19), 256 << 10}, {bytes.data() + (p << 19) + (256 << 10), 256 << 10}};
  }
  EXPECT_EQ(disk.write(std::move(w)), 8);
  disk.flush();
  const auto pages = disk.read(keys, tokens);
  ASSERT_EQ(pages.size(), 8u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pages[0]->bytes.data()) % (2 << 20), 0u);
  for (size_t p = 0; p < 8; ++p)
    EXPECT_TRUE(std::equal(pages[p]->bytes.begin(), pages[p]->bytes.end(), bytes.begin() + int64_t(p << 19))) << p;
}

TEST(PromptCacheTiers, AnUnwritableDirectoryTurnsTheTierOffWithAWarning) {
  test::TempDir dir("unwritable");
  std::ofstream(dir / "file") << "x";
  Warnings w;
  LatentPool pool = make_pool(8);
  PrefixCache cache(pool, tiers(0, dir / "file/cache", 1 << 30, &w));
  EXPECT_EQ(cache.disk(), nullptr);
  EXPECT_TRUE(w.any("disk tier is off")) << (w.lines.empty() ? "no warning" : w.lines[0]);
  const auto tokens = ids(8);
  PageTable a = written(pool, tokens), t;
  cache.insert(tokens, a);
  EXPECT_EQ(cache.match(tokens, 8, &t), 8) << "the pool tier goes on";
  pool.release(a);
  pool.release(t);
}

TEST(PromptCacheTiers, AFullDiskTurnsTheWritesOffAndServesOn) {
  test::TempDir dir("full");
  const std::string mnt = dir / "tmpfs";
  fs::create_directories(mnt);
  const bool mounted = ::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=64k") == 0;
  struct rlimit saved {};
  if (!mounted) {  // not root: a file-size limit fails the writes as a full disk does
    ::getrlimit(RLIMIT_FSIZE, &saved);
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = saved;
    small.rlim_cur = 100;
    ::setrlimit(RLIMIT_FSIZE, &small);
  }
  std::printf("[ full     ] %s\n", mounted ? "a 64 KiB tmpfs" : "RLIMIT_FSIZE of 100 bytes (no mount: not root)");
  {
    Warnings w;
    LatentPool pool = make_pool(64);
    PrefixCache cache(pool, tiers(0, mnt, 1 << 30, &w));
    ASSERT_NE(cache.disk(), nullptr);
    for (int round = 0; round < 20; ++round) {
      auto tokens = ids(32, round * 1000);
      PageTable a = written(pool, tokens), t;
      cache.insert(tokens, a);
      cache.flush();
      EXPECT_EQ(cache.match(tokens, 32, &t), 32) << "requests go on";
      pool.release(a);
      pool.release(t);
      while (cache.evict_one()) {
      }
    }
    EXPECT_TRUE(w.any("stops writing")) << (w.lines.empty() ? "no warning" : w.lines[0]);
    EXPECT_FALSE(cache.disk()->writable());
    EXPECT_EQ(cache.stats().disk_rejected, 0) << "no half-written file is ever read";
  }
  if (mounted) ::umount(mnt.c_str());
  else ::setrlimit(RLIMIT_FSIZE, &saved);
}

}  // namespace
}  // namespace mla
