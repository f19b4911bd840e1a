// A progress line on standard error for long reads and writes (loading, quantizing, writing
// checkpoints): bytes and items done of the total, the rate and the time left, redrawn in place
// at most five times a second. Quiet unless asked for and standard error is a terminal, so logs
// and pipes get no carriage returns.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace mla {

class Progress {
 public:
  // enabled: the caller wants progress (e.g. not --quiet); it is drawn only on a terminal.
  explicit Progress(std::string what, bool enabled = true);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Bytes (and, when items_total > 0, items such as tensors) done so far of the totals.
  void update(size_t done, size_t total, int64_t items = 0, int64_t items_total = 0);
  // Draws the final state and ends the line (also done by the destructor).
  void finish();
  bool drawing() const { return enabled_; }

  // The line drawn after `seconds`: "<what>: 1.20 / 4.80 GB (25%), 3 / 12 tensors, 0.40 GB/s, 9 s left".
  static std::string line(const std::string& what, size_t done, size_t total, int64_t items, int64_t items_total,
                          double seconds);

 private:
  std::string what_;
  bool enabled_;
  bool finished_ = false;
  size_t done_ = 0, total_ = 0;
  int64_t items_ = 0, items_total_ = 0;
  std::chrono::steady_clock::time_point t0_, last_;
  void draw(double seconds);
};

}  // namespace mla
