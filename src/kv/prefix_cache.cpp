// PrefixCache: the prompt cache's three tiers over the latent pool (see prefix_cache.h).
#include "kv/prefix_cache.h"

#include <algorithm>
#include <stdexcept>

namespace mla {

PrefixCache::PrefixCache(LatentPool& pool, PrefixCacheOptions opt) : pool_(pool), opt_(std::move(opt)) {
  if (opt_.ram_bytes < 0 || opt_.disk_bytes < 0) throw std::invalid_argument("prompt cache: budgets must not be negative");
  for (auto part : pool_.page_parts(0)) part_bytes_.push_back(int64_t(part.size()));
  if (opt_.ram_bytes > 0) ram_ = std::make_unique<HostTier>(opt_.ram_bytes);
  if (!opt_.disk_dir.empty() && opt_.disk_bytes > 0) {
    if (opt_.fingerprint.empty())
      throw std::invalid_argument("prompt cache: the disk tier needs the checkpoint's fingerprint");
    // The pages' own format joins the checkpoint's fingerprint: a pool of another dtype, page
    // size or geometry gets another folder.
    Digest d;
    d.add("mla prompt cache pages v1").add_value(opt_.fingerprint.hi).add_value(opt_.fingerprint.lo);
    d.add(kv_dtype_name(pool_.dtype())).add_value(pool_.page_size()).add_value(pool_.num_layers());
    d.add_value(pool_.row_dim()).add_value(pool_.index_dim()).add_value(pool_.bytes_per_page());
    DiskTierOptions o;
    o.dir = opt_.disk_dir;
    o.budget_bytes = opt_.disk_bytes;
    o.fingerprint = d.finish();
    o.page_size = pool_.page_size();
    o.part_bytes = part_bytes_;
    o.max_pending_bytes = opt_.disk_max_pending_bytes;
    o.segment_pages = opt_.disk_segment_pages;
    o.before_write = opt_.disk_before_write;
    o.warn = opt_.warn;
    disk_ = std::make_unique<DiskTier>(std::move(o));
    if (!disk_->readable()) disk_.reset();
  }
}

PrefixCache::~PrefixCache() {
  disk_.reset();  // finishes the writes, whose pins poll then releases
  poll();
  clear();
}

void PrefixCache::poll() {
  std::vector<int32_t> done;
  {
    std::lock_guard lock(written_mu_);
    done.swap(written_);
  }
  for (int32_t page : done) {
    if (--pins_[page] == 0) pins_.erase(page);
    pool_.drop(page);
  }
}

void PrefixCache::flush() {
  if (disk_) disk_->flush();
  poll();
}

void PrefixCache::wait_for_a_write() {
  {
    std::unique_lock lock(written_mu_);
    written_cv_.wait(lock, [&] { return !written_.empty(); });
  }
  poll();
}

void PrefixCache::wait_for_writes() {
  if (disk_) disk_->flush();
}

void PrefixCache::clear() {
  for (auto& [key, r] : resident_) pool_.drop(r.page);
  resident_.clear();
  lru_.clear();
  {
    std::lock_guard lock(keys_mu_);
    resident_keys_.clear();
  }
  if (ram_) ram_->clear();
}

bool PrefixCache::resident_key(const Hash128& key) const {
  std::lock_guard lock(keys_mu_);
  return resident_keys_.count(key) > 0;
}

void PrefixCache::add_resident(const Hash128& key, int32_t page, std::span<const int32_t> tokens) {
  pool_.retain(page);
  Resident& r = resident_[key];
  r.page = page;
  r.tokens.assign(tokens.begin(), tokens.end());
  std::lock_guard lock(keys_mu_);
  resident_keys_.insert(key);
}

void PrefixCache::remove_resident(const Hash128& key) {
  auto it = resident_.find(key);
  lru_.erase(it->second.stamp);
  pool_.drop(it->second.page);
  resident_.erase(it);
  std::lock_guard lock(keys_mu_);
  resident_keys_.erase(key);
}

void PrefixCache::touch(std::span<const Hash128> chain) {
  // The chain's last page gets the oldest stamp, its first the newest: parents outlive children.
  for (size_t i = chain.size(); i-- > 0;) {
    Resident& r = resident_.at(chain[i]);
    if (r.stamp) lru_.erase(r.stamp);
    r.stamp = ++clock_;
    lru_[r.stamp] = chain[i];
  }
}

std::vector<std::span<const uint8_t>> PrefixCache::split(std::span<const uint8_t> bytes) const {
  std::vector<std::span<const uint8_t>> parts;
  size_t at = 0;
  for (int64_t b : part_bytes_) {
    parts.emplace_back(bytes.data() + at, size_t(b));
    at += size_t(b);
  }
  return parts;
}

PageWrite PrefixCache::pinned_write(const Hash128& key, int32_t page, std::span<const int32_t> tokens) {
  pool_.retain(page);  // the pool page stays as it is until its write is done (poll)
  ++pins_[page];
  PageWrite w;
  w.key = key;
  w.tokens.assign(tokens.begin(), tokens.end());
  w.parts = pool_.page_parts(page);
  w.done = [this, page] {
    {
      std::lock_guard lock(written_mu_);
      written_.push_back(page);
    }
    written_cv_.notify_all();
  };
  return w;
}

void PrefixCache::write_through(std::vector<PageWrite>& run) {
  if (!run.empty()) disk_->write(std::move(run));
  run.clear();
}

void PrefixCache::persist(const PageBlockPtr& block) {
  if (!disk_ || disk_->contains(block->key)) return;
  std::vector<PageWrite> one(1);
  one[0].key = block->key;
  one[0].tokens = block->tokens;
  one[0].parts = split(block->bytes);
  one[0].keep = block;
  disk_->write(std::move(one));
}

void PrefixCache::insert(std::span<const int32_t> tokens, const PageTable& table) {
  poll();
  const int64_t ps = pool_.page_size();
  const int64_t pages = std::min<int64_t>(table.length, int64_t(tokens.size())) / ps;
  if (pages == 0) return;
  const std::vector<Hash128> keys = page_keys(tokens, ps, pages);
  std::vector<PageWrite> run;  // consecutive new pages, written through as one run
  for (int64_t i = 0; i < pages; ++i) {
    const Hash128& key = keys[size_t(i)];
    const auto slice = tokens.subspan(size_t(i * ps), size_t(ps));
    const int32_t page = table.pages[size_t(i)];
    const bool fresh = !resident_.count(key);
    if (fresh) {
      add_resident(key, page, slice);
      if (ram_) ram_->take(key, slice);  // the tiers hold a page once
    }
    if (fresh && disk_ && !disk_->contains(key)) run.push_back(pinned_write(key, page, slice));
    else write_through(run);
  }
  write_through(run);
  touch(keys);
}

int64_t PrefixCache::match(std::span<const int32_t> tokens, int64_t max_len, PageTable* out, int64_t keep_free) {
  poll();
  const int64_t ps = pool_.page_size();
  max_len = std::min<int64_t>(max_len, int64_t(tokens.size()));
  const std::vector<Hash128> keys = page_keys(tokens, ps, std::max<int64_t>(max_len, 0) / ps);
  std::vector<PageWrite> run;  // promoted pages that the disk lacks, written through
  // A free pool page for chain page i, reserved in *out: -1 when none is left beyond keep_free.
  auto take_page = [&](int64_t i) -> int32_t {
    while (pool_.free_pages() <= keep_free && evict_one()) {
    }
    if (pool_.free_pages() <= keep_free) return -1;
    pool_.reserve(*out, (i + 1) * ps);
    return out->pages.back();
  };
  // Chain page i, copied into its pool page from RAM or disk, joins the pool tier (promotion).
  auto promote = [&](int64_t i, CacheTier tier) {
    const int32_t page = out->pages[size_t(i)];
    const auto slice = tokens.subspan(size_t(i * ps), size_t(ps));
    add_resident(keys[size_t(i)], page, slice);
    if (disk_ && !disk_->contains(keys[size_t(i)]))  // from RAM, or from a segment found bad since
      run.push_back(pinned_write(keys[size_t(i)], page, slice));
    else
      write_through(run);
    counters_.hit_tokens[int(tier)] += ps;
    counters_.hit_bytes[int(tier)] += pool_.bytes_per_page();
  };
  int64_t got = 0;
  while (got < int64_t(keys.size())) {
    const Hash128& key = keys[size_t(got)];
    const auto slice = tokens.subspan(size_t(got * ps), size_t(ps));
    if (auto it = resident_.find(key); it != resident_.end()) {
      if (!std::equal(slice.begin(), slice.end(), it->second.tokens.begin())) break;  // a collision
      pool_.retain(it->second.page);
      out->pages.push_back(it->second.page);
      counters_.hit_tokens[0] += ps;
      counters_.hit_bytes[0] += pool_.bytes_per_page();
      write_through(run);
      ++got;
      continue;
    }
    if (PageBlockPtr block = ram_ ? ram_->take(key, slice) : nullptr) {
      const int32_t page = take_page(got);
      if (page < 0) {
        ram_->put(block);  // no room: the page stays where it was
        break;
      }
      pool_.copy_page_in(page, block->bytes.data());
      if (opt_.on_page_in) opt_.on_page_in(page, block->bytes);
      promote(got++, CacheTier::Ram);
      continue;
    }
    if (!disk_) break;
    // The pages that the segment holding this one holds next, read straight into pool pages
    // (no copy in between), up to a page a higher tier holds or the pool's room.
    const int64_t first = got;
    const int64_t n = disk_->read_into(std::span(keys).subspan(size_t(first)), tokens.subspan(size_t(first * ps)),
                                       [&](int64_t i, int64_t) -> std::vector<std::span<uint8_t>> {
                                         const Hash128& k = keys[size_t(first + i)];
                                         if (i > 0 && (resident_.count(k) || (ram_ && ram_->contains(k)))) return {};
                                         const int32_t page = take_page(first + i);
                                         if (page < 0) return {};
                                         return pool_.page_parts_to_fill(page);
                                       });
    if (int64_t(out->pages.size()) > first + n) {  // a page that failed its check
      pool_.drop(out->pages.back());
      out->pages.pop_back();
    }
    std::vector<uint8_t> bytes(opt_.on_page_in ? size_t(pool_.bytes_per_page()) : 0);
    for (int64_t i = first; i < first + n; ++i) {
      if (opt_.on_page_in) {
        pool_.copy_page_out(out->pages[size_t(i)], bytes.data());
        opt_.on_page_in(out->pages[size_t(i)], bytes);
      }
      promote(i, CacheTier::Disk);
    }
    got = first + n;
    if (n == 0) break;
  }
  write_through(run);
  if (got == 0) return 0;
  out->length = got * ps;
  touch(std::span(keys).first(size_t(got)));
  return got * ps;
}

void PrefixCache::prefetch(std::span<const int32_t> tokens) {
  if (!disk_) return;
  const int64_t ps = pool_.page_size();
  std::vector<Hash128> keys = page_keys(tokens, ps, int64_t(tokens.size()) / ps);
  std::erase_if(keys, [&](const Hash128& k) { return resident_key(k) || (ram_ && ram_->contains(k)); });
  disk_->warm(keys);
}

bool PrefixCache::evict_one() {
  poll();
  while (true) {
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
      const Hash128 key = it->second;
      const Resident& r = resident_.at(key);
      if (pool_.refcount(r.page) != 1) continue;  // a sequence (or a disk write) holds it
      if (ram_) {
        uint8_t* bytes = nullptr;
        std::shared_ptr<PageBlock> block = new_page_blocks(1, pool_.bytes_per_page(), &bytes)[0];
        block->key = key;
        block->tokens = r.tokens;
        pool_.copy_page_out(r.page, bytes);
        for (const PageBlockPtr& dropped : ram_->put(std::move(block))) persist(dropped);
      }
      remove_resident(key);
      return true;
    }
    // Every page no sequence holds waits for its disk write: wait for the next write to finish
    // (each write calls its page's done, written or not), not for the queue behind it, which
    // may hold up to disk_max_pending_bytes. The first segments of a run hold a chain's first
    // pages, so such a page can go before the chain's later ones; a match then reads it back
    // from disk and takes the rest from the pool.
    if (pins_.empty()) return false;
    wait_for_a_write();
  }
}

int64_t PrefixCache::pages_held_alone() const {
  int64_t n = 0;
  for (auto& [key, r] : resident_) {
    auto pin = pins_.find(r.page);
    n += pool_.refcount(r.page) == 1 + (pin == pins_.end() ? 0 : pin->second);
  }
  return n;
}

PrefixCacheStats PrefixCache::stats() const {
  PrefixCacheStats s = counters_;
  s.pool_pages = int64_t(resident_.size());
  if (ram_) {
    s.ram_pages = ram_->blocks();
    s.ram_bytes = ram_->bytes();
    s.ram_budget = ram_->budget();
  }
  if (disk_) {
    const DiskTier::Stats d = disk_->stats();
    s.disk_on = true;
    s.disk_writable = disk_->writable();
    s.disk_files = d.files;
    s.disk_pages = d.pages;
    s.disk_bytes = d.bytes;
    s.disk_budget = opt_.disk_bytes;
    s.disk_written = d.written;
    s.disk_rejected = d.rejected;
    s.disk_skipped = d.skipped;
    s.disk_evicted = d.evicted;
    s.disk_read_bytes = d.read_bytes;
    s.disk_read_seconds = d.read_seconds;
  }
  return s;
}

}  // namespace mla
