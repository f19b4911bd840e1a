// Anonymous memory on transparent huge pages (see huge_memory.h).
#include "kv/huge_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace mla {

namespace {
constexpr size_t kHugePage = size_t(2) << 20;
}

std::shared_ptr<void> huge_mapping(size_t bytes, bool populate) {
  const size_t len = (std::max<size_t>(bytes, 1) + kHugePage - 1) / kHugePage * kHugePage;
  void* m = ::mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  uint8_t* const start = static_cast<uint8_t*>(m);
  uint8_t* const at = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(m) + kHugePage - 1) & ~(kHugePage - 1));
  if (at > start) ::munmap(start, size_t(at - start));
  if (start + len + kHugePage > at + len) ::munmap(at + len, size_t(start + len + kHugePage - (at + len)));
  ::madvise(at, len, MADV_HUGEPAGE);
  if (populate) {
    bool done = false;
#ifdef MADV_POPULATE_WRITE
    done = ::madvise(at, len, MADV_POPULATE_WRITE) == 0;
#endif
    if (!done) std::memset(at, 0, len);
  }
  return std::shared_ptr<void>(at, [len](void* p) { ::munmap(p, len); });
}

}  // namespace mla
