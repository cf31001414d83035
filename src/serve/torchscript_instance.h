#pragma once
// A TorchScript model.pt as one instance of a served model, run as Triton's PyTorch backend runs
// it. Private to src/serve (model_repository.cpp).

#include <string>

#include "lockstep/serve/batcher.h"
#include "lockstep/serve/model_config.h"

namespace lockstep::serve {

// Note [TorchScript inputs and outputs]
// A TorchScript module names neither its inputs nor its outputs, so config.pbtxt's names say which
// is which, by the rules of Triton's PyTorch backend:
//   inputs  - when every input is named after an argument of forward (`image`, `features`), by
//             that name; else when every name ends in `__<k>` (INPUT__0, INPUT__1), as forward's
//             argument k; else in the config's order.
//   outputs - forward returns a tensor, or a tuple or list of tensors; when every output's name
//             ends in `__<k>` (OUTPUT__0), it is element k; else they are the elements in order.
// Each input is a tensor of its data_type (TYPE_INT64: int64, for an embedding's indices). The
// module is checked when it loads: forward's arguments must be the config's inputs, each typed
// Tensor; then one forward of zero inputs (model_repository.cpp) shows that it takes the declared
// types and returns the declared outputs. Every error names the file, forward's signature and what
// the config declares.

// Loads `file` (torch.jit.save of a scripted or traced module) for `config`, in eval mode; the
// instance runs forward under InferenceMode. Throws c10::Error naming the file and the mismatch.
Batcher::Instance torchscript_instance(const ModelConfig& config, const std::string& file);

}  // namespace lockstep::serve
