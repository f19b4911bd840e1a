// HostTier: pages in host RAM, least recently used dropped past the budget (see host_tier.h).
#include "kv/host_tier.h"

#include "kv/huge_memory.h"

namespace mla {

namespace {
constexpr size_t kHugePage = size_t(2) << 20;
}  // namespace

std::vector<std::shared_ptr<PageBlock>> new_page_blocks(int64_t count, int64_t page_bytes, uint8_t** data) {
  const size_t n = size_t(count * page_bytes);
  const size_t rounded = (n + kHugePage - 1) / kHugePage * kHugePage;
  std::shared_ptr<void> memory;
  if (n >= kHugePage && rounded - n <= n / 8) memory = huge_mapping(n, true);
  if (!memory) memory = std::shared_ptr<void>(new uint8_t[n], std::default_delete<uint8_t[]>());
  *data = static_cast<uint8_t*>(memory.get());
  std::vector<std::shared_ptr<PageBlock>> blocks(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    blocks[size_t(i)] = std::make_shared<PageBlock>();
    blocks[size_t(i)]->bytes = {*data + i * page_bytes, size_t(page_bytes)};
    blocks[size_t(i)]->memory = memory;
  }
  return blocks;
}

std::vector<PageBlockPtr> HostTier::put(PageBlockPtr block) {
  std::vector<PageBlockPtr> dropped;
  if (block->size() > budget_) {
    dropped.push_back(std::move(block));
    return dropped;
  }
  std::lock_guard lock(mu_);
  if (auto it = index_.find(block->key); it != index_.end()) {
    bytes_ -= (*it->second)->size();
    lru_.erase(it->second);
    index_.erase(it);
  }
  bytes_ += block->size();
  lru_.push_front(block);
  index_[block->key] = lru_.begin();
  while (bytes_ > budget_) {
    PageBlockPtr oldest = lru_.back();
    lru_.pop_back();
    index_.erase(oldest->key);
    bytes_ -= oldest->size();
    dropped.push_back(std::move(oldest));
  }
  return dropped;
}

PageBlockPtr HostTier::take(const Hash128& key, std::span<const int32_t> tokens) {
  std::lock_guard lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end() || !(*it->second)->holds(tokens)) return nullptr;
  PageBlockPtr block = *it->second;
  bytes_ -= block->size();
  lru_.erase(it->second);
  index_.erase(it);
  return block;
}

bool HostTier::contains(const Hash128& key) const {
  std::lock_guard lock(mu_);
  return index_.count(key) > 0;
}

void HostTier::clear() {
  std::lock_guard lock(mu_);
  lru_.clear();
  index_.clear();
  bytes_ = 0;
}

int64_t HostTier::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

int64_t HostTier::blocks() const {
  std::lock_guard lock(mu_);
  return int64_t(lru_.size());
}

}  // namespace mla
