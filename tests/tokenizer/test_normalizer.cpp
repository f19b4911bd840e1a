// Unicode normalization: normalize_unicode on hand-checked strings (composed and decomposed é,
// Hangul syllables, canonical reordering, singletons, composition exclusions, compatibility
// characters such as the ﬁ ligature) and the NFC / NFKC normalizers of tokenizer.json.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "tokenizer/normalizer.h"
#include "tokenizer/tokenizer.h"

namespace {

using mla::NormalForm;
using mla::normalize_unicode;
namespace fs = std::filesystem;

TEST(TokenizerNormalizer, CanonicalForms) {
  const std::string e_acute = "\xC3\xA9";     // U+00E9
  const std::string e_combining = "e\xCC\x81";  // e + U+0301
  EXPECT_EQ(normalize_unicode(e_combining, NormalForm::NFC), e_acute);
  EXPECT_EQ(normalize_unicode(e_acute, NormalForm::NFD), e_combining);
  EXPECT_EQ(normalize_unicode(e_acute, NormalForm::NFC), e_acute);
  EXPECT_EQ(normalize_unicode("caf" + e_combining + "!", NormalForm::NFC), "caf" + e_acute + "!");
  // Hangul: 각 (U+AC01) = ᄀ (U+1100) + ᅡ (U+1161) + ᆨ (U+11A8), composed arithmetically.
  const std::string gak = "\xEA\xB0\x81";
  const std::string gak_jamo = "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8";
  EXPECT_EQ(normalize_unicode(gak_jamo, NormalForm::NFC), gak);
  EXPECT_EQ(normalize_unicode(gak, NormalForm::NFD), gak_jamo);
  // Canonical ordering: q + U+0307 (ccc 230) + U+0323 (ccc 220) -> q + U+0323 + U+0307; no
  // precomposed q with either mark exists.
  EXPECT_EQ(normalize_unicode("q\xCC\x87\xCC\xA3", NormalForm::NFC), "q\xCC\xA3\xCC\x87");
  // Singletons: OHM SIGN U+2126 -> GREEK CAPITAL OMEGA U+03A9; ANGSTROM SIGN U+212B -> U+00C5.
  EXPECT_EQ(normalize_unicode("\xE2\x84\xA6", NormalForm::NFC), "\xCE\xA9");
  EXPECT_EQ(normalize_unicode("\xE2\x84\xAB", NormalForm::NFC), "\xC3\x85");
  // Composition exclusion: DEVANAGARI LETTER QA U+0958 stays decomposed as U+0915 U+093C.
  EXPECT_EQ(normalize_unicode("\xE0\xA5\x98", NormalForm::NFC), "\xE0\xA4\x95\xE0\xA4\xBC");
  // Compatibility characters are left alone by NFC.
  EXPECT_EQ(normalize_unicode("\xEF\xAC\x81", NormalForm::NFC), "\xEF\xAC\x81");  // ﬁ
  EXPECT_EQ(normalize_unicode("", NormalForm::NFC), "");
  EXPECT_EQ(normalize_unicode("plain ASCII", NormalForm::NFKC), "plain ASCII");
}

TEST(TokenizerNormalizer, CompatibilityForms) {
  EXPECT_EQ(normalize_unicode("\xEF\xAC\x81", NormalForm::NFKC), "fi");           // ﬁ U+FB01
  EXPECT_EQ(normalize_unicode("\xE2\x91\xA0", NormalForm::NFKC), "1");            // ① U+2460
  EXPECT_EQ(normalize_unicode("\xEF\xBC\xA1\xEF\xBC\x91", NormalForm::NFKC), "A1");  // fullwidth Ａ１
  EXPECT_EQ(normalize_unicode("x\xC2\xB2", NormalForm::NFKC), "x2");             // superscript two
  // NFKC composes after the compatibility decomposition; NFKD does not.
  EXPECT_EQ(normalize_unicode("\xEF\xAC\x81" "e\xCC\x81", NormalForm::NFKC), "fi\xC3\xA9");
  EXPECT_EQ(normalize_unicode("\xEF\xAC\x81\xC3\xA9", NormalForm::NFKD), "fie\xCC\x81");
  // A long expansion: U+FDFA (one character) becomes 18 characters under NFKC.
  std::string expanded = normalize_unicode("\xEF\xB7\xBA", NormalForm::NFKC);
  EXPECT_EQ(expanded.size(), 33u);  // 15 Arabic letters of 2 bytes and 3 spaces
}

fs::path write_tokenizer(const std::string& name, const nlohmann::json& normalizer) {
  fs::path dir = fs::temp_directory_path() / ("mla_norm_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  mla::Tokenizer::write_byte_level_tokenizer(dir.string(), 600);
  nlohmann::json tj;
  std::ifstream(dir / "tokenizer.json") >> tj;
  tj["normalizer"] = normalizer;
  std::ofstream(dir / "tokenizer.json") << tj.dump();
  return dir;
}

TEST(TokenizerNormalizer, NfcAndNfkcInTokenizerJson) {
  const std::string e_acute = "\xC3\xA9", e_combining = "e\xCC\x81";
  auto dir = write_tokenizer("nfc", {{"type", "NFC"}});
  {
    auto tok = mla::Tokenizer::load(dir.string());
    EXPECT_EQ(tok.encode("caf" + e_combining, false), tok.encode("caf" + e_acute, false));
    EXPECT_EQ(tok.decode(tok.encode("caf" + e_combining, false)), "caf" + e_acute);
    EXPECT_EQ(tok.decode(tok.encode("\xEF\xAC\x81", false)), "\xEF\xAC\x81");  // ﬁ kept
    // Added tokens are matched on the raw text; the text around them is normalized.
    EXPECT_EQ(tok.decode(tok.encode("<｜User｜>" + e_combining, false)), "<｜User｜>" + e_acute);
  }
  fs::remove_all(dir);
  dir = write_tokenizer("nfkc", {{"type", "Sequence"}, {"normalizers", {{{"type", "NFKC"}}}}});
  {
    auto tok = mla::Tokenizer::load(dir.string());
    EXPECT_EQ(tok.encode("\xEF\xAC\x81nd", false), tok.encode("find", false));
    EXPECT_EQ(tok.decode(tok.encode("\xEF\xAC\x81nd \xE2\x91\xA0", false)), "find 1");
  }
  fs::remove_all(dir);
}

}  // namespace
