// `mla`: dispatch to a subcommand. Errors from the library arrive as exceptions and end
// here with a message and a non-zero exit status.
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/command.h"

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
      return c.fn(argc - 1, argv + 1);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "mla %s: error: %s\n", name.c_str(), e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "mla: unknown command '%s'\n\n", name.c_str());
  usage();
  return 2;
}
