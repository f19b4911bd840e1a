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

// The token ids of a text in which they are separated by whitespace, commas or both ("5, 17\n42"):
// the form of --ids-file, whose contents may be far longer than one command-line argument.
// Throws std::invalid_argument naming `source` and, for a token that is not an integer id, its
// position (1-based, counting tokens) and text; an empty text is an error too.
std::vector<int32_t> parse_id_text(const std::string& text, const std::string& source);

// --ids-file PATH: reads PATH ("-": standard input) and parses it with parse_id_text; a file that
// cannot be opened or read is an error naming it.
std::vector<int32_t> read_id_file(const std::string& path);

}  // namespace mla::cli
