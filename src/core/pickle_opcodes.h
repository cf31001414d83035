#pragma once
// Tables of the pickle format and of LibTorch's unpickler that the pickle walker
// (pickle_rewriter.cpp) names in its messages and checks storages against.

#include <cstddef>
#include <optional>
#include <string>

namespace lockstep::detail {

// The name Python's pickletools gives opcode `op` ("STACK_GLOBAL"); nullptr for a byte that is
// no opcode of protocols 0-5.
const char* pickle_opcode_name(unsigned char op);

// The element size in bytes of the storage class torch.`name` as torch.save names it in a
// persistent id ("FloatStorage" -> 4, "BFloat16Storage" -> 2); nullopt for a class LibTorch's
// unpickler does not read (its table is AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS).
std::optional<size_t> storage_element_size(const std::string& name);

}  // namespace lockstep::detail
