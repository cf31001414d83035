#pragma once

#include <ATen/core/ivalue.h>

#include <vector>

namespace lockstep {

// torch.save for what lockstep writes: the bytes of a file holding `value` (dicts, lists, strings,
// numbers and tensors) that Python's torch.load reads with its default weights_only=True, and
// torch_load reads back. See Note [Files torch.load reads with weights_only].
std::vector<char> torch_save(const c10::IValue& value);

}  // namespace lockstep
