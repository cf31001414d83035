#include "lockstep/serve/model_config.h"
#include "targets.h"

namespace lockstep::fuzz {

void model_config_input(const uint8_t* data, size_t size) {
  const std::string path = input_path("convnet/config.pbtxt");
  const std::string text(reinterpret_cast<const char*>(data), size);
  expect_clean_outcome(path, [&] {
    const serve::ModelConfig config = serve::parse_model_config(text, path, "convnet");
    // What is accepted is within the bounds the server relies on when it loads the model.
    // (max_batch_size 0, no batch dimension, is Triton's PyTorch backend's alone.)
    const int64_t least_batch = config.format == serve::ModelFormat::kTorchScript ? 0 : 1;
    if (config.max_batch_size < least_batch || config.instance_count < 1 || config.instance_count > serve::kMaxInstances)
      throw Violation(path + ": accepted max_batch_size " + std::to_string(config.max_batch_size) +
                      " and instance count " + std::to_string(config.instance_count));
  });
}

}  // namespace lockstep::fuzz
