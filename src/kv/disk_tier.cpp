// DiskTier: pages in files, checked on every read, written atomically in the background
// (see disk_tier.h).
#include "kv/disk_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>

namespace mla {

namespace {

constexpr char kMagic[8] = {'M', 'L', 'A', 'P', 'A', 'G', 'E', '1'};
constexpr uint32_t kVersion = 1;
constexpr const char* kSuffix = ".page";
constexpr const char* kTmpPrefix = ".tmp.";
constexpr time_t kStaleTmpSeconds = 600;

struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t page_size;
  uint64_t payload_bytes;
  uint64_t fingerprint_hi, fingerprint_lo;
  uint64_t key_hi, key_lo;
  uint64_t payload_checksum;
};
static_assert(sizeof(FileHeader) == 64);

// The header, the tokens and the header's checksum: everything before the payload.
std::vector<uint8_t> head_bytes(const FileHeader& h, std::span<const int32_t> tokens) {
  std::vector<uint8_t> out(sizeof h + tokens.size_bytes() + 8);
  std::memcpy(out.data(), &h, sizeof h);
  std::memcpy(out.data() + sizeof h, tokens.data(), tokens.size_bytes());
  const uint64_t check = hash64(out.data(), out.size() - 8);
  std::memcpy(out.data() + out.size() - 8, &check, 8);
  return out;
}

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

bool read_all(int fd, uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= size_t(r);
  }
  return true;
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
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

DiskTier::DiskTier(DiskTierOptions opt) : opt_(std::move(opt)) {
  nonce_ = std::random_device{}();
  if (!opt_.warn) opt_.warn = [](const std::string& m) { std::fprintf(stderr, "mla: %s\n", m.c_str()); };
  for (int64_t b : opt_.part_bytes) payload_bytes_ += b;
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

int64_t DiskTier::file_bytes() const {
  return int64_t(sizeof(FileHeader)) + opt_.page_size * int64_t(sizeof(int32_t)) + 8 + payload_bytes_;
}

std::string DiskTier::path_of(const Hash128& key) const { return folder_ + "/" + key.hex() + kSuffix; }

bool DiskTier::contains(const Hash128& key) const {
  std::lock_guard lock(mu_);
  return known_.count(key) > 0;
}

void DiskTier::scan_own_folder() {
  const time_t now = std::time(nullptr);
  for (const std::string& name : list_dir(folder_)) {
    const std::string path = folder_ + "/" + name;
    if (name.rfind(kTmpPrefix, 0) == 0) {
      struct stat st;
      if (::stat(path.c_str(), &st) == 0 && now - st.st_mtime > kStaleTmpSeconds) ::unlink(path.c_str());
      continue;
    }
    if (!ends_with(name, kSuffix)) continue;
    if (auto key = Hash128::from_hex(std::string_view(name).substr(0, name.size() - std::strlen(kSuffix))))
      known_.insert(*key);
  }
}

PageBlockPtr DiskTier::read(const Hash128& key, std::span<const int32_t> tokens) {
  if (!readable_ || int64_t(tokens.size()) != opt_.page_size) return nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string path = path_of(key);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    std::lock_guard lock(mu_);
    known_.erase(key);
    return nullptr;
  }
  auto reject = [&](const char* why) -> PageBlockPtr {
    ::close(fd);
    ::unlink(path.c_str());
    opt_.warn("the prompt cache dropped " + path + ": " + why);
    std::lock_guard lock(mu_);
    known_.erase(key);
    ++stats_.rejected;
    return nullptr;
  };
  struct stat st;
  if (::fstat(fd, &st) != 0 || int64_t(st.st_size) != file_bytes()) return reject("its size is wrong (truncated?)");
  FileHeader h;
  std::vector<uint8_t> head(sizeof h + tokens.size_bytes() + 8);
  if (!read_all(fd, head.data(), head.size())) return reject("it cannot be read");
  std::memcpy(&h, head.data(), sizeof h);
  uint64_t check;
  std::memcpy(&check, head.data() + head.size() - 8, 8);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.version != kVersion) return reject("not a page file of this version");
  if (hash64(head.data(), head.size() - 8) != check) return reject("its header's checksum is wrong");
  if (h.fingerprint_hi != opt_.fingerprint.hi || h.fingerprint_lo != opt_.fingerprint.lo)
    return reject("it belongs to another checkpoint or cache format");
  if (h.key_hi != key.hi || h.key_lo != key.lo || h.page_size != uint64_t(opt_.page_size) ||
      int64_t(h.payload_bytes) != payload_bytes_)
    return reject("its key or geometry is wrong");
  auto block = std::make_shared<PageBlock>();
  block->key = key;
  block->source = PageSource::Disk;
  block->tokens.resize(tokens.size());
  std::memcpy(block->tokens.data(), head.data() + sizeof h, tokens.size_bytes());
  if (!block->holds(tokens)) {  // a hash collision: another prefix's page, kept
    ::close(fd);
    return nullptr;
  }
  block->bytes.resize(size_t(payload_bytes_));
  if (!read_all(fd, block->bytes.data(), block->bytes.size())) return reject("its payload cannot be read");
  uint64_t sum = 0;
  size_t at = 0;
  for (int64_t part : opt_.part_bytes) {
    sum = hash64(block->bytes.data() + at, size_t(part), sum);
    at += size_t(part);
  }
  if (sum != h.payload_checksum) return reject("its payload's checksum is wrong");
  ::futimens(fd, nullptr);  // least recently used by modification time: a hit is a use
  ::close(fd);
  std::lock_guard lock(mu_);
  known_.insert(key);
  ++stats_.read;
  stats_.read_bytes += file_bytes();
  stats_.read_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return block;
}

void DiskTier::will_need(std::span<const Hash128> keys) const {
  if (!readable_) return;
  for (const Hash128& key : keys) {
    const int fd = ::open(path_of(key).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) break;  // the chain ends here
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
    ::close(fd);
  }
}

bool DiskTier::write(PageWrite w) {
  std::lock_guard lock(mu_);
  if (!writable_ || known_.count(w.key) || queued_.count(w.key)) return false;
  int64_t bytes = 0;
  for (auto& p : w.parts) bytes += int64_t(p.size());
  if (bytes != payload_bytes_ || int64_t(w.tokens.size()) != opt_.page_size || file_bytes() > opt_.budget_bytes ||
      pending_bytes_ + bytes > opt_.max_pending_bytes) {
    ++stats_.skipped;
    return false;
  }
  pending_bytes_ += bytes;
  queued_.insert(w.key);
  queue_.push_back(std::move(w));
  cv_.notify_all();
  return true;
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
    PageWrite w = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    const bool go = writable_;
    lock.unlock();
    bool ok = true;
    if (go) ok = write_file(w);
    if (w.done) w.done();
    w.keep.reset();
    lock.lock();
    queued_.erase(w.key);
    pending_bytes_ -= payload_bytes_;
    if (go && ok) {
      known_.insert(w.key);
      ++stats_.written;
      stats_.written_bytes += file_bytes();
      stats_.bytes += file_bytes();
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

bool DiskTier::write_file(const PageWrite& w) {
  uint64_t sum = 0;
  for (auto& p : w.parts) sum = hash64(p.data(), p.size(), sum);
  FileHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.page_size = uint32_t(opt_.page_size);
  h.payload_bytes = uint64_t(payload_bytes_);
  h.fingerprint_hi = opt_.fingerprint.hi;
  h.fingerprint_lo = opt_.fingerprint.lo;
  h.key_hi = w.key.hi;
  h.key_lo = w.key.lo;
  h.payload_checksum = sum;
  const std::vector<uint8_t> head = head_bytes(h, w.tokens);
  uint64_t n;
  {
    std::lock_guard lock(mu_);
    n = ++tmp_counter_;
  }
  // Unique across processes (pid), tiers of one process (nonce_) and writes (n).
  const std::string tmp = folder_ + "/" + kTmpPrefix + w.key.hex() + "." + std::to_string(::getpid()) + "." +
                          std::to_string(nonce_) + "." + std::to_string(n);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == EEXIST) return false;  // not ours to touch; the page stays unwritten
    turn_off_writes("cannot create " + tmp + ": " + std::strerror(errno));
    return false;
  }
  bool ok = write_all(fd, head.data(), head.size());
  for (size_t i = 0; ok && i < w.parts.size(); ++i) ok = write_all(fd, w.parts[i].data(), w.parts[i].size());
  const int err = ok ? 0 : errno;
  if (::close(fd) != 0 && ok) ok = false;
  if (ok && ::rename(tmp.c_str(), path_of(w.key).c_str()) != 0) ok = false;
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
    std::string path;
    int64_t mtime_ns;
    int64_t bytes;
  };
  std::vector<File> files;
  int64_t total = 0;
  for (const std::string& sub : list_dir(opt_.dir)) {
    const std::string dir = opt_.dir + "/" + sub;
    for (const std::string& name : list_dir(dir)) {
      if (!ends_with(name, kSuffix)) continue;
      struct stat st;
      const std::string path = dir + "/" + name;
      if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      files.push_back({path, int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec, int64_t(st.st_size)});
      total += int64_t(st.st_size);
    }
  }
  int64_t evicted = 0;
  if (total > opt_.budget_bytes) {
    std::sort(files.begin(), files.end(), [](const File& a, const File& b) { return a.mtime_ns < b.mtime_ns; });
    const int64_t target = opt_.budget_bytes / 10 * 9;
    for (const File& f : files) {
      if (total <= target) break;
      if (::unlink(f.path.c_str()) != 0 && errno != ENOENT) continue;
      total -= f.bytes;
      ++evicted;
      const std::string name = std::filesystem::path(f.path).filename().string();
      if (std::filesystem::path(f.path).parent_path() == std::filesystem::path(folder_))
        if (auto key = Hash128::from_hex(std::string_view(name).substr(0, name.size() - std::strlen(kSuffix)))) {
          std::lock_guard lock(mu_);
          known_.erase(*key);
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
  return stats_;
}

}  // namespace mla
