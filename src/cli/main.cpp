// `mla`: dispatch to a subcommand. Errors from the library arrive as exceptions and end
// here with a message and a non-zero exit status.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>

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

static void usage() {
  auto all = mla::cli::commands();
  std::sort(all.begin(), all.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::fprintf(stderr, "usage: mla COMMAND [options]   (mla COMMAND --help for its options)\n\ncommands:\n");
  for (auto& c : all) std::fprintf(stderr, "  %-14s %s\n", c.name.c_str(), c.summary.c_str());
}

int main(int argc, char** argv) {
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
