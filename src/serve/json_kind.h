#pragma once
// How a tensor datatype's values are written in KServe v2 JSON. Private to src/serve
// (http_protocol.cpp reads requests with it, http_response.cpp writes responses).

#include <c10/core/ScalarType.h>

namespace lockstep::serve {

enum class JsonKind { kNumber, kInteger, kBoolean };

inline JsonKind json_kind(c10::ScalarType type) {
  if (type == c10::kBool) return JsonKind::kBoolean;
  return c10::isIntegralType(type, /*includeBool=*/false) ? JsonKind::kInteger : JsonKind::kNumber;
}

}  // namespace lockstep::serve
