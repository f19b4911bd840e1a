#include "format/progress.h"

#include <unistd.h>

#include <cstdio>

namespace mla {

Progress::Progress(std::string what, bool enabled)
    : what_(std::move(what)), enabled_(enabled && ::isatty(STDERR_FILENO)), t0_(std::chrono::steady_clock::now()),
      last_(t0_) {}

Progress::~Progress() { finish(); }

std::string Progress::line(const std::string& what, size_t done, size_t total, int64_t items, int64_t items_total,
                           double seconds) {
  char buf[256];
  const double gb = 1e9;
  int n = std::snprintf(buf, sizeof buf, "%s: %.2f / %.2f GB (%.0f%%)", what.c_str(), double(done) / gb,
                        double(total) / gb, total ? 100.0 * double(done) / double(total) : 100.0);
  std::string s(buf, size_t(n));
  if (items_total > 0) {
    n = std::snprintf(buf, sizeof buf, ", %lld / %lld tensors", (long long)items, (long long)items_total);
    s.append(buf, size_t(n));
  }
  if (seconds > 0 && done > 0) {
    const double rate = double(done) / seconds;
    n = std::snprintf(buf, sizeof buf, ", %.2f GB/s", rate / gb);
    s.append(buf, size_t(n));
    if (done < total) {
      n = std::snprintf(buf, sizeof buf, ", %.0f s left", double(total - done) / rate);
      s.append(buf, size_t(n));
    } else {
      n = std::snprintf(buf, sizeof buf, ", %.1f s", seconds);
      s.append(buf, size_t(n));
    }
  }
  return s;
}

void Progress::draw(double seconds) {
  const std::string s = line(what_, done_, total_, items_, items_total_, seconds);
  std::fprintf(stderr, "\r%s\033[K", s.c_str());  // erase what a longer line left
  std::fflush(stderr);
}

void Progress::update(size_t done, size_t total, int64_t items, int64_t items_total) {
  done_ = done, total_ = total, items_ = items, items_total_ = items_total;
  if (!enabled_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_ < std::chrono::milliseconds(200) && done < total) return;
  last_ = now;
  draw(std::chrono::duration<double>(now - t0_).count());
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (!enabled_) return;
  draw(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count());
  std::fprintf(stderr, "\n");
}

}  // namespace mla
