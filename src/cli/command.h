// Subcommand registry of the `mla` program. Each src/cli/cmd_*.cpp file registers its
// subcommands with a static Command object; main.cpp dispatches on argv[1].
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mla::cli {

using CommandFn = std::function<int(int argc, char** argv)>;  // argv[0] is the subcommand name

struct Command {
  Command(std::string name, std::string summary, CommandFn fn);
};

struct CommandEntry {
  std::string name, summary;
  CommandFn fn;
};
std::vector<CommandEntry>& commands();

// "5,17,42" -> {5, 17, 42}; throws std::invalid_argument naming the option for a bad or empty list.
std::vector<int32_t> parse_id_list(const std::string& s, const std::string& option = "--ids");

}  // namespace mla::cli
