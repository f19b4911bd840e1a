// The `mla serve` program as the binary tests run it: a model folder made from a fixture, and
// the server spawned on a free port with its standard error in a log file; and a raw loopback
// connection for what httplib's client will not send (or for a client that goes away).
#pragma once
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tokenizer/tokenizer.h"

extern char** environ;

namespace mla::test {

inline std::string read_all(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// DeepSeek-V3's chat template (the tokenizer fixture's).
inline std::string deepseek_v3_template() {
  const nlohmann::json cfg =
      nlohmann::json::parse(read_all(shared_dir() + "/fixtures/tokenizer/deepseek-v3/tokenizer_config.json"));
  return cfg["chat_template"].get<std::string>();
}

// DeepSeek-V3's template whose generation prompt opens <think> when the Jinja condition holds
// ("thinking": the template variable; "true": always); "" when its generation prompt is not
// where it was (the fixture changed).
inline std::string deepseek_v3_thinking_template(const std::string& condition) {
  std::string t = deepseek_v3_template();
  const std::string gen = "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}";
  const size_t at = t.find(gen);
  if (at == std::string::npos) return {};
  t.replace(at, gen.size(),
            "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% if " + condition +
                " %}{{'<think>\\n'}}{% endif %}{% endif %}");
  return t;
}

// The deepseek-v3-tiny fixture (without its golden logits) and a byte-level tokenizer in dir;
// context > 0 raises its max_position_embeddings (256) to that many tokens, for a test that
// needs a generation long enough to still be running when something else happens.
inline void make_served_model(const std::filesystem::path& dir, int context = 0) {
  for (auto& e : std::filesystem::directory_iterator(fixture("deepseek-v3-tiny")))
    if (e.path().filename() != "golden.safetensors") std::filesystem::copy(e.path(), dir / e.path().filename());
  Tokenizer::write_byte_level_tokenizer(dir.string(), 512);
  if (context > 0) {
    const std::string config = (dir / "config.json").string(), text = read_all(config);
    const std::regex field(R"("max_position_embeddings"\s*:\s*[0-9]+)");
    std::ofstream(config, std::ios::trunc)
        << std::regex_replace(text, field, "\"max_position_embeddings\": " + std::to_string(context));
  }
}

// `mla serve ARGS --port 0`, its standard error in `log`; port is the one it printed (0: it
// printed none within a minute, or exited). nofile > 0: under that limit of open files (`ulimit
// -n` in /bin/sh, which then execs the server: pid stays the server's). launcher: a command the
// server runs under (mpirun and its options; pid is then the launcher's). The process starts a
// process group of its own; the group is killed (SIGKILL) and pid reaped when the object goes,
// on every way out of a test, unless pid was reset after reaping it.
struct ServeProcess {
  pid_t pid = 0;
  int port = 0;
  std::string log;
  ServeProcess(std::string log_path, std::vector<std::string> args, int nofile = 0,
               const std::vector<std::string>& launcher = {})
      : log(std::move(log_path)) {
    args.insert(args.begin(), {MLA_BINARY, "serve", "--port", "0"});
    args.insert(args.begin(), launcher.begin(), launcher.end());
    if (nofile > 0)
      args.insert(args.begin(), {"/bin/sh", "-c", "ulimit -n " + std::to_string(nofile) + " && exec \"$0\" \"$@\""});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);  // pgid 0: a group of its own
    if (posix_spawnp(&pid, argv[0], &fa, &attr, argv.data(), environ) != 0) pid = 0;
    posix_spawnattr_destroy(&attr);
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
      ::kill(-pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  std::string log_text() const { return read_all(log); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
};

// A raw loopback connection to 127.0.0.1:port (fd -1 when it could not connect), closed when
// the object goes.
struct RawConnection {
  int fd = -1;
  explicit RawConnection(int port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) close();
  }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;
  ~RawConnection() { close(); }
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  bool send(const std::string& s) const {
    return fd >= 0 && ::send(fd, s.data(), s.size(), MSG_NOSIGNAL) == ssize_t(s.size());
  }
  // Reads until `until` appears (empty: until the server closes), the server closes, or ms pass.
  std::string read_until(const std::string& until, int ms) const {
    std::string out;
    const auto t0 = std::chrono::steady_clock::now();
    while (fd >= 0 && std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(ms) &&
           (until.empty() || out.find(until) == std::string::npos)) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      out.append(buf, size_t(n));
    }
    return out;
  }
  // Everything until the server closes the connection (or ms pass).
  std::string read_all(int ms = 5000) const { return read_until("", ms); }
};

// The head of a POST with a JSON body of `length` bytes; `extra`: more header lines, each ending
// in \r\n.
inline std::string post_head(const std::string& path, size_t length, const std::string& extra = {}) {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + extra +
         "Content-Length: " + std::to_string(length) + "\r\n\r\n";
}

// A whole POST with this JSON body.
inline std::string post_request(const std::string& path, const std::string& body, const std::string& extra = {}) {
  return post_head(path, body.size(), extra) + body;
}

}  // namespace mla::test
