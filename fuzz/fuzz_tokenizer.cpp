// tokenizer.json from the fuzzer's bytes (before a "\n#TEXT#\n" line), then the text after it
// (or a fixed sample) encoded with and without special tokens and decoded back. Loading
// throws std::runtime_error (or std::invalid_argument) naming the problem; encoding never
// throws; decoding gives valid UTF-8.
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (256 << 10)) return 0;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::string_view text = "Hello, world! 123 \xe4\xb8\xad\xe6\x96\x87 <|end|> \xff\xfe tabs\tand\nlines";
  const size_t cut = in.find("\n#TEXT#\n");
  if (cut != std::string_view::npos) {
    text = in.substr(cut + 8);
    in = in.substr(0, cut);
  }
  mla::fuzz::write_file("tokenizer.json", reinterpret_cast<const uint8_t*>(in.data()), in.size());
  std::optional<mla::Tokenizer> tok;
  try {
    tok.emplace(mla::Tokenizer::load(mla::fuzz::temp_dir().string()));
  } catch (const std::runtime_error&) {
    return 0;
  } catch (const std::invalid_argument&) {
    return 0;
  }
  for (bool special : {false, true}) {
    std::vector<int32_t> ids = tok->encode(text, special);
    for (int32_t id : ids)
      if (id < 0 || size_t(id) >= tok->vocab_size()) __builtin_trap();
    (void)tok->decode(ids, special);
  }
  return 0;
}
