// tiktoken.model reader (base64 token bytes and ranks), Kimi's pre-tokenizer pattern for PCRE2,
// and Kimi's input chunking (400,000 code points; whitespace / non-whitespace runs of 25,000).
#include "tokenizer/tiktoken.h"

#include <algorithm>
#include <stdexcept>

#include "tokenizer/unicode_util.h"

namespace mla::tiktoken {

namespace {

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Standard base64 with optional '=' padding; false on any other character or a bad length.
bool base64_decode(std::string_view in, std::string* out) {
  out->clear();
  size_t end = in.size();
  size_t padding = 0;
  while (end > 0 && in[end - 1] == '=' && padding < 2) {
    --end;
    ++padding;
  }
  if (padding && (end + padding) % 4 != 0) return false;
  if (end % 4 == 1) return false;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < end; ++i) {
    int v = base64_value(in[i]);
    if (v < 0) return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out->push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  // Leftover bits must be zero, as in canonical encodings.
  return (acc & ((1u << bits) - 1)) == 0;
}

std::string base64_encode(std::string_view in) {
  static const char* const kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  for (size_t i = 0; i < in.size(); i += 3) {
    const size_t n = std::min<size_t>(3, in.size() - i);
    uint32_t v = 0;
    for (size_t k = 0; k < 3; ++k) v = (v << 8) | (k < n ? static_cast<uint8_t>(in[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k) out.push_back(k <= n ? kAlphabet[(v >> (18 - 6 * k)) & 63] : '=');
  }
  return out;
}

std::string quoted(std::string_view s) {
  std::string q(1, '\'');
  q.append(s);
  q.push_back('\'');
  return q;
}

bool is_field_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

}  // namespace

std::string format_model(const std::vector<RankedToken>& tokens) {
  std::string out;
  for (const RankedToken& t : tokens)
    out.append(base64_encode(t.bytes)).append(" ").append(std::to_string(t.rank)).append("\n");
  return out;
}

std::vector<RankedToken> parse_model(const std::string& path, std::string_view text) {
  std::vector<RankedToken> tokens;
  size_t line_number = 0, pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_number;
    auto fail = [&](const std::string& why) {
      throw std::runtime_error(path + ": line " + std::to_string(line_number) + ": " + why);
    };
    std::vector<std::string_view> fields;
    size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && is_field_space(line[i])) ++i;
      size_t start = i;
      while (i < line.size() && !is_field_space(line[i])) ++i;
      if (i > start) fields.push_back(line.substr(start, i - start));
    }
    if (fields.empty()) continue;
    if (fields.size() != 2) fail("expected '<base64 token> <rank>', found " + std::to_string(fields.size()) + " fields");
    RankedToken token;
    if (!base64_decode(fields[0], &token.bytes) || token.bytes.empty())
      fail(quoted(fields[0]) + " is not a base64-encoded token");
    int64_t rank = 0;
    for (char c : fields[1]) {
      if (c < '0' || c > '9') fail("rank " + quoted(fields[1]) + " is not a non-negative integer");
      rank = rank * 10 + (c - '0');
      if (rank >= (1 << 26)) fail("rank " + quoted(fields[1]) + " is out of range");
    }
    token.rank = static_cast<int32_t>(rank);
    token.line = line_number;
    tokens.push_back(std::move(token));
  }
  if (tokens.empty()) throw std::runtime_error(path + ": no tokens");

  // Duplicates: sort by the key, then report the later line of the first equal neighbours.
  std::vector<uint32_t> order(tokens.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  auto check = [&](auto less, auto equal, const char* what) {
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      const RankedToken &x = tokens[a], &y = tokens[b];
      return less(x, y) || (equal(x, y) && x.line < y.line);
    });
    size_t worst = 0;
    for (size_t i = 1; i < order.size(); ++i)
      if (equal(tokens[order[i - 1]], tokens[order[i]]) && (worst == 0 || tokens[order[i]].line < worst))
        worst = tokens[order[i]].line;
    if (worst) throw std::runtime_error(path + ": line " + std::to_string(worst) + ": " + what);
  };
  check([](const RankedToken& x, const RankedToken& y) { return x.rank < y.rank; },
        [](const RankedToken& x, const RankedToken& y) { return x.rank == y.rank; }, "this rank appears twice");
  check([](const RankedToken& x, const RankedToken& y) { return x.bytes < y.bytes; },
        [](const RankedToken& x, const RankedToken& y) { return x.bytes == y.bytes; }, "this token appears twice");
  return tokens;
}

// Kimi's pattern (tokenization_kimi.py) is written for tiktoken's Rust regex engine:
//
//   [\p{Han}]+
//   |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//   |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//   |\p{N}{1,3}
//   | ?[^\s\p{L}\p{N}]+[\r\n]*
//   |\s*[\r\n]+
//   |\s+(?!\S)
//   |\s+
//
// Translation to PCRE2:
// - PCRE2 has no class intersection `[X&&[^\p{Han}]]`; each becomes a negative lookahead before
//   the class, `(?:(?!\p{sc=Han})[X])`, which matches exactly the characters in X and not in Han.
// - In Rust's regex, `\p{Han}` is the Script property; in PCRE2 (10.40 and later) `\p{Han}` means
//   Script_Extensions, which also takes in shared punctuation such as U+3001 "、". `\p{sc=Han}` is
//   the Script property in PCRE2.
// - Rust's `\s` is the White_Space property; PCRE2's `\s` under UCP also matches U+180E, so
//   `\p{White_Space}` is spelled out (and `\S` becomes `\P{White_Space}`).
const char* const kKimiPattern =
    R"re(\p{sc=Han}+)re"
    R"re(|[^\r\n\p{L}\p{N}]?(?:(?!\p{sc=Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])*)re"
    R"re((?:(?!\p{sc=Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)re"
    R"re(|[^\r\n\p{L}\p{N}]?(?:(?!\p{sc=Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])+)re"
    R"re((?:(?!\p{sc=Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)re"
    R"re(|\p{N}{1,3})re"
    R"re(| ?[^\p{White_Space}\p{L}\p{N}]+[\r\n]*)re"
    R"re(|\p{White_Space}*[\r\n]+)re"
    R"re(|\p{White_Space}+(?!\P{White_Space}))re"
    R"re(|\p{White_Space}+)re";

bool python_isspace(uint32_t cp) {
  // Characters with bidirectional type WS, B or S, or general category Zs.
  if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

void for_each_kimi_chunk(std::string_view text, const std::function<void(std::string_view)>& f) {
  constexpr size_t kMaxChunkChars = 400'000;
  constexpr size_t kMaxRunChars = 25'000;
  size_t block_begin = 0;
  while (block_begin < text.size()) {
    // One block of up to kMaxChunkChars code points, cut into slices at over-long runs.
    size_t i = block_begin, chars = 0, slice_begin = block_begin, run = 0;
    bool run_is_space = false;
    size_t bad = 0;
    while (i < text.size() && chars < kMaxChunkChars) {
      size_t len = utf8::sequence_length(text, i, &bad);
      bool space = false;
      if (len == 0) len = bad;  // not reached for valid input; keeps the loop moving
      else space = python_isspace(utf8::decode_at(text, i, len));
      if (chars == 0 || space != run_is_space) {
        run = 1;
        run_is_space = space;
      } else if (++run > kMaxRunChars) {
        f(text.substr(slice_begin, i - slice_begin));
        slice_begin = i;
        run = 1;
      }
      i += len;
      ++chars;
    }
    f(text.substr(slice_begin, i - slice_begin));
    block_begin = i;
  }
}

}  // namespace mla::tiktoken
