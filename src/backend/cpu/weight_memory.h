// Weights in anonymous memory on transparent huge pages. A memory-mapped checkpoint lives in
// the page cache on 4 KiB pages: streaming it costs a TLB miss (a two-level walk under a
// hypervisor) every 4 KiB, hardware prefetch stops at each page boundary, and the kernel may
// drop cold pages (an expert not chosen for a while) and read them back from disk. Copying the
// bytes the weight views point into, once at load, onto 2 MiB pages avoids all three.
#pragma once
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "backend/cpu/context.h"
#include "tensor/matrix.h"

namespace mla::cpu {

class WeightArena {
 public:
  WeightArena() = default;
  ~WeightArena();
  WeightArena(const WeightArena&) = delete;
  WeightArena& operator=(const WeightArena&) = delete;

  // Copies the memory every view reads (weights and scales, merged into contiguous regions;
  // views sharing memory keep sharing it) and repoints the views at the copies; the copy runs on
  // ctx's threads.
  void adopt(const Context& ctx, std::span<MatrixView* const> views);

  size_t bytes() const { return bytes_; }          // copied
  size_t huge_bytes() const;                         // of those, on huge pages now (AnonHugePages)

 private:
  std::vector<std::pair<void*, size_t>> maps_;     // reservations, guard pages included
  std::vector<std::pair<void*, size_t>> regions_;  // the weights' 2 MiB-aligned part of each
  size_t bytes_ = 0;
};

// Whether Model::load copies weights of this many bytes into a WeightArena, by the placement of
// its context (WeightPlacement, context.h): Auto when they take less than half of the memory
// available (MemAvailable).
bool should_copy_weights(WeightPlacement placement, size_t weight_bytes);

}  // namespace mla::cpu
