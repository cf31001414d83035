#pragma once
// What a yaml-cpp exception says, for the readers of YAML files (accelerate configs, bench
// matrices). Private to src/: the library's headers do not expose yaml-cpp.

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/exceptions.h>

#include <string>

namespace lockstep {

// e.msg, except for yaml-cpp's nesting limit: its DepthGuard (2000 steps of its recursive parser,
// about 500 nested collections) throws with the message "bad file", which names neither the cause
// nor the fix.
inline std::string yaml_error_text(const YAML::Exception& e) {
  if (dynamic_cast<const YAML::DeepRecursion*>(&e) != nullptr)
    return "collections nested deeper than yaml-cpp reads (about 500 levels); a config nests a few";
  return e.msg;
}

}  // namespace lockstep
