#pragma once
// Reading the dicts of torch.save files and state dicts (c10::impl::GenericDict of IValues) with
// errors that name where the dict came from.

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <string>

namespace lockstep {

// An empty dict of string keys to any values, as Python's state_dict() dicts are.
inline c10::impl::GenericDict string_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

// The entry `key` of `dict`; when missing, an error: "<where> has no '<key>' entry<missing_means>".
inline c10::IValue dict_entry(const c10::impl::GenericDict& dict, const std::string& key, const std::string& where,
                              const char* missing_means = "") {
  auto it = dict.find(key);
  TORCH_CHECK(it != dict.end(), where, " has no '", key, "' entry", missing_means);
  return it->value();
}

// `v` as a dict, or an error naming `where` and what `v` is instead.
inline c10::impl::GenericDict as_dict(const c10::IValue& v, const std::string& where) {
  TORCH_CHECK(v.isGenericDict(), where, " is not a dict but a ", v.tagKind());
  return v.toGenericDict();
}

}  // namespace lockstep
