// Unicode normalization through ICU's unorm2 C API: UTF-8 -> UTF-16 -> normalized -> UTF-8.
#include "tokenizer/normalizer.h"

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <climits>
#include <stdexcept>
#include <vector>

namespace mla {

namespace {

const UNormalizer2* instance(NormalForm form, UErrorCode* status) {
  switch (form) {
    case NormalForm::NFC: return unorm2_getNFCInstance(status);
    case NormalForm::NFD: return unorm2_getNFDInstance(status);
    case NormalForm::NFKC: return unorm2_getNFKCInstance(status);
    case NormalForm::NFKD: return unorm2_getNFKDInstance(status);
  }
  return nullptr;
}

[[noreturn]] void fail(const char* step, UErrorCode status) {
  throw std::runtime_error(std::string("Unicode normalization: ") + step + " failed: " + u_errorName(status));
}

}  // namespace

std::string normalize_unicode(std::string_view text, NormalForm form) {
  bool ascii = true;  // ASCII is unchanged by all four forms
  for (char c : text) ascii &= static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(text);
  if (text.size() > INT32_MAX / 4) throw std::runtime_error("Unicode normalization: text too long");
  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* normalizer = instance(form, &status);
  if (U_FAILURE(status) || !normalizer) fail("loading the normalizer", status);

  int32_t length = 0;
  status = U_ZERO_ERROR;
  u_strFromUTF8(nullptr, 0, &length, text.data(), static_cast<int32_t>(text.size()), &status);
  if (status != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(status)) fail("UTF-8 decoding", status);
  std::vector<UChar> utf16(static_cast<size_t>(length) + 1);
  status = U_ZERO_ERROR;
  u_strFromUTF8(utf16.data(), length + 1, &length, text.data(), static_cast<int32_t>(text.size()), &status);
  if (U_FAILURE(status)) fail("UTF-8 decoding", status);
  status = U_ZERO_ERROR;  // most text is already normalized
  if (unorm2_isNormalized(normalizer, utf16.data(), length, &status) && U_SUCCESS(status)) return std::string(text);

  // Normalization can lengthen the text (NFKC of U+FDFA is 18 code units); retry on overflow.
  std::vector<UChar> out(static_cast<size_t>(length) * 2 + 16);
  int32_t out_length = 0;
  for (;;) {
    status = U_ZERO_ERROR;
    out_length = unorm2_normalize(normalizer, utf16.data(), length, out.data(), static_cast<int32_t>(out.size()), &status);
    if (status == U_BUFFER_OVERFLOW_ERROR) {
      out.resize(static_cast<size_t>(out_length) + 1);
      continue;
    }
    if (U_FAILURE(status)) fail("normalizing", status);
    break;
  }
  std::string result;
  int32_t bytes = 0;
  status = U_ZERO_ERROR;
  u_strToUTF8(nullptr, 0, &bytes, out.data(), out_length, &status);
  if (status != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(status)) fail("UTF-8 encoding", status);
  result.resize(static_cast<size_t>(bytes));
  status = U_ZERO_ERROR;
  u_strToUTF8(result.data(), bytes, &bytes, out.data(), out_length, &status);
  if (U_FAILURE(status) && status != U_STRING_NOT_TERMINATED_WARNING) fail("UTF-8 encoding", status);
  return result;
}

}  // namespace mla
