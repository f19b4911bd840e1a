// DiskTier: segments of pages in files, checked on every read, written atomically in the
// background (see disk_tier.h).
#include "kv/disk_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>
#include <random>

namespace mla {

namespace {

constexpr char kMagic[8] = {'M', 'L', 'A', 'P', 'A', 'G', 'E', 'S'};
constexpr uint32_t kVersion = 2;
constexpr const char* kSuffix = ".seg";
constexpr const char* kOldSuffix = ".page";  // format version 1, one file a page
constexpr const char* kTmpPrefix = ".tmp.";
constexpr time_t kStaleTmpSeconds = 600;
constexpr int64_t kBlock = 4096;
// Pages a segment holds at most: a table of any size is read whole before the pages.
constexpr int64_t kMaxSegmentPages = 1024;

struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t page_size;
  uint64_t pages;
  uint64_t payload_bytes;  // a page's
  uint64_t fingerprint_hi, fingerprint_lo;
};
static_assert(sizeof(FileHeader) == 48);

// A table entry: the page's key and its payload's checksum, then its tokens.
constexpr int64_t kEntryFixed = 24;

int64_t table_bytes(int64_t pages, int64_t page_size) { return pages * (kEntryFixed + 4 * page_size); }

bool write_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= size_t(w);
  }
  return true;
}

bool pread_all(int fd, uint8_t* p, size_t n, off_t at) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, at);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= size_t(r);
    at += r;
  }
  return true;
}

// Reads `bytes` at `at` into the parts, in order (they hold at least that much).
bool preadv_all(int fd, std::span<const std::span<uint8_t>> parts, off_t at, int64_t bytes) {
  std::vector<iovec> iov;
  for (std::span<uint8_t> p : parts) iov.push_back({p.data(), p.size()});
  size_t first = 0;
  while (bytes > 0 && first < iov.size()) {
    const int count = int(std::min<size_t>(iov.size() - first, IOV_MAX));
    const ssize_t r = ::preadv(fd, iov.data() + first, count, at);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    at += r;
    bytes -= r;
    for (size_t left = size_t(r); left > 0 && first < iov.size();) {  // drop what was read
      const size_t take = std::min(left, iov[first].iov_len);
      iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + take;
      iov[first].iov_len -= take;
      left -= take;
      if (iov[first].iov_len == 0) ++first;
    }
  }
  return bytes <= 0;
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// The first key a segment file's name carries, if it is one.
std::optional<Hash128> segment_name(const std::string& file) {
  if (!ends_with(file, kSuffix)) return std::nullopt;
  return Hash128::from_hex(std::string_view(file).substr(0, file.size() - std::strlen(kSuffix)));
}

// The entries of a directory (names only, no "." or "..").
std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
    ::closedir(d);
  }
  return names;
}

}  // namespace

struct DiskTier::Table {
  int64_t pages = 0, payloads_at = 0, head_bytes = 0;
  std::vector<Hash128> keys;
  std::vector<uint64_t> checksums;
  std::vector<int32_t> tokens;  // pages x page_size
};

DiskTier::DiskTier(DiskTierOptions opt) : opt_(std::move(opt)) {
  nonce_ = std::random_device{}();
  if (!opt_.warn) opt_.warn = [](const std::string& m) { std::fprintf(stderr, "mla: %s\n", m.c_str()); };
  for (int64_t b : opt_.part_bytes) payload_bytes_ += b;
  if (opt_.segment_pages > 0) {
    segment_pages_ = std::min(opt_.segment_pages, kMaxSegmentPages);
  } else {
    segment_pages_ = std::clamp<int64_t>(kSegmentBytes / std::max<int64_t>(payload_bytes_, 1), 1, kMaxSegmentPages);
    // The budget holds several segments, so that the least recently used can go one at a time.
    while (segment_pages_ > 1 && segment_bytes(segment_pages_) > opt_.budget_bytes / 8) --segment_pages_;
  }
  folder_ = (std::filesystem::path(opt_.dir) / opt_.fingerprint.hex()).string();
  std::error_code ec;
  std::filesystem::create_directories(folder_, ec);
  if (ec || !std::filesystem::is_directory(folder_, ec)) {
    opt_.warn("the prompt cache's disk tier is off: cannot make " + folder_ + ": " +
              (ec ? ec.message() : std::string("not a directory")));
    return;
  }
  readable_ = true;
  writable_ = ::access(folder_.c_str(), W_OK) == 0;
  if (!writable_) opt_.warn("the prompt cache's disk tier only reads: " + folder_ + " is not writable");
  scan_own_folder();
  if (writable_) enforce_budget();
  writer_ = std::thread([this] { writer_loop(); });
}

DiskTier::~DiskTier() {
  if (!writer_.joinable()) return;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  writer_.join();
}

bool DiskTier::writable() const {
  std::lock_guard lock(mu_);
  return writable_;
}

int64_t DiskTier::payload_offset(int64_t pages, int64_t page_size) {
  const int64_t head = int64_t(sizeof(FileHeader)) + table_bytes(pages, page_size) + 8;
  return (head + kBlock - 1) / kBlock * kBlock;
}

int64_t DiskTier::segment_bytes(int64_t pages) const {
  return payload_offset(pages, opt_.page_size) + pages * payload_bytes_;
}

std::string DiskTier::path_of(const Hash128& first_key) const { return folder_ + "/" + first_key.hex() + kSuffix; }

bool DiskTier::contains(const Hash128& key) const {
  std::lock_guard lock(mu_);
  return where_.count(key) > 0 || queued_.count(key) > 0;
}

void DiskTier::index_segment(const Hash128& name, std::vector<Hash128> keys) {
  forget_segment(name);
  for (const Hash128& k : keys) where_[k] = name;
  segments_[name] = std::move(keys);
}

void DiskTier::forget_segment(const Hash128& name) {
  auto it = segments_.find(name);
  if (it == segments_.end()) return;
  for (const Hash128& k : it->second)
    if (auto w = where_.find(k); w != where_.end() && w->second == name) where_.erase(w);
  segments_.erase(it);
}

void DiskTier::reject(const Hash128& name, const char* why) {
  const std::string path = path_of(name);
  ::unlink(path.c_str());
  opt_.warn("the prompt cache dropped " + path + ": " + why);
  std::lock_guard lock(mu_);
  forget_segment(name);
  ++stats_.rejected;
}

bool DiskTier::read_table(int fd, const Hash128& name, Table* t, const char** why) const {
  const int64_t ps = opt_.page_size;
  struct stat st;
  FileHeader h;
  if (::fstat(fd, &st) != 0 || !pread_all(fd, reinterpret_cast<uint8_t*>(&h), sizeof h, 0)) {
    *why = "it cannot be read";
    return false;
  }
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.version != kVersion) {
    *why = "not a segment file of this version";
    return false;
  }
  // The page count sizes the table: bound it before reading the table and its checksum.
  if (h.pages < 1 || h.pages > uint64_t(kMaxSegmentPages) || h.page_size != uint32_t(ps)) {
    *why = "its key or geometry is wrong";
    return false;
  }
  if (payload_offset(int64_t(h.pages), ps) > int64_t(st.st_size)) {
    *why = "its size is wrong (truncated?)";
    return false;
  }
  t->pages = int64_t(h.pages);
  t->payloads_at = payload_offset(t->pages, ps);
  std::vector<uint8_t> head(sizeof h + size_t(table_bytes(t->pages, ps)) + 8);
  std::memcpy(head.data(), &h, sizeof h);
  if (!pread_all(fd, head.data() + sizeof h, head.size() - sizeof h, off_t(sizeof h))) {
    *why = "it cannot be read";
    return false;
  }
  t->head_bytes = int64_t(head.size());
  uint64_t check;
  std::memcpy(&check, head.data() + head.size() - 8, 8);
  if (hash64(head.data(), head.size() - 8) != check) {
    *why = "its header's checksum is wrong";
    return false;
  }
  if (h.fingerprint_hi != opt_.fingerprint.hi || h.fingerprint_lo != opt_.fingerprint.lo) {
    *why = "it belongs to another checkpoint or cache format";
    return false;
  }
  t->keys.resize(size_t(t->pages));
  t->checksums.resize(size_t(t->pages));
  t->tokens.resize(size_t(t->pages * ps));
  const uint8_t* e = head.data() + sizeof h;
  for (int64_t i = 0; i < t->pages; ++i) {
    std::memcpy(&t->keys[size_t(i)].hi, e, 8);
    std::memcpy(&t->keys[size_t(i)].lo, e + 8, 8);
    std::memcpy(&t->checksums[size_t(i)], e + 16, 8);
    std::memcpy(&t->tokens[size_t(i * ps)], e + kEntryFixed, size_t(4 * ps));
    e += kEntryFixed + 4 * ps;
  }
  if (int64_t(h.payload_bytes) != payload_bytes_ || t->keys[0] != name) {
    *why = "its key or geometry is wrong";
    return false;
  }
  if (int64_t(st.st_size) != t->payloads_at + t->pages * payload_bytes_) {
    *why = "its size is wrong (truncated?)";
    return false;
  }
  return true;
}

void DiskTier::scan_own_folder() {
  const time_t now = std::time(nullptr);
  for (const std::string& file : list_dir(folder_)) {
    const std::string path = folder_ + "/" + file;
    if (file.rfind(kTmpPrefix, 0) == 0) {
      struct stat st;
      if (::stat(path.c_str(), &st) == 0 && now - st.st_mtime > kStaleTmpSeconds) ::unlink(path.c_str());
      continue;
    }
    const auto name = segment_name(file);
    if (!name) continue;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    Table t;
    const char* why = nullptr;
    const bool ok = read_table(fd, *name, &t, &why);
    ::close(fd);
    if (!ok) {
      reject(*name, why);
      continue;
    }
    std::lock_guard lock(mu_);
    index_segment(*name, std::move(t.keys));
  }
}

int64_t DiskTier::read_into(std::span<const Hash128> keys, std::span<const int32_t> tokens, const PageSink& sink) {
  const size_t ps = size_t(opt_.page_size);
  if (!readable_ || keys.empty() || tokens.size() < keys.size() * ps) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  // A key the index does not hold may still start a segment another server wrote since.
  Hash128 name = keys[0];
  {
    std::lock_guard lock(mu_);
    if (auto it = where_.find(keys[0]); it != where_.end()) name = it->second;
  }
  const int fd = ::open(path_of(name).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    std::lock_guard lock(mu_);
    forget_segment(name);
    return 0;
  }
  Table t;
  const char* why = nullptr;
  if (!read_table(fd, name, &t, &why)) {
    ::close(fd);
    reject(name, why);
    return 0;
  }
  // The file's own table places the pages: another server's segment may have replaced ours.
  const int64_t slot = std::find(t.keys.begin(), t.keys.end(), keys[0]) - t.keys.begin();
  int64_t n = 0;
  while (slot + n < t.pages && n < int64_t(keys.size()) && t.keys[size_t(slot + n)] == keys[size_t(n)] &&
         std::equal(tokens.begin() + n * int64_t(ps), tokens.begin() + (n + 1) * int64_t(ps),
                    t.tokens.begin() + (slot + n) * int64_t(ps)))
    ++n;
  if (n == 0) {  // not this file's page, or a hash collision (another prefix's page, kept)
    ::close(fd);
    std::lock_guard lock(mu_);
    index_segment(name, std::move(t.keys));
    return 0;
  }
  // Each page is one preadv straight into the parts the sink gives (the latent pool's pages on
  // a hit: memory already in use, no copy in between), checked there. The reads are
  // sequential, so the kernel's read-ahead keeps ahead of them.
  const off_t from = off_t(t.payloads_at + slot * payload_bytes_);
  int64_t done = 0;
  const char* bad = nullptr;
  for (; done < n; ++done) {
    const std::vector<std::span<uint8_t>> parts = sink(done, n);
    if (parts.empty()) break;
    if (!preadv_all(fd, parts, from + off_t(done * payload_bytes_), payload_bytes_)) {
      bad = "its payload cannot be read";
      break;
    }
    uint64_t sum = 0;
    for (std::span<uint8_t> part : parts) sum = hash64(part.data(), part.size(), sum);
    if (sum != t.checksums[size_t(slot + done)]) {
      bad = "its payload's checksum is wrong";
      break;
    }
  }
  if (!bad) ::futimens(fd, nullptr);  // least recently used by modification time: a hit is a use
  ::close(fd);
  if (bad) reject(name, bad);
  std::lock_guard lock(mu_);
  if (!bad) index_segment(name, std::move(t.keys));
  stats_.read += done;
  stats_.read_bytes += t.head_bytes + (done + (bad ? 1 : 0)) * payload_bytes_;
  stats_.read_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return done;
}

std::vector<PageBlockPtr> DiskTier::read(std::span<const Hash128> keys, std::span<const int32_t> tokens) {
  const size_t ps = size_t(opt_.page_size);
  std::vector<std::shared_ptr<PageBlock>> blocks;
  const int64_t got = read_into(keys, tokens, [&](int64_t i, int64_t n) {
    if (i == 0) {
      uint8_t* data = nullptr;
      blocks = new_page_blocks(n, payload_bytes_, &data);
    }
    PageBlock& b = *blocks[size_t(i)];
    b.key = keys[size_t(i)];
    b.source = PageSource::Disk;
    b.tokens.assign(tokens.begin() + i * int64_t(ps), tokens.begin() + (i + 1) * int64_t(ps));
    std::vector<std::span<uint8_t>> parts;
    uint8_t* at = const_cast<uint8_t*>(b.bytes.data());
    for (int64_t part : opt_.part_bytes) {
      parts.emplace_back(at, size_t(part));
      at += part;
    }
    return parts;
  });
  return std::vector<PageBlockPtr>(blocks.begin(), blocks.begin() + got);
}

int64_t DiskTier::warm(std::span<const Hash128> keys) {
  if (!readable_) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t pages = 0;
  size_t i = 0;
  while (i < keys.size()) {
    Hash128 name;
    {
      std::lock_guard lock(mu_);
      auto it = where_.find(keys[i]);
      if (it == where_.end()) {
        ++i;
        continue;
      }
      name = it->second;
    }
    const int fd = ::open(path_of(name).c_str(), O_RDONLY | O_CLOEXEC);
    Table t;
    const char* why = nullptr;
    if (fd < 0 || !read_table(fd, name, &t, &why)) {  // the read at admission finds out why
      if (fd >= 0) ::close(fd);
      ++i;
      continue;
    }
    const int64_t slot = std::find(t.keys.begin(), t.keys.end(), keys[i]) - t.keys.begin();
    int64_t n = 0;
    while (slot + n < t.pages && i + size_t(n) < keys.size() && t.keys[size_t(slot + n)] == keys[i + size_t(n)]) ++n;
    if (n == 0) {
      ::close(fd);
      ++i;
      continue;
    }
    // Mapped and populated: the kernel reads the range into its page cache in large requests,
    // and nothing is copied; the mapping goes at once, the cached pages stay.
    const off_t at = off_t(t.payloads_at + slot * payload_bytes_);
    const off_t aligned = at & ~off_t(kBlock - 1);
    const size_t len = size_t(at - aligned + n * payload_bytes_);
    bool populated = false;
#ifdef MADV_POPULATE_READ
    if (void* m = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, aligned); m != MAP_FAILED) {
      populated = ::madvise(m, len, MADV_POPULATE_READ) == 0;
      ::munmap(m, len);
    }
#endif
    if (!populated) ::posix_fadvise(fd, aligned, off_t(len), POSIX_FADV_WILLNEED);
    ::close(fd);
    pages += n;
    i += size_t(n);
  }
  std::lock_guard lock(mu_);
  stats_.warmed += pages;
  stats_.read_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return pages;
}

int64_t DiskTier::write(std::vector<PageWrite> pages) {
  std::vector<std::function<void()>> not_queued;
  int64_t queued = 0;
  {
    std::lock_guard lock(mu_);
    Segment run;
    auto close_run = [&] {
      if (run.pages.empty()) return;
      queue_.push_back(std::move(run));
      run = Segment();
    };
    for (PageWrite& w : pages) {
      int64_t bytes = 0;
      for (auto& p : w.parts) bytes += int64_t(p.size());
      const bool held = where_.count(w.key) || queued_.count(w.key);
      if (held || !writable_ || bytes != payload_bytes_ || int64_t(w.tokens.size()) != opt_.page_size ||
          segment_bytes(1) > opt_.budget_bytes || pending_bytes_ + bytes > opt_.max_pending_bytes) {
        stats_.skipped += !held;
        close_run();
        if (w.done) not_queued.push_back(std::move(w.done));
        continue;
      }
      pending_bytes_ += bytes;
      queued_.insert(w.key);
      run.bytes += bytes;
      run.pages.push_back(std::move(w));
      ++queued;
      if (int64_t(run.pages.size()) == segment_pages_) close_run();
    }
    close_run();
  }
  if (queued) cv_.notify_all();
  for (auto& done : not_queued) done();
  return queued;
}

void DiskTier::flush() {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void DiskTier::writer_loop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stop_, nothing left
    Segment s = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    const bool go = writable_;
    lock.unlock();
    if (opt_.before_write) opt_.before_write();
    const bool ok = go && write_file(s);
    for (PageWrite& w : s.pages) {
      if (w.done) w.done();
      w.keep.reset();
    }
    lock.lock();
    const int64_t n = int64_t(s.pages.size());
    std::vector<Hash128> keys;
    for (const PageWrite& w : s.pages) {
      queued_.erase(w.key);
      keys.push_back(w.key);
    }
    pending_bytes_ -= s.bytes;
    if (ok) {
      const Hash128 name = keys[0];
      index_segment(name, std::move(keys));
      stats_.written += n;
      stats_.written_bytes += segment_bytes(n);
      stats_.bytes += segment_bytes(n);
      ++stats_.files;
    }
    const bool over = stats_.bytes > opt_.budget_bytes;
    busy_ = !queue_.empty() || over;
    if (over) {
      lock.unlock();
      enforce_budget();
      lock.lock();
      busy_ = false;
    }
    if (queue_.empty() && !busy_) idle_cv_.notify_all();
  }
  busy_ = false;
  idle_cv_.notify_all();
}

bool DiskTier::write_file(const Segment& s) {
  const int64_t ps = opt_.page_size, n = int64_t(s.pages.size());
  FileHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.page_size = uint32_t(ps);
  h.pages = uint64_t(n);
  h.payload_bytes = uint64_t(payload_bytes_);
  h.fingerprint_hi = opt_.fingerprint.hi;
  h.fingerprint_lo = opt_.fingerprint.lo;
  std::vector<uint8_t> head(size_t(payload_offset(n, ps)), 0);  // zeros after the checksum
  std::memcpy(head.data(), &h, sizeof h);
  uint8_t* e = head.data() + sizeof h;
  for (const PageWrite& w : s.pages) {
    uint64_t sum = 0;
    for (auto& p : w.parts) sum = hash64(p.data(), p.size(), sum);
    std::memcpy(e, &w.key.hi, 8);
    std::memcpy(e + 8, &w.key.lo, 8);
    std::memcpy(e + 16, &sum, 8);
    std::memcpy(e + kEntryFixed, w.tokens.data(), size_t(4 * ps));
    e += kEntryFixed + 4 * ps;
  }
  const uint64_t check = hash64(head.data(), size_t(e - head.data()));
  std::memcpy(e, &check, 8);
  uint64_t k;
  {
    std::lock_guard lock(mu_);
    k = ++tmp_counter_;
  }
  const Hash128& name = s.pages[0].key;
  // Unique across processes (pid), tiers of one process (nonce_) and writes (k).
  const std::string tmp = folder_ + "/" + kTmpPrefix + name.hex() + "." + std::to_string(::getpid()) + "." +
                          std::to_string(nonce_) + "." + std::to_string(k);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == EEXIST) return false;  // not ours to touch; the pages stay unwritten
    turn_off_writes("cannot create " + tmp + ": " + std::strerror(errno));
    return false;
  }
  bool ok = write_all(fd, head.data(), head.size());
  for (size_t i = 0; ok && i < s.pages.size(); ++i)
    for (size_t j = 0; ok && j < s.pages[i].parts.size(); ++j)
      ok = write_all(fd, s.pages[i].parts[j].data(), s.pages[i].parts[j].size());
  const int err = ok ? 0 : errno;
  if (::close(fd) != 0 && ok) ok = false;
  if (ok && ::rename(tmp.c_str(), path_of(name).c_str()) != 0) ok = false;
  if (!ok) {
    const std::string why = std::strerror(err ? err : errno);
    ::unlink(tmp.c_str());
    turn_off_writes("writing " + tmp + " failed: " + why);
  }
  return ok;
}

void DiskTier::turn_off_writes(const std::string& why) {
  {
    std::lock_guard lock(mu_);
    if (!writable_) return;
    writable_ = false;
  }
  opt_.warn("the prompt cache's disk tier stops writing (" + why + "); requests go on, pages on disk are still read");
}

void DiskTier::enforce_budget() {
  struct File {
    std::string folder, name;
    int64_t mtime_ns;
    int64_t bytes;
  };
  std::vector<File> files;
  int64_t total = 0;
  for (const std::string& sub : list_dir(opt_.dir)) {
    const std::string dir = opt_.dir + "/" + sub;
    for (const std::string& name : list_dir(dir)) {
      const std::string path = dir + "/" + name;
      if (ends_with(name, kOldSuffix)) {  // never read by this version
        ::unlink(path.c_str());
        continue;
      }
      struct stat st;
      if (!ends_with(name, kSuffix) || ::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      files.push_back({dir, name, int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec, int64_t(st.st_size)});
      total += int64_t(st.st_size);
    }
  }
  int64_t evicted = 0;
  if (total > opt_.budget_bytes) {
    std::sort(files.begin(), files.end(), [](const File& a, const File& b) { return a.mtime_ns < b.mtime_ns; });
    const int64_t target = opt_.budget_bytes / 10 * 9;
    for (const File& f : files) {
      if (total <= target) break;
      if (::unlink((f.folder + "/" + f.name).c_str()) != 0 && errno != ENOENT) continue;
      total -= f.bytes;
      ++evicted;
      if (std::filesystem::path(f.folder) == std::filesystem::path(folder_))
        if (auto name = segment_name(f.name)) {
          std::lock_guard lock(mu_);
          forget_segment(*name);
        }
    }
  }
  std::lock_guard lock(mu_);
  stats_.bytes = total;
  stats_.files = int64_t(files.size()) - evicted;
  stats_.evicted += evicted;
}

DiskTier::Stats DiskTier::stats() const {
  std::lock_guard lock(mu_);
  Stats s = stats_;
  s.pages = int64_t(where_.size());
  return s;
}

}  // namespace mla
