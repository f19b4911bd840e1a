// Anonymous memory on 2 MiB transparent huge pages, for the latent pool and the prompt cache's
// page blocks. On 4 KiB pages, the kernel's copies into the memory (a read from a file, the
// first touch of a fresh page) cost a fault or a page-table walk every 4 KiB; under a
// hypervisor with shadow page tables, reading a restart's pages from the page cache into a
// 4 KiB-page pool ran at 0.5 GB/s against 12.5 GB/s into a huge-page one (docs/prompt-cache.md).
#pragma once
#include <cstddef>
#include <memory>

namespace mla {

// `bytes` of zeroed memory, 2 MiB-aligned, advised onto huge pages (best effort: the system may
// not allow them) and populated at once when `populate` (MADV_POPULATE_WRITE where the kernel
// has it, else written), so that later use never waits for a first touch. Null when mapping fails.
std::shared_ptr<void> huge_mapping(size_t bytes, bool populate);

}  // namespace mla
