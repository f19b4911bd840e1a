// The prompt cache's RAM and disk tiers over a small latent pool of two layers with indexer keys
// (every part of a page): pages move from the pool to RAM to disk and back bit for bit, a
// restart reads the disk, prefetch fills RAM from another thread; and nothing wrong is ever
// served: flipped, truncated and foreign files are dropped and recomputed, a SIGKILL mid-write
// leaves no half entry, two caches on one directory never corrupt it, every budget holds, and
// an unwritable or full disk turns the tier off with a warning instead of failing.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
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

std::vector<fs::path> page_files(const std::string& dir) {
  std::vector<fs::path> files;
  for (auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().extension() == ".page") files.push_back(e.path());
  return files;
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
  EXPECT_EQ(page_files(dir.str()).size(), 4u) << "every page the pool tier takes is written through to disk";

  // The pool needs every page: the four move to RAM, which keeps two (the chain's first ones,
  // the most recent) and lets the others go (the disk holds them).
  while (cache.evict_one()) {
  }
  EXPECT_EQ(pool.free_pages(), 8);
  EXPECT_EQ(cache.entries(), 0);
  EXPECT_EQ(cache.ram()->blocks(), 2);
  EXPECT_LE(cache.ram()->bytes(), 2 * block) << "the RAM budget holds";

  PageTable back;
  EXPECT_EQ(cache.match(tokens, 16, &back), 16);
  EXPECT_EQ(page_bytes(pool, back, 4), original) << "the pages came back bit for bit";
  const PrefixCacheStats s = cache.stats();
  EXPECT_EQ(s.hit_tokens[int(CacheTier::Ram)], 2 * kPage);
  EXPECT_EQ(s.hit_tokens[int(CacheTier::Disk)], 2 * kPage);
  EXPECT_EQ(s.hit_bytes[int(CacheTier::Disk)], 2 * pool.bytes_per_page());
  EXPECT_EQ(cache.ram()->blocks(), 0) << "promotion takes a page out of RAM";
  EXPECT_EQ(cache.entries(), 4);
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

TEST(PromptCacheTiers, PrefetchFillsRamFromDiskOnAnotherThread) {
  test::TempDir dir("prefetch");
  const auto tokens = ids(12);
  {
    LatentPool pool = make_pool(8);
    PrefixCache cache(pool, tiers(0, dir.str(), int64_t(1) << 30));
    PageTable a = written(pool, tokens);
    cache.insert(tokens, a);
    pool.release(a);
  }
  LatentPool pool = make_pool(8);
  PrefixCache cache(pool, tiers(int64_t(1) << 20, dir.str(), int64_t(1) << 30));
  std::thread([&] { cache.prefetch(tokens); }).join();
  EXPECT_EQ(cache.ram()->blocks(), 3);
  PageTable t;
  EXPECT_EQ(cache.match(tokens, 12, &t), 12);
  EXPECT_EQ(cache.stats().hit_tokens[int(CacheTier::Disk)], 12) << "pages prefetched from disk count as the disk's";
  EXPECT_EQ(cache.disk()->stats().read, 3) << "each page read once";
  pool.release(t);
}

// Writes three pages of `tokens` into dir through a cache, finished.
void write_pages(const std::string& dir, const std::vector<int32_t>& tokens) {
  LatentPool pool = make_pool(8);
  PrefixCache cache(pool, tiers(0, dir, int64_t(1) << 30));
  PageTable a = written(pool, tokens);
  cache.insert(tokens, a);
  pool.release(a);
}

TEST(PromptCacheTiers, FlippedTruncatedAndForeignFilesAreDroppedAndRecomputed) {
  test::TempDir dir("corrupt");
  const auto tokens = ids(12);
  write_pages(dir.str(), tokens);
  auto files = page_files(dir.str());
  ASSERT_EQ(files.size(), 3u);
  // Which file is which page: by the keys of the chain.
  const std::vector<Hash128> keys = page_keys(tokens, kPage, 3);
  auto file_of = [&](int i) {
    for (auto& f : files)
      if (f.stem().string() == keys[size_t(i)].hex()) return f;
    return fs::path();
  };
  auto flip = [](const fs::path& f, int64_t at) {
    std::fstream s(f, std::ios::in | std::ios::out | std::ios::binary);
    s.seekg(at);
    char c;
    s.get(c);
    s.seekp(at);
    s.put(char(c ^ 0x10));
  };

  struct Case {
    const char* what;
    std::function<void()> spoil;  // spoils page 1 (the second)
    const char* warning;
  };
  const fs::path second = file_of(1);
  const auto size = int64_t(fs::file_size(second));
  const std::vector<Case> cases = {
      {"a flipped payload byte", [&] { flip(second, size - 3); }, "payload's checksum"},
      {"a flipped header byte", [&] { flip(second, 40); }, "header's checksum"},
      {"a flipped token", [&] { flip(second, 64 + 2); }, "header's checksum"},
      {"a truncated file", [&] { fs::resize_file(second, uint64_t(size - 100)); }, "size"},
      {"another page's file under this key", [&] { fs::copy_file(file_of(2), second, fs::copy_options::overwrite_existing); },
       "key or geometry"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    fs::remove_all(dir.path);
    write_pages(dir.str(), tokens);
    files = page_files(dir.str());
    c.spoil();
    Warnings w;
    LatentPool pool = make_pool(8);
    PrefixCache cache(pool, tiers(0, dir.str(), int64_t(1) << 30, &w));
    PageTable t;
    EXPECT_EQ(cache.match(tokens, 12, &t), 4) << "only the first page is served";
    EXPECT_FALSE(fs::exists(second)) << "the bad file is deleted";
    EXPECT_TRUE(w.any(c.warning)) << (w.lines.empty() ? "no warning" : w.lines[0]);
    EXPECT_EQ(cache.stats().disk_rejected, 1);
    // Recomputed, the page is written again and served.
    PageTable again = written(pool, tokens);
    cache.insert(tokens, again);
    pool.release(again);
    pool.release(t);
    cache.flush();
    EXPECT_TRUE(fs::exists(second));
  }
}

TEST(PromptCacheTiers, ASigkillMidWriteLeavesNoHalfEntry) {
  test::TempDir dir("sigkill");
  // A child writes pages of 1 MiB-ish chains as fast as it can; it is killed mid-stream.
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
  for (int i = 0; i < 500 && page_files(dir.str()).size() < 40; ++i) usleep(10000);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  const auto files = page_files(dir.str());
  ASSERT_GE(files.size(), 10u);
  // Every page file is whole: a fresh tier of the same format reads each without a rejection.
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
      for (size_t i = 0; i < keys.size(); ++i)
        if (fs::exists(disk.folder() + "/" + keys[i].hex() + ".page")) {
          EXPECT_NE(disk.read(keys[i], std::span(tokens).subspan(i * 64, 64)), nullptr);
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
  std::printf("[ sigkill  ] %zu whole page files, %lld temporary files left by the kill, removed\n", files.size(),
              (long long)temps);
}

TEST(PromptCacheTiers, TwoCachesOnOneDirectoryNeverCorruptIt) {
  test::TempDir dir("shared");
  auto run = [&](int32_t seed) {
    LatentPool pool = make_pool(64);
    PrefixCache cache(pool, tiers(0, dir.str(), int64_t(1) << 30));
    for (int round = 0; round < 30; ++round) {
      // Half the prompts are the same for both caches (the same keys, written at once).
      auto tokens = ids(40, (round % 2 ? seed : 7) * 1000 + round);
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
      EXPECT_EQ(cache.match(tokens, 40, &t), 40) << seed << " " << round;
      LatentPool fresh = make_pool(16);
      PageTable w = written(fresh, tokens);
      EXPECT_EQ(page_bytes(pool, t, 10), page_bytes(fresh, w, 10));
      pool.release(t);
      while (cache.evict_one()) {
      }
    }
  EXPECT_EQ(cache.stats().disk_rejected, 0);
}

TEST(PromptCacheTiers, TheDiskBudgetHoldsAndKeepsTheRecentlyUsed) {
  test::TempDir dir("budget");
  LatentPool probe = make_pool(1);
  PrefixCache sizer(probe, tiers(0, dir.str(), 1 << 30));
  const int64_t file = sizer.disk()->file_bytes();
  const int64_t budget = 10 * file;
  {
    LatentPool pool = make_pool(64);
    PrefixCache cache(pool, tiers(0, dir.str(), budget));
    const auto first = ids(16, 5000);  // four pages, used again below
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
      auto tokens = ids(16, 100 * round);
      PageTable b = written(pool, tokens);
      cache.insert(tokens, b);
      pool.release(b);
    }
    cache.flush();
    int64_t bytes = 0;
    for (auto& f : page_files(dir.str())) bytes += int64_t(fs::file_size(f));
    EXPECT_LE(bytes, budget);
    EXPECT_GT(cache.stats().disk_evicted, 0);
  }
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
