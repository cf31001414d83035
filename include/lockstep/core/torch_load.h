#pragma once

#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

namespace lockstep {

// The object in `bytes`, a file written by Python's torch.save (zip format) or by
// torch::pickle_save: what torch.load returns, as IValues (OrderedDict as a dict).
// Unlike torch::pickle_load it reads what Python's pickler writes for ordinary containers: a dict
// or list of one entry (SETITEM, APPEND) and OrderedDicts such as model.state_dict(), which
// LibTorch 1.13 cannot (Note [Reading Python's pickles] in torch_load.cpp). Throws c10::Error
// naming `source` and what could not be read.
c10::IValue torch_load(const std::vector<char>& bytes, const std::string& source);

}  // namespace lockstep
