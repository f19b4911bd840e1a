// Tests of the tiktoken.model loader (Kimi K2 / K2.5 format): a small hand-made vocabulary whose
// encodings are derived by hand from tiktoken's rank rule and Kimi's pre-tokenizer pattern,
// special tokens from tokenizer_config.json, Kimi's input chunking, round trips and load errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <unistd.h>

#include "tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

std::string base64(const std::string& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    for (int k = 3; k >= 0; --k) out.push_back(kAlphabet[(v >> (6 * k)) & 63]);
  }
  if (bytes.size() - i == 1) {
    uint32_t v = uint8_t(bytes[i]) << 16;
    out += {kAlphabet[v >> 18], kAlphabet[(v >> 12) & 63], '=', '='};
  } else if (bytes.size() - i == 2) {
    uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8);
    out += {kAlphabet[v >> 18], kAlphabet[(v >> 12) & 63], kAlphabet[(v >> 6) & 63], '='};
  }
  return out;
}

// Ranks 0..255 are the single bytes (rank = byte value); these follow, rank 256 first.
const std::vector<std::string> kMerged = {
    "bc",                          // 256
    "ab",                          // 257
    "abc",                         // 258
    " a",                          // 259
    "\xC3\xA9",                    // 260 é
    "\xE4\xBD",                    // 261 first two bytes of 你
    "\xE4\xBD\xA0",                // 262 你
    "\xE5\xA5",                    // 263 first two bytes of 好
    "\xE5\xA5\xBD",                // 264 好
    "\xE3\x80",                    // 265 first two bytes of 、 (U+3001, Script=Common)
    "\xE3\x80\x81",                // 266 、
    "\xE5\xA5\xBD\xE3\x80\x81",    // 267 好、
    "\xE4\xBD\xA0\xE5\xA5\xBD",    // 268 你好
    "34",                          // 269
    "12",                          // 270
    "123",                         // 271
    "\n\n",                        // 272
    "i'",                          // 273
    "'s",                          // 274
    "oW",                          // 275
    "a\xE4\xBD\xA0",               // 276 a你
};
constexpr int32_t kBase = 277;  // number of ranks; special ids start here
constexpr int32_t kBos = 277, kEos = 278, kImEnd = 279, kImMiddle = 280, kThink = 281;

fs::path temp_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("mla_tiktoken_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string model_text() {
  std::ostringstream s;
  for (int b = 0; b < 256; ++b) s << base64(std::string(1, static_cast<char>(b))) << ' ' << b << '\n';
  for (size_t i = 0; i < kMerged.size(); ++i) s << base64(kMerged[i]) << ' ' << 256 + i << '\n';
  return s.str();
}

const char* kConfig = R"({
  "added_tokens_decoder": {
    "277": {"content": "[BOS]", "special": true},
    "278": {"content": "[EOS]", "special": true},
    "279": {"content": "<|im_end|>", "special": true},
    "280": {"content": "<|im_middle|>", "special": true},
    "281": {"content": "<think>", "special": false}
  },
  "bos_token": "[BOS]",
  "eos_token": "[EOS]",
  "chat_template": "{{ bos_token }}"
})";

void write_folder(const fs::path& dir, const std::string& model, const std::string& config) {
  std::ofstream(dir / "tiktoken.model", std::ios::binary) << model;
  if (!config.empty()) std::ofstream(dir / "tokenizer_config.json") << config;
}

class Tiktoken : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(temp_dir("fixture"));
    write_folder(*dir_, model_text(), kConfig);
    tok_ = new mla::Tokenizer(mla::Tokenizer::load(dir_->string()));
  }
  static void TearDownTestSuite() {
    delete tok_;
    fs::remove_all(*dir_);
    delete dir_;
  }
  static const mla::Tokenizer& tok() { return *tok_; }
  static Ids enc(const std::string& text) { return tok_->encode(text, false); }

  static inline fs::path* dir_ = nullptr;
  static inline mla::Tokenizer* tok_ = nullptr;
};

TEST_F(Tiktoken, VocabularyAndSpecialTokens) {
  // 277 ranks, then the 256 special ids Kimi reserves after them.
  EXPECT_EQ(tok().vocab_size(), static_cast<size_t>(kBase + 256));
  EXPECT_EQ(tok().bos_id(), kBos);
  EXPECT_EQ(tok().eos_id(), kEos);
  EXPECT_EQ(tok().bos_token(), "[BOS]");
  EXPECT_EQ(tok().chat_template(), "{{ bos_token }}");
  EXPECT_EQ(tok().token_bytes(259), " a");
  EXPECT_EQ(tok().token_text(259), "Ġa");  // byte-level form, as tokenizer.json writes it
  EXPECT_EQ(tok().token_id("Ġa"), 259);
  EXPECT_EQ(tok().token_bytes(260), "é");
  EXPECT_EQ(tok().token_text(260), "Ã©");
  EXPECT_EQ(tok().token_bytes(kImEnd), "<|im_end|>");
  EXPECT_EQ(tok().token_id("<|im_end|>"), kImEnd);
  EXPECT_TRUE(tok().is_special(kImEnd));
  EXPECT_FALSE(tok().is_special(kThink));
  EXPECT_FALSE(tok().is_special(259));
  // Ids the config does not name become <|reserved_token_ID|>.
  EXPECT_EQ(tok().token_text(300), "<|reserved_token_300|>");
  EXPECT_EQ(tok().token_text(kBase + 255), "<|reserved_token_532|>");
  EXPECT_TRUE(tok().is_special(300));
  EXPECT_THROW(tok().token_bytes(kBase + 256), std::out_of_range);
}

TEST_F(Tiktoken, MergesFollowTheRankOfTheConcatenation) {
  // "abc" is a token: taken whole.
  EXPECT_EQ(enc("abc"), (Ids{258}));
  // "abcd" (one piece, not a token): pairs ab=257, bc=256, cd=none -> merge bc: [a, bc, d];
  // pairs (a,bc)="abc"=258, (bc,d)=none -> [abc, d].
  EXPECT_EQ(enc("abcd"), (Ids{258, 'd'}));
  // " abc" (one piece: the optional leading non-letter): pairs " a"=259, ab=257, bc=256 ->
  // bc first: [' ', a, bc]; then (' ',a)=259 vs (a,bc)=258 -> abc: [' ', abc]. Merging left to
  // right instead would give [" a", "bc"].
  EXPECT_EQ(enc(" abc"), (Ids{' ', 258}));
  // Multi-byte tokens: "Café" -> C, a, f, then C3 A9 = é (260).
  EXPECT_EQ(enc("Café"), (Ids{'C', 'a', 'f', 260}));
  // No token for "aa" or "dd": bytes.
  EXPECT_EQ(enc("dd"), (Ids{'d', 'd'}));
}

TEST_F(Tiktoken, HanRunsAreTheirOwnPieces) {
  // "你好、": the Han run "你好" (268, a token) and "、" (U+3001, Script=Common, so not Han; a
  // punctuation piece, token 266). Were 、 in the Han piece (Script_Extensions), the piece
  // "你好、" would merge 261, 262 (你), 263, 264 (好), 265, 266 (、), then 好、=267 before
  // 你好=268: [262, 267].
  EXPECT_EQ(enc("你好、"), (Ids{268, 266}));
  // "a你" is a token, but "a" and "你" are different pieces: Han is cut out of the letter classes.
  EXPECT_EQ(enc("a你"), (Ids{'a', 262}));
  EXPECT_EQ(enc("你好abc"), (Ids{268, 258}));
  EXPECT_EQ(enc("é你好"), (Ids{260, 268}));
  // 你 without a whole-token piece: E4 BD A0 -> (E4,BD)=261 -> (261,A0)=262.
  EXPECT_EQ(enc("你"), (Ids{262}));
}

TEST_F(Tiktoken, LettersDigitsContractionsAndNewlines) {
  // Digits in groups of at most three: "123" | "45". One piece "12345" would merge 34 (269)
  // first and give [12, 34, 5].
  EXPECT_EQ(enc("12345"), (Ids{271, '4', '5'}));
  EXPECT_EQ(enc("1234567"), (Ids{271, '4', '5', '6', '7'}));
  EXPECT_EQ(enc("x12"), (Ids{'x', 270}));
  // Case changes split words: "Hello" | "World", so the token "oW" (275) is never used.
  EXPECT_EQ(enc("HelloWorld"), (Ids{'H', 'e', 'l', 'l', 'o', 'W', 'o', 'r', 'l', 'd'}));
  // The contraction stays with its word: "Kimi's" is one piece; (i,')=273 merges before
  // (',s)=274, leaving [K, i, m, i', s]. Cut as "Kimi" | "'s" it would end in 'i', 's.
  EXPECT_EQ(enc("Kimi's"), (Ids{'K', 'i', 'm', 273, 's'}));
  // "\n\n" between letters is one piece (\s*[\r\n]+): token 272.
  EXPECT_EQ(enc("a\n\nb"), (Ids{'a', 272, 'b'}));
  // "a, b": "a" | "," | " b".
  EXPECT_EQ(enc("a, b"), (Ids{'a', ',', ' ', 'b'}));
}

TEST_F(Tiktoken, SpecialTokensAreMatchedBeforeBpe) {
  EXPECT_EQ(enc("[BOS]abc<|im_end|>"), (Ids{kBos, 258, kImEnd}));
  EXPECT_EQ(enc("<|reserved_token_300|>"), (Ids{300}));
  EXPECT_EQ(enc("x<think>y"), (Ids{'x', kThink, 'y'}));
  // An unfinished special token is ordinary text: "<|" | "im" | "_end".
  EXPECT_EQ(enc("<|im_end"), (Ids{'<', '|', 'i', 'm', '_', 'e', 'n', 'd'}));
  Ids ids = enc("[BOS]hi<think><|im_end|>");
  EXPECT_EQ(tok().decode(ids), "[BOS]hi<think><|im_end|>");
  EXPECT_EQ(tok().decode(ids, true), "hi<think>");
  // Without add_bos_token in the config, add_special_tokens adds nothing.
  EXPECT_EQ(tok().encode("abc", true), (Ids{258}));
}

TEST_F(Tiktoken, RandomTextRoundTrips) {
  const std::vector<std::string> pool = {"a", "b", "c", "d", " ", "  ", "\n", "\r\n", "\t", "1", "2", "3",
                                         "4", "5", "你", "好", "、", "。", "é", "É", "K", "W", "o", "'",
                                         "'s", "😀", "ß", ",", "[BOS]", "<|im_end|>", "<think>", "Ω", "ﬁ"};
  std::mt19937 rng(7);
  for (int round = 0; round < 300; ++round) {
    std::string text;
    int parts = rng() % 40;
    for (int k = 0; k < parts; ++k) {
      if (rng() % 5 == 0) {
        // A random scalar value.
        uint32_t cp;
        do cp = rng() % 0x30000;
        while (cp >= 0xD800 && cp < 0xE000);
        std::string ch;
        if (cp < 0x80) ch.push_back(static_cast<char>(cp));
        else if (cp < 0x800) ch = {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 63))};
        else if (cp < 0x10000) ch = {char(0xE0 | (cp >> 12)), char(0x80 | ((cp >> 6) & 63)), char(0x80 | (cp & 63))};
        else ch = {char(0xF0 | (cp >> 18)), char(0x80 | ((cp >> 12) & 63)), char(0x80 | ((cp >> 6) & 63)), char(0x80 | (cp & 63))};
        text += ch;
      } else {
        text += pool[rng() % pool.size()];
      }
    }
    Ids ids = enc(text);
    for (int32_t id : ids) ASSERT_LT(static_cast<size_t>(id), tok().vocab_size());
    ASSERT_EQ(tok().decode(ids), text) << "round " << round;
    mla::StreamDecoder stream(tok());
    std::string streamed;
    for (int32_t id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    ASSERT_EQ(streamed, text);
  }
}

TEST_F(Tiktoken, KimiChunking) {
  // A run of more than 25,000 non-space characters is cut after 25,000: "a"*24999 + "b" | "c".
  // The first piece ends in ab (257), the second is c. Uncut, bc (256) and then abc (258) win.
  std::string text = std::string(24999, 'a') + "bc";
  Ids ids = enc(text);
  ASSERT_EQ(ids.size(), 24998u + 2u);
  EXPECT_EQ(ids[24997], 'a');
  EXPECT_EQ(ids[24998], 257);
  EXPECT_EQ(ids[24999], 'c');
  EXPECT_EQ(enc(std::string(24998, 'a') + "bc").back(), 258);  // 25,000 characters: not cut

  // Blocks of 400,000 code points (not bytes): 39 x ("é"*9999 + " ") + "é"*9999 is 399,999
  // characters, so the block ends after "b" and "c" starts the next one.
  std::string e9999;
  for (int k = 0; k < 9999; ++k) e9999 += "é";
  std::string big;
  for (int k = 0; k < 39; ++k) big += e9999 + " ";
  big += e9999 + "bc";
  ids = enc(big);
  ASSERT_EQ(ids.size(), 40u * 9999u + 39u + 2u);
  EXPECT_EQ(ids[ids.size() - 3], 260);
  EXPECT_EQ(ids[ids.size() - 2], 'b');
  EXPECT_EQ(ids[ids.size() - 1], 'c');
  EXPECT_EQ(tok().decode(ids), big);
}

std::string load_error(const fs::path& dir) {
  try {
    mla::Tokenizer::load(dir.string());
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TiktokenLoad, ErrorsNameTheFileAndLine) {
  auto dir = temp_dir("errors");
  std::string good = model_text();
  auto expect_error = [&](const std::string& model, const std::string& config, const std::string& a,
                          const std::string& b) {
    fs::remove(dir / "tokenizer_config.json");
    write_folder(dir, model, config);
    std::string what = load_error(dir);
    EXPECT_NE(what.find(a), std::string::npos) << what;
    EXPECT_NE(what.find(b), std::string::npos) << what;
  };
  // Line 3 lacks its rank.
  expect_error(base64(std::string(1, '\0')) + " 0\n" + base64("\x01") + " 1\n" + base64("\x02") + "\n", "",
               "tiktoken.model: line 3", "fields");
  expect_error("!!!! 0\n", "", "tiktoken.model: line 1", "base64");
  expect_error(base64("a") + " x1\n", "", "tiktoken.model: line 1", "rank");
  expect_error(good + base64("zz") + " 5\n", "", "tiktoken.model: line " + std::to_string(256 + kMerged.size() + 1),
               "rank appears twice");
  expect_error(good + base64("ab") + " 999\n", "", "line " + std::to_string(256 + kMerged.size() + 1), "twice");
  // A missing single byte.
  std::string no_ff = good;
  no_ff.erase(no_ff.find(base64("\xFF") + " 255\n"), base64("\xFF").size() + 5);
  expect_error(no_ff, "", "tiktoken.model", "single byte 255");
  // Config problems name tokenizer_config.json.
  expect_error(good, R"({"added_tokens_decoder": {"5": {"content": "<x>"}}})", "tokenizer_config.json",
               "already gives");
  expect_error(good, R"({"added_tokens_decoder": {"five": {"content": "<x>"}}})", "tokenizer_config.json",
               "'five'");
  expect_error(good, R"({"added_tokens_decoder": {"300": {"special": true}}})", "tokenizer_config.json",
               "content");
  expect_error(good, R"({"bos_token": "<nope>"})", "tokenizer_config.json", "<nope>");
  // Neither tokenizer.json nor tiktoken.model.
  fs::remove(dir / "tiktoken.model");
  EXPECT_NE(load_error(dir).find("tokenizer.json"), std::string::npos);
  fs::remove_all(dir);
}

TEST(TiktokenLoad, TokenizerJsonWinsWhenBothArePresent) {
  auto dir = temp_dir("both");
  mla::Tokenizer::write_byte_level_tokenizer(dir.string(), 300);
  write_folder(dir, model_text(), "");
  EXPECT_EQ(mla::Tokenizer::load(dir.string()).vocab_size(), 300u);
  fs::remove(dir / "tokenizer.json");
  fs::remove(dir / "tokenizer_config.json");
  auto tok = mla::Tokenizer::load(dir.string());
  EXPECT_EQ(tok.vocab_size(), static_cast<size_t>(kBase + 256));
  EXPECT_EQ(tok.bos_id(), -1);  // no config: no bos
  EXPECT_EQ(tok.encode("<|reserved_token_277|>", false), (Ids{277}));
  fs::remove_all(dir);
}

TEST(TiktokenLoad, RanksWithGapsKeepTheirIds) {
  // 256 byte ranks and "ab" at rank 300: 257 ranks, so ids 257..512 are reserved special tokens,
  // except 300, which stays "ab".
  auto dir = temp_dir("gaps");
  std::ostringstream model;
  for (int b = 0; b < 256; ++b) model << base64(std::string(1, static_cast<char>(b))) << ' ' << b << '\n';
  model << base64("ab") << " 300\n";
  write_folder(dir, model.str(), "");
  auto tok = mla::Tokenizer::load(dir.string());
  EXPECT_EQ(tok.vocab_size(), 513u);
  EXPECT_EQ(tok.encode("abab", false), (Ids{300, 300}));
  EXPECT_EQ(tok.token_bytes(300), "ab");
  EXPECT_FALSE(tok.is_special(300));
  EXPECT_EQ(tok.token_text(257), "<|reserved_token_257|>");
  EXPECT_EQ(tok.token_text(512), "<|reserved_token_512|>");
  fs::remove_all(dir);
}

}  // namespace
