// `mla`: dispatch to a subcommand. Errors from the library arrive as exceptions and end
// here with a message and a non-zero exit status.
#include <signal.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/command.h"
#include "kv/page_hash.h"
#include "parallel/comm.h"

namespace mla::cli {

std::vector<CommandEntry>& commands() {
  static std::vector<CommandEntry> all;
  return all;
}

std::vector<int32_t> parse_id_list(const std::string& s, const std::string& option) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      long long v = std::stoll(item, &used);
      if (used != item.size() || v < INT32_MIN || v > INT32_MAX) throw std::invalid_argument("");
      ids.push_back(int32_t(v));
    } catch (const std::exception&) {
      throw std::invalid_argument(option + ": '" + item + "' is not an integer token id");
    }
  }
  if (ids.empty()) throw std::invalid_argument(option + ": no token ids given");
  return ids;
}

namespace {
// One id: the whole token must be a decimal integer in int32 range.
bool parse_one_id(const std::string& token, int32_t& id) {
  try {
    size_t used = 0;
    long long v = std::stoll(token, &used);
    if (used != token.size() || v < INT32_MIN || v > INT32_MAX) return false;
    id = int32_t(v);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}
}  // namespace

std::vector<int32_t> parse_id_text(const std::string& text, const std::string& source) {
  std::vector<int32_t> ids;
  auto is_separator = [](char c) { return c == ',' || std::isspace(static_cast<unsigned char>(c)); };
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && is_separator(text[i])) ++i;  // a run of separators is one separator
    if (i == text.size()) break;
    size_t end = i;
    while (end < text.size() && !is_separator(text[end])) ++end;
    std::string token = text.substr(i, end - i);
    int32_t id = 0;
    if (!parse_one_id(token, id)) {
      if (token.size() > 40) token = token.substr(0, 40) + "...";
      throw std::invalid_argument(source + ": token " + std::to_string(ids.size() + 1) + " ('" + token +
                                  "') is not an integer token id");
    }
    ids.push_back(id);
    i = end;
  }
  if (ids.empty()) throw std::invalid_argument(source + ": no token ids in it");
  return ids;
}

std::vector<int32_t> read_id_file(const std::string& path) {
  const std::string source = "--ids-file " + (path == "-" ? std::string("- (standard input)") : path);
  std::string text;
  if (path == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    if (std::cin.bad()) throw std::runtime_error(source + ": cannot read standard input");
  } else {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error(source + ": cannot open the file: " + std::strerror(errno));
    text.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    if (f.bad()) throw std::runtime_error(source + ": cannot read the file");
  }
  return parse_id_text(text, source);
}

Command::Command(std::string name, std::string summary, CommandFn fn) {
  commands().push_back({std::move(name), std::move(summary), std::move(fn)});
}

}  // namespace mla::cli

namespace {

// libgomp's default wait policy spins each idle thread for about 300,000 iterations after every
// parallel region. On a machine whose cores are shared (virtual CPUs, other jobs) the spinning
// thread takes the core from the one doing the work: decode measured 2-3x slower that way. The
// policy is read once, when libgomp starts, so `mla` re-executes itself with a short spin
// (GOMP_SPINCOUNT=10000, then sleep) unless the environment already chose one.
void choose_wait_policy() {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT") || std::getenv("MLA_REEXEC")) return;
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t i = 0; i < all.size();) {
    size_t j = all.find('\0', i);
    if (j == std::string::npos) j = all.size();
    args.push_back(all.substr(i, j - i));
    i = j + 1;
  }
  if (args.empty()) return;
  std::vector<char*> av;
  for (auto& a : args) av.push_back(a.data());
  av.push_back(nullptr);
  setenv("GOMP_SPINCOUNT", "10000", 0);
  setenv("MLA_REEXEC", "1", 1);
  execv("/proc/self/exe", av.data());  // returns only on failure: carry on with the default
}

}  // namespace

namespace {

// The commands that run expert-parallel under mpirun: in logits, run, verify and bench each rank
// runs the same loop on the same input and rank 0 prints; in serve and chat rank 0 takes the input
// and the others replay its passes (engine/lockstep.h). The others refuse an MPI launch.
bool runs_under_mpi(const std::string& command) {
  return command == "logits" || command == "run" || command == "verify" || command == "serve" || command == "chat" ||
         command == "bench";
}

// A digest of this program's own file: ranks started from different builds refuse to run.
std::string build_digest() {
  std::ifstream f("/proc/self/exe", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (!f && !f.eof()) throw std::runtime_error("cannot read /proc/self/exe for the build check");
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)mla::hash64(bytes.data(), bytes.size()));
  return std::string("build ") + hex;
}

// Sets up the ranks of an MPI launch: joins the job, checks every rank runs the same build,
// and sends the standard output of every rank but 0 to /dev/null (errors stay on stderr).
void start_ranks(const std::string& command, int* argc, char*** argv) {
  // MPI_Init starts threads of its own. They start with SIGINT and SIGTERM blocked, so that
  // these signals reach the threads of mla, as without MPI: `mla serve` waits for them on one
  // thread, and a signal taken by an MPI thread would end the process at once.
  sigset_t stop, before;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, &before);
  mla::parallel::init_world(argc, argv);
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  auto& world = mla::parallel::world();
  if (world.size() == 1) return;
  if (!runs_under_mpi(command))
    throw std::runtime_error("'" + command + "' does not run under mpirun yet (logits, run, verify, serve, chat and bench do)");
  mla::parallel::rank_timeout_from_env();  // a bad MLA_RANK_TIMEOUT fails now, not after loading
  mla::parallel::require_same_on_all_ranks(world, "build", build_digest());
  if (world.rank() != 0 && !std::freopen("/dev/null", "w", stdout))
    throw std::runtime_error("cannot send rank " + std::to_string(world.rank()) + "'s output to /dev/null");
}

}  // namespace

static void usage() {
  auto all = mla::cli::commands();
  std::sort(all.begin(), all.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::fprintf(stderr, "usage: mla COMMAND [options]   (mla COMMAND --help for its options)\n\ncommands:\n");
  for (auto& c : all) std::fprintf(stderr, "  %-14s %s\n", c.name.c_str(), c.summary.c_str());
}

int main(int argc, char** argv) {
  choose_wait_policy();
  // A forward pass allocates its activations afresh (tens of MB for a long prompt): keep freed
  // memory in the heap instead of returning it to the system and faulting it in again.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    usage();
    return argc < 2 ? 2 : 0;
  }
  std::string name = argv[1];
  for (auto& c : mla::cli::commands()) {
    if (c.name != name) continue;
    try {
      start_ranks(name, &argc, &argv);
      const int rc = c.fn(argc - 1, argv + 1);
      mla::parallel::finalize_world();
      return rc;
    } catch (const std::exception& e) {
      auto& world = mla::parallel::world();
      if (world.size() > 1) {
        // One rank's error ends the whole job: the others would wait in the next collective.
        std::fprintf(stderr, "mla %s: error on rank %d of %d: %s\n", name.c_str(), world.rank(), world.size(), e.what());
        std::fflush(stderr);
        world.abort(1);
      }
      std::fprintf(stderr, "mla %s: error: %s\n", name.c_str(), e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "mla: unknown command '%s'\n\n", name.c_str());
  usage();
  return 2;
}
