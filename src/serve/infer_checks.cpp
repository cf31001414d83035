#include "infer_checks.h"

#include <c10/util/StringUtil.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>

#include "lockstep/serve/http_protocol.h"

namespace lockstep::serve {

void bad_request(const std::string& message) { throw HttpError(400, message); }

std::string shape_text(const std::vector<int64_t>& shape) { return "[" + c10::Join(", ", shape) + "]"; }

std::string names_text(const std::vector<TensorSpec>& specs) {
  std::vector<std::string> names;
  for (const TensorSpec& t : specs) names.push_back("'" + t.name + "'");
  return c10::Join(", ", names);
}

// "[-1, 1, 28, 28] with at most 8 samples" (-1: 1 to max_batch_size samples), or "[3, 8]"
// without a batch dimension.
void check_input_shape(const std::vector<int64_t>& dims, const TensorSpec& spec, const ModelConfig& config) {
  const bool batched = config.max_batch_size > 0;
  const bool fits = batched ? dims.size() == spec.dims.size() + 1 && dims[0] >= 1 && dims[0] <= config.max_batch_size &&
                                  std::equal(spec.dims.begin(), spec.dims.end(), dims.begin() + 1)
                            : dims == spec.dims;
  if (fits) return;
  const std::string shape = shape_text(request_shape(config, spec, -1));
  bad_request("input '" + spec.name + "' has shape " + shape_text(dims) + "; model '" + config.name + "' takes " +
              (batched ? shape + " with at most " + std::to_string(config.max_batch_size) + " samples" : shape));
}

size_t wire_bytes(const TensorSpec& spec, const std::vector<int64_t>& shape) {
  const c10::ScalarType type = scalar_type(spec.datatype);
  const c10::ScalarType stored = type == torch::kBool ? torch::kByte : type;  // one byte per BOOL
  return static_cast<size_t>(c10::multiply_integers(shape)) * c10::elementSize(stored);
}

torch::Tensor tensor_from_bytes(const char* data, size_t bytes, const TensorSpec& spec,
                                const std::vector<int64_t>& shape, const std::string& what) {
  const size_t expected = wire_bytes(spec, shape);
  if (bytes != expected)
    bad_request("input '" + spec.name + "' " + what + " does not match shape " + shape_text(shape) + " of " +
                spec.datatype + ", which is " + std::to_string(expected) + " bytes");
  const c10::ScalarType type = scalar_type(spec.datatype);
  const c10::ScalarType stored = type == torch::kBool ? torch::kByte : type;
  torch::Tensor t = torch::empty(shape, stored);
  std::memcpy(t.data_ptr(), data, bytes);
  return stored == type ? t : t.to(type);
}

void check_complete(const Tensors& inputs, const ModelConfig& config) {
  for (size_t i = 0; i < config.inputs.size(); ++i) {
    if (!inputs[i].defined())
      bad_request("the request lacks input '" + config.inputs[i].name + "'; model '" + config.name + "' takes " +
                  names_text(config.inputs));
    if (config.max_batch_size > 0 && inputs[i].size(0) != inputs[0].size(0))
      bad_request("input '" + config.inputs[i].name + "' has " + std::to_string(inputs[i].size(0)) +
                  " samples but input '" + config.inputs[0].name + "' has " + std::to_string(inputs[0].size(0)) +
                  "; every input of a request holds the same number of samples");
  }
}

}  // namespace lockstep::serve
