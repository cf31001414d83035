#pragma once
// The 64-bit FNV-1a hash: the same on every host and build (std::hash is neither), for ids and
// fingerprints that are compared across processes and machines.

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace lockstep {

inline uint64_t fnv1a64(std::string_view bytes) {
  uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a's offset basis and prime
  for (const char c : bytes) hash = (hash ^ static_cast<uint8_t>(c)) * 0x100000001b3ULL;
  return hash;
}

// fnv1a64 as 16 lowercase hex digits.
inline std::string fnv1a64_hex(std::string_view bytes) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(fnv1a64(bytes)));
  return hex;
}

}  // namespace lockstep
