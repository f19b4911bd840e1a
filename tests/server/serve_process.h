// The `mla serve` program as the binary tests run it: a model folder made from a fixture, and
// the server spawned on a free port with its standard error in a log file.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"
#include "tokenizer/tokenizer.h"

extern char** environ;

namespace mla::test {

inline std::string read_all(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The deepseek-v3-tiny fixture (without its golden logits) and a byte-level tokenizer in dir.
inline void make_served_model(const std::filesystem::path& dir) {
  for (auto& e : std::filesystem::directory_iterator(fixture("deepseek-v3-tiny")))
    if (e.path().filename() != "golden.safetensors") std::filesystem::copy(e.path(), dir / e.path().filename());
  Tokenizer::write_byte_level_tokenizer(dir.string(), 512);
}

// `mla serve ARGS --port 0`, its standard error in `log`; port is the one it printed (0: it
// printed none within a minute, or exited). Killed (SIGKILL) and reaped when the object goes,
// on every way out of a test, unless pid was reset after reaping it.
struct ServeProcess {
  pid_t pid = 0;
  int port = 0;
  std::string log;
  ServeProcess(std::string log_path, std::vector<std::string> args) : log(std::move(log_path)) {
    args.insert(args.begin(), {MLA_BINARY, "serve", "--port", "0"});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    if (posix_spawn(&pid, MLA_BINARY, &fa, nullptr, argv.data(), environ) != 0) pid = 0;
    posix_spawn_file_actions_destroy(&fa);
    const std::regex re(R"(http://127\.0\.0\.1:([0-9]+))");
    for (int i = 0; pid > 0 && i < 600 && port == 0; ++i) {  // up to a minute for the load
      std::smatch m;
      const std::string text = read_all(log);
      if (std::regex_search(text, m, re)) port = std::stoi(m[1]);
      else std::this_thread::sleep_for(std::chrono::milliseconds(100));
      int st;
      if (port == 0 && waitpid(pid, &st, WNOHANG) == pid) pid = 0;  // exited early
    }
  }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;
  ~ServeProcess() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  std::string log_text() const { return read_all(log); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
};

}  // namespace mla::test
