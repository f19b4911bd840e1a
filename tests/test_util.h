// Helpers shared by the tests: fixture locations, golden tensors, temporary folders, running a
// command (the mla program under test).
#pragma once
#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "format/safetensors.h"

namespace mla::test {

struct CommandResult {
  int status = -1;     // the exit status; -1 when the command did not exit normally
  std::string output;  // standard output (and standard error when asked for), byte-exact
};

// Runs a shell command line.
inline CommandResult run_command(const std::string& cmd, bool with_stderr = false) {
  const std::string line = cmd + (with_stderr ? " 2>&1" : "");
  FILE* p = popen(line.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed: " + line);
  CommandResult r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// Runs the mla program under test (MLA_BINARY) with the given arguments.
inline CommandResult run_mla(const std::string& args, bool with_stderr = true) {
  return run_command("'" + std::string(MLA_BINARY) + "' " + args, with_stderr);
}

inline std::string shared_dir() { return MLA_SHARED_DIR; }
// The checkout the tests were built from (tests/e2e, src/server/webui ...).
inline std::filesystem::path source_dir() { return MLA_SOURCE_DIR; }
inline std::string fixture(const std::string& name) { return shared_dir() + "/fixtures/models/" + name; }
inline std::vector<std::string> model_fixtures() {
  return {"deepseek-v3-tiny",   "deepseek-v3-yarn-tiny", "deepseek-v3-fp8-tiny", "deepseek-v2-lite-tiny",
          "deepseek-v2-tiny",   "kimi-k2-tiny",          "kimi-k2.5-int4-tiny",  "glm-4.7-flash-tiny"};
}

inline std::vector<float> read_f32(const TensorInfo& t) {
  std::vector<float> v(size_t(t.numel()));
  std::memcpy(v.data(), t.data, v.size() * 4);
  return v;
}
inline std::vector<int32_t> read_ids(const TensorInfo& t) {
  std::vector<int32_t> v;
  for (int64_t i = 0; i < t.numel(); ++i) {
    int64_t x;
    std::memcpy(&x, t.data + 8 * i, 8);
    v.push_back(int32_t(x));
  }
  return v;
}

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// The mean of |a[i] - b[i]|, summed in double.
inline double mean_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || a.empty()) return INFINITY;
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += std::fabs(double(a[i]) - double(b[i]));
  return sum / double(a.size());
}

// A fresh, empty folder under the system temp dir, removed with the object.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    static std::mt19937_64 rng(std::random_device{}());
    path = std::filesystem::temp_directory_path() / ("mla-test-" + tag + "-" + std::to_string(rng()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
  std::string operator/(const std::string& f) const { return (path / f).string(); }
};

// n draws of a normal distribution of standard deviation sd.
inline std::vector<float> randn(std::mt19937& g, size_t n, float sd = 1.0f) {
  std::normal_distribution<float> d(0, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

}  // namespace mla::test
