#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep {

// torch.load for LibTorch: the value in a file that Python's torch.save (any pickle_protocol from
// 2 to 5) or torch::pickle_save wrote, including the OrderedDict that model.state_dict() is, which
// LibTorch's own torch::pickle_load rejects (see Note [OrderedDict in LibTorch's unpickler] and
// Note [Pickle protocols 3, 4 and 5]). The pickle is checked before LibTorch's unpickler sees it,
// since that trusts it (a flipped byte could crash it); every storage record must hold exactly the
// bytes its storage needs, checked before it is read (Note [Storage sizes come from the pickle]).
// Throws c10::Error saying what is wrong; errors from LibTorch pass through as c10::Error or
// std::exception. Callers add the file's name.
c10::IValue torch_load(const std::vector<char>& bytes);

namespace detail {
// A storage a pickle's persistent id describes: ('storage', torch.<type>, key, location, numel).
struct StorageClaim {
  std::string key;   // its record is ARCHIVE/data/<key>
  std::string type;  // the storage class, "FloatStorage"
  uint64_t numel;    // elements of `type`
  uint64_t bytes;    // numel x the element size: what torch.save writes as the record
};

struct CheckedPickle {
  std::vector<char> pickle;            // the stream for LibTorch's unpickler
  std::vector<StorageClaim> storages;  // each (key, bytes) once, in the order the stream names them
};

// The check and rewrite of a pickle (data.pkl) that torch_load runs before LibTorch's unpickler:
// see Note [OrderedDict in LibTorch's unpickler], Note [Pickle nesting depth] and Note [Pickle
// protocols 3, 4 and 5]. Throws c10::Error naming the byte, the opcode and the protocol of the
// first thing it refuses.
CheckedPickle check_and_rewrite_pickle(std::vector<char> pickle);
}  // namespace detail

}  // namespace lockstep
