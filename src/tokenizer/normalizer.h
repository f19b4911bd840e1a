// Unicode normalization forms (NFC, NFD, NFKC, NFKD) for tokenizer.json normalizers, via ICU.
#pragma once

#include <string>
#include <string_view>

namespace mla {

enum class NormalForm { NFC, NFD, NFKC, NFKD };

// Returns `text` (valid UTF-8) in the given normalization form. Throws std::runtime_error if ICU
// reports a failure.
std::string normalize_unicode(std::string_view text, NormalForm form);

}  // namespace mla
