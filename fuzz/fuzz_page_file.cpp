// A prompt cache segment file from the fuzzer's bytes (kv/disk_tier.h): DiskTier::read gives
// the first pages of the chain asked for, each checked, or nothing (and deletes the file);
// never a crash, never a page whose key, tokens or size differ from what was asked.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/disk_tier.h"

namespace {

constexpr int64_t kPage = 4;

mla::DiskTier& tier() {
  static std::unique_ptr<mla::DiskTier> t = [] {
    mla::DiskTierOptions o;
    o.dir = "/tmp/mla-fuzz-page-" + std::to_string(::getpid());
    o.budget_bytes = 1 << 20;
    o.fingerprint = mla::Digest().add("fuzz").finish();
    o.page_size = kPage;
    o.part_bytes = {96, 96, 64};
    o.warn = [](const std::string&) {};
    return std::make_unique<mla::DiskTier>(o);
  }();
  return *t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mla::DiskTier& disk = tier();
  const int32_t tokens[2 * kPage] = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<mla::Hash128> keys = mla::page_keys(tokens, kPage, 2);
  {
    std::ofstream f(disk.path_of(keys[0]), std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  const std::vector<mla::PageBlockPtr> pages = disk.read(keys, tokens);
  if (pages.size() > keys.size()) __builtin_trap();
  for (size_t i = 0; i < pages.size(); ++i)
    if (pages[i]->key != keys[i] || !pages[i]->holds(std::span(tokens).subspan(i * kPage, kPage)) ||
        int64_t(pages[i]->bytes.size()) != disk.page_bytes())
      __builtin_trap();
  return 0;
}
