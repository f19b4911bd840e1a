// Small UTF-8 helpers shared by the tokenizer and the chat-template interpreter, and the GPT-2
// byte <-> character table of byte-level BPE.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace mla::utf8 {

// Appends the UTF-8 encoding of code point cp (must be a valid scalar value).
void append(std::string& out, uint32_t cp);

// Length of the well-formed UTF-8 sequence starting at s[i], or 0 if the bytes there are
// ill-formed. On 0, *bad_len receives the length of the maximal ill-formed subpart (>= 1).
size_t sequence_length(std::string_view s, size_t i, size_t* bad_len);

// Decodes the well-formed sequence of length len at s[i].
uint32_t decode_at(std::string_view s, size_t i, size_t len);

// Length of the longest prefix of s that does not end inside an incomplete (but so far valid)
// multi-byte sequence: a trailing 1..3 byte start of a character is excluded.
size_t complete_prefix_length(std::string_view s);

bool is_valid(std::string_view s);

// GPT-2 byte-level alphabet: byte b is written as the character byte_to_char()[b].
const std::array<uint32_t, 256>& byte_to_char();
// Inverse: code point -> byte, or -1 if the character is not part of the alphabet.
int char_to_byte(uint32_t cp);
// The bytes a token written in that alphabet stands for ("Ġthe" -> " the"); false (bytes
// unspecified) when the text is not valid UTF-8 or has a character outside the alphabet.
bool byte_level_decode(std::string_view text, std::string* bytes);

}  // namespace mla::utf8
