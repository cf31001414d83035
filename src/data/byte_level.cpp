#include "lockstep/data/byte_level.h"

#include <array>

#include "lockstep/data/unicode.h"

namespace lockstep::data::byte_level {

namespace {

struct Alphabet {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 512> to_byte{};  // indexed by code point; every alphabet character is < U+0144
};

const Alphabet& alphabet() {
  static const Alphabet a = [] {
    Alphabet t;
    t.to_byte.fill(-1);
    char32_t next_unprintable = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t.to_char[b] = printable ? static_cast<char32_t>(b) : next_unprintable++;
      t.to_byte[t.to_char[b]] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return a;
}

}  // namespace

char32_t byte_to_char(uint8_t byte) { return alphabet().to_char[byte]; }

std::optional<uint8_t> char_to_byte(char32_t c) {
  if (c >= alphabet().to_byte.size() || alphabet().to_byte[c] < 0) return std::nullopt;
  return static_cast<uint8_t>(alphabet().to_byte[c]);
}

std::string to_symbols(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char b : bytes) unicode::append_utf8(out, byte_to_char(static_cast<uint8_t>(b)));
  return out;
}

std::optional<std::string> to_bytes(std::string_view symbols) {
  std::string out;
  out.reserve(symbols.size());
  for (size_t pos = 0; pos < symbols.size();) {
    const auto byte = char_to_byte(unicode::next_code_point(symbols, pos));
    if (!byte) return std::nullopt;
    out += static_cast<char>(*byte);
  }
  return out;
}

}  // namespace lockstep::data::byte_level
