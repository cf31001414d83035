#pragma once

#include <ATen/core/ivalue.h>

#include <vector>

namespace lockstep {

// torch.load for LibTorch 1.13: the value in a file that Python's torch.save (or
// torch::pickle_save) wrote, including the OrderedDict that model.state_dict() is, which LibTorch's
// own torch::pickle_load rejects (see Note [OrderedDict in LibTorch's unpickler]). The pickle is
// checked before LibTorch's unpickler sees it, since that trusts it (a flipped byte could crash
// it), and every tensor's storage is checked against the record holding its bytes. Throws c10::Error saying what is wrong; errors from LibTorch pass through as c10::Error or
// std::exception. Callers add the file's name.
c10::IValue torch_load(const std::vector<char>& bytes);

namespace detail {
// The check and rewrite of a pickle (data.pkl) that torch_load runs before LibTorch's unpickler:
// see Note [OrderedDict in LibTorch's unpickler] and Note [Pickle nesting depth]. Returns the
// rewritten stream; throws c10::Error naming the offset of the first opcode that is malformed.
std::vector<char> check_and_rewrite_pickle(std::vector<char> pickle);
}  // namespace detail

}  // namespace lockstep
