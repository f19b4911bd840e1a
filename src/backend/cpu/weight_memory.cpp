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
  // The bytes the views read (overlapping ranges joined), and the regions that hold them: ranges
  // closer than kMergeGap share one. Only the first are copied: the gap between two heap buffers
  // of weights quantized at load is the allocator's, not ours to read.
  auto join = [&](size_t gap) {
    std::vector<Range> out{ranges[0]};
    for (size_t i = 1; i < ranges.size(); ++i) {
      if (ranges[i].begin <= out.back().end + gap) out.back().end = std::max(out.back().end, ranges[i].end);
      else out.push_back(ranges[i]);
    }
    return out;
  };
  const std::vector<Range> used = join(0), merged = join(kMergeGap);
  // One mapping per region, on a 2 MiB boundary, between inaccessible guard pages: the kernel
  // would otherwise merge neighbouring mappings into one area, and /proc/self/smaps (where
  // huge_bytes() reads the huge pages) could not tell ours apart. The copy keeps each byte's
  // offset modulo 64 (cache-line alignment).
  std::vector<uintptr_t> bases;
  const size_t first_region = regions_.size();
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
    bases.push_back(reinterpret_cast<uintptr_t>(p) + r.begin % 64);
    bytes_ += n;
  }
  auto region_of = [&](uintptr_t a) {
    auto it = std::upper_bound(merged.begin(), merged.end(), a, [](uintptr_t x, const Range& r) { return x < r.begin; });
    return size_t(it - merged.begin()) - 1;
  };
  struct Piece {
    const uint8_t* src;
    uint8_t* dst;
    size_t n;
  };
  std::vector<Piece> pieces;  // the used bytes in pieces of at most a huge page, copied in parallel
  for (const Range& u : used) {
    const size_t i = region_of(u.begin);
    uint8_t* dst = reinterpret_cast<uint8_t*>(bases[i] + (u.begin - merged[i].begin));
    for (size_t o = 0; o < u.end - u.begin; o += kHuge)
      pieces.push_back({reinterpret_cast<const uint8_t*>(u.begin) + o, dst + o, std::min(kHuge, u.end - u.begin - o)});
  }
  const int64_t npieces = int64_t(pieces.size());
#pragma omp parallel for schedule(dynamic, 4) num_threads(ctx.num_threads())
  for (int64_t c = 0; c < npieces; ++c) std::memcpy(pieces[size_t(c)].dst, pieces[size_t(c)].src, pieces[size_t(c)].n);
  // Where the huge pages were not there at fault time (fragmented memory), ask for them now:
  // MADV_COLLAPSE (Linux 6.1) compacts synchronously. Best effort, like MADV_HUGEPAGE.
  for (size_t i = first_region; i < regions_.size(); ++i) madvise(regions_[i].first, regions_[i].second, kMadvCollapse);
  auto move = [&](const void* p) -> const void* {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const size_t i = region_of(a);
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
