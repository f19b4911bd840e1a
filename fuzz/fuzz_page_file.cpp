// A prompt cache page file from the fuzzer's bytes (kv/disk_tier.h): DiskTier::read gives the
// page, checked, or nothing (and deletes the file); never a crash, never a page whose tokens
// or size differ from what was asked.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

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
  const int32_t tokens[kPage] = {1, 2, 3, 4};
  const mla::Hash128 key = mla::page_key({}, tokens);
  {
    std::ofstream f(disk.folder() + "/" + key.hex() + ".page", std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  if (mla::PageBlockPtr b = disk.read(key, tokens)) {
    if (!b->holds(tokens) || int64_t(b->bytes.size()) != disk.page_bytes()) __builtin_trap();
  }
  return 0;
}
