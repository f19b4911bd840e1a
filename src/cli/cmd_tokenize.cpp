// `mla tokenize`, `mla detokenize` and `mla chat-template`: the tokenizer and chat templates of a
// model folder from the command line. Text goes in and out byte-exact (binary stdin/stdout).
#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/load_model.h"
#include "cli/options.h"
#include "chat/chat_template.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

std::string read_all(std::FILE* in) {
  std::string data;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, in)) > 0) data.append(buf, n);
  if (std::ferror(in)) throw std::runtime_error("error reading standard input");
  return data;
}

void write_all(const std::string& data) {
  if (!data.empty() && std::fwrite(data.data(), 1, data.size(), stdout) != data.size())
    throw std::runtime_error("error writing standard output");
  std::fflush(stdout);
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) line.push_back(' ');
    line += std::to_string(ids[i]);
  }
  return line + "\n";
}

// tokenize and detokenize: -m (the tokenizer's folder) and one flag; run(tokenizer, flag) does
// the work.
int tokenizer_command(int argc, char** argv, const std::string& about, const std::string& name, const std::string& flag,
                      const std::string& flag_help, const std::function<void(const mla::Tokenizer&, bool)>& run) {
  CLI::App app{about};
  app.name(name);
  std::string model_dir, tokenizer_dir;
  bool value = false;
  mla::cli::add_model_option(app, model_dir, "model folder with tokenizer.json, or a GGUF file");
  mla::cli::add_tokenizer_option(app, tokenizer_dir);
  app.add_flag(flag, value, flag_help);
  CLI11_PARSE(app, argc, argv);
  run(mla::cli::load_tokenizer(model_dir, tokenizer_dir), value);
  return 0;
}

int tokenize_main(int argc, char** argv) {
  return tokenizer_command(argc, argv, "Encode all of standard input (bytes, unchanged) and print the token ids on one line.",
                           "mla tokenize", "--special", "add special tokens (BOS/EOS as tokenizer_config.json says)",
                           [](const mla::Tokenizer& tokenizer, bool special) {
                             write_all(join_ids(tokenizer.encode(read_all(stdin), special)));
                           });
}

int detokenize_main(int argc, char** argv) {
  return tokenizer_command(
      argc, argv, "Read whitespace-separated token ids from standard input and write their text, byte-exact.",
      "mla detokenize", "--skip-special", "leave out special tokens", [](const mla::Tokenizer& tokenizer, bool skip_special) {
        std::istringstream in(read_all(stdin));
        std::vector<int32_t> ids;
        std::string word;
        while (in >> word) {
          int32_t id = 0;
          const char* end = word.data() + word.size();
          const auto [stop, err] = std::from_chars(word.data(), end, id);  // out of int32's range: an error
          if (err != std::errc() || stop != end)
            throw std::runtime_error("standard input: '" + word + "' is not a token id");
          ids.push_back(id);
        }
        write_all(tokenizer.decode(ids, skip_special));
      });
}

int chat_template_main(int argc, char** argv) {
  CLI::App app{"Render the model's chat template over a JSON list of messages (printed byte-exact), or its ids."};
  app.name("mla chat-template");
  std::string model_dir, tokenizer_dir, messages_path;
  bool add_generation_prompt = false, print_ids = false;
  mla::cli::add_model_option(app, model_dir, "model folder with tokenizer.json and tokenizer_config.json, or a GGUF file");
  mla::cli::add_tokenizer_option(app, tokenizer_dir);
  app.add_option("--messages", messages_path,
                 "JSON file: a list of messages, or an object with \"messages\" (and optionally \"tools\")")
      ->required();
  app.add_flag("--add-generation-prompt", add_generation_prompt, "end with the assistant turn's opening");
  app.add_flag("--ids", print_ids, "print the token ids of the rendered text instead of the text");
  CLI11_PARSE(app, argc, argv);

  auto tokenizer = mla::cli::load_tokenizer(model_dir, tokenizer_dir);
  // A checkpoint without a template may have a built-in format (config.json's model_type).
  std::string model_type;
  if (mla::gguf_path(model_dir)) {
    model_type = mla::ModelConfig::load(model_dir).model_type;
  } else if (std::ifstream config(model_dir + "/config.json"); config) {
    nlohmann::json c = nlohmann::json::parse(config, nullptr, /*allow_exceptions=*/false);
    if (c.is_object() && c.contains("model_type") && c["model_type"].is_string()) model_type = c["model_type"];
  }
  const mla::ChatFormat format = mla::chat_format_for(model_type, tokenizer.chat_template());
  if (format.empty()) throw std::runtime_error(model_dir + "/tokenizer_config.json: no chat_template");
  std::ifstream file(messages_path, std::ios::binary);
  if (!file) throw std::runtime_error(messages_path + ": cannot open file");
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  nlohmann::ordered_json input;
  try {
    input = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(messages_path + ": bad JSON: " + e.what());
  }
  nlohmann::ordered_json messages = input, extra = nlohmann::ordered_json::object();
  if (input.is_object()) {
    if (!input.contains("messages")) throw std::runtime_error(messages_path + ": object without \"messages\"");
    messages = input["messages"];
    for (auto it = input.begin(); it != input.end(); ++it)
      if (it.key() != "messages") extra[it.key()] = it.value();
  }
  if (!messages.is_array()) throw std::runtime_error(messages_path + ": messages must be a JSON list");
  if (!extra.contains("bos_token")) extra["bos_token"] = tokenizer.bos_token();
  if (!extra.contains("eos_token")) extra["eos_token"] = tokenizer.eos_token();
  std::string rendered = mla::render_chat(format, messages, add_generation_prompt, extra);
  if (print_ids) write_all(join_ids(tokenizer.encode(rendered, false)));
  else write_all(rendered);
  return 0;
}

mla::cli::Command tokenize_command("tokenize", "encode standard input to token ids", tokenize_main);
mla::cli::Command detokenize_command("detokenize", "decode token ids from standard input to text", detokenize_main);
mla::cli::Command chat_template_command("chat-template", "render a chat template over messages", chat_template_main);

}  // namespace
