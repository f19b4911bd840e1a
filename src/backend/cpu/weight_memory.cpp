// Weights copied onto transparent huge pages (see weight_memory.h).
#include "backend/cpu/weight_memory.h"

#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace mla::cpu {

namespace {

constexpr size_t kHuge = size_t(2) << 20;
constexpr size_t kPage = 4096;
#ifdef MADV_COLLAPSE
constexpr int kMadvCollapse = MADV_COLLAPSE;
#else
constexpr int kMadvCollapse = 25;
#endif
// Ranges closer than this share one region (the padding between tensors of a file; never a
// hole between mappings, which is at least a page).
constexpr size_t kMergeGap = 64;

// Bytes from v.scales that v reads (a row slice reads its rows' scales, found through row0).
size_t scale_extent(const MatrixView& v) {
  switch (v.format) {
    case WeightFormat::FP8_BLOCK128: return size_t((v.row0 + v.rows + 127) / 128) * size_t(v.scale_cols) * 4;
    case WeightFormat::INT4_GROUP: case WeightFormat::INT8_GROUP: return size_t(v.row0 + v.rows) * size_t(v.scale_cols) * 2;
    default: return 0;
  }
}

size_t mem_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  size_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

}  // namespace

bool should_copy_weights(WeightPlacement placement, size_t weight_bytes) {
  switch (placement) {
    case WeightPlacement::HugePages: return true;
    case WeightPlacement::Mapped: return false;
    case WeightPlacement::Auto: return weight_bytes < mem_available() / 2;
  }
  return false;
}

WeightArena::~WeightArena() {
  for (auto& [p, n] : maps_) munmap(p, n);
}

void WeightArena::adopt(const Context& ctx, std::span<MatrixView* const> views) {
  struct Range {
    uintptr_t begin, end;
  };
  std::vector<Range> ranges;
  for (const MatrixView* v : views) {
    if (!v->data || v->rows <= 0) continue;
    const uintptr_t d = reinterpret_cast<uintptr_t>(v->data);
    ranges.push_back({d, d + v->bytes()});
    if (v->scales) {
      // A slice's scale pointer is the whole tensor's; it reads from there on.
      const uintptr_t s = reinterpret_cast<uintptr_t>(v->scales);
      ranges.push_back({s, s + scale_extent(*v)});
    }
  }
  if (ranges.empty()) return;
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  std::vector<Range> merged{ranges[0]};
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin <= merged.back().end + kMergeGap) merged.back().end = std::max(merged.back().end, ranges[i].end);
    else merged.push_back(ranges[i]);
  }
  // One mapping per region, on a 2 MiB boundary, between inaccessible guard pages: the kernel
  // would otherwise merge neighbouring mappings into one area, and /proc/self/smaps (where
  // huge_bytes() reads the huge pages) could not tell ours apart. The copy keeps each byte's
  // offset modulo 64 (cache-line alignment).
  std::vector<uintptr_t> bases;
  for (const Range& r : merged) {
    const size_t n = r.end - r.begin, len = (n + 64 + kHuge - 1) / kHuge * kHuge, span = len + 2 * kHuge;
    void* res = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (res == MAP_FAILED)
      throw std::runtime_error("WeightArena: cannot map " + std::to_string(len) + " bytes for the weights: " +
                               std::strerror(errno));
    maps_.push_back({res, span});
    void* p = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(res) + kPage + kHuge - 1) / kHuge * kHuge);
    if (mprotect(p, len, PROT_READ | PROT_WRITE) != 0)
      throw std::runtime_error(std::string("WeightArena: cannot make the weight mapping writable: ") + std::strerror(errno));
    regions_.push_back({p, len});
    madvise(p, len, MADV_HUGEPAGE);  // best effort: the system may not allow it
    uint8_t* dst = static_cast<uint8_t*>(p) + (r.begin % 64);
    const uint8_t* src = reinterpret_cast<const uint8_t*>(r.begin);
    const int64_t chunks = int64_t((n + kHuge - 1) / kHuge);
#pragma omp parallel for schedule(dynamic, 4) num_threads(ctx.num_threads())
    for (int64_t c = 0; c < chunks; ++c) {
      const size_t o = size_t(c) * kHuge;
      std::memcpy(dst + o, src + o, std::min(kHuge, n - o));
    }
    // Where the huge pages were not there at fault time (fragmented memory), ask for them now:
    // MADV_COLLAPSE (Linux 6.1) compacts synchronously. Best effort, like MADV_HUGEPAGE.
    madvise(p, len, kMadvCollapse);
    bases.push_back(reinterpret_cast<uintptr_t>(dst));
    bytes_ += n;
  }
  auto move = [&](const void* p) -> const void* {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto it = std::upper_bound(merged.begin(), merged.end(), a, [](uintptr_t x, const Range& r) { return x < r.begin; });
    const size_t i = size_t(it - merged.begin()) - 1;
    return reinterpret_cast<const void*>(bases[i] + (a - merged[i].begin));
  };
  for (MatrixView* v : views) {
    if (!v->data || v->rows <= 0) continue;
    v->data = move(v->data);
    if (v->scales) v->scales = move(v->scales);
  }
}

size_t WeightArena::huge_bytes() const {
  std::ifstream f("/proc/self/smaps");
  std::string line;
  size_t total = 0;
  bool ours = false;
  while (std::getline(f, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream ls(line);
    if (std::isxdigit(static_cast<unsigned char>(line[0])) && (ls >> std::hex >> lo >> dash >> hi) && dash == '-') {
      ours = std::any_of(regions_.begin(), regions_.end(), [&](const auto& m) {
        const uintptr_t b = reinterpret_cast<uintptr_t>(m.first);
        return lo >= b && hi <= b + m.second;
      });
      continue;
    }
    if (ours && line.rfind("AnonHugePages:", 0) == 0) total += size_t(std::stoull(line.substr(14))) * 1024;
  }
  return std::min(total, bytes_);  // the last huge page of a region also holds its padding
}

}  // namespace mla::cpu
