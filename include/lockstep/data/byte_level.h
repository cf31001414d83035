#pragma once
// GPT-2's byte-level alphabet: every byte 0-255 stands for one printable code point, so that a
// byte-level BPE vocabulary is made of ordinary strings (a space is 'Ġ' U+0120, a newline 'Ċ'
// U+010A). Bytes that are printable Latin-1 ('!'-'~', '¡'-'¬', '®'-'ÿ') stand for themselves; the
// other 68 take U+0100, U+0101, ... in byte order. Hugging Face's ByteLevel pre-tokenizer and
// decoder use the same map.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace lockstep::data::byte_level {

char32_t byte_to_char(uint8_t byte);
std::optional<uint8_t> char_to_byte(char32_t c);

// Each byte of `bytes` as its alphabet character, in UTF-8.
std::string to_symbols(std::string_view bytes);
// The inverse; nullopt when `symbols` holds a character outside the alphabet.
std::optional<std::string> to_bytes(std::string_view symbols);

}  // namespace lockstep::data::byte_level
