#pragma once
// The generated Unicode tables (scripts/unicode_tables.mjs writes src/data/unicode_*.cpp); read
// through lockstep/data/unicode.h.

#include <cstddef>
#include <cstdint>

namespace lockstep::data::unicode_tables {

// Code points [first, next run's first) all have `bits` (CategoryBits in unicode.h).
struct CategoryRun {
  uint32_t first;
  uint8_t bits;
};
// A code point and what it maps to, as UTF-8. Sorted by code point.
struct Mapping {
  uint32_t code_point;
  const char* utf8;
};

extern const CategoryRun kCategoryRuns[];
extern const size_t kCategoryRunCount;
extern const Mapping kLowercase[];
extern const size_t kLowercaseCount;
extern const Mapping kStripAccents[];
extern const size_t kStripAccentsCount;

}  // namespace lockstep::data::unicode_tables
