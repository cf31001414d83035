#pragma once

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <string>
#include <vector>

namespace lockstep {

// Closed sets of values (precisions, strategies, optimizers, ...) are enums whose names are listed
// once, in the enum's order, by a function next to the enum; the CLI's checks and help, option
// validation and error messages all read that one list through these two helpers.

// The value named `name`, or a c10::ValueError: "unknown <what> '<name>'; choose a, b, c".
template <typename Enum>
Enum enum_from_name(const std::vector<std::string>& names, const std::string& name, const char* what) {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<Enum>(i);
  TORCH_CHECK_VALUE(false, "unknown ", what, " '", name, "'; choose ", c10::Join(", ", names));
}

template <typename Enum>
const std::string& enum_name(const std::vector<std::string>& names, Enum value) {
  return names.at(static_cast<size_t>(value));
}

}  // namespace lockstep
