#pragma once

#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <torch/nn/modules/container/any.h>
#include <torch/types.h>

#include <memory>

#include "lockstep/data/dataset.h"
#include "lockstep/dist/process_group.h"

namespace lockstep::infer {

struct PredictorOptions {
  // Run the forward under autocast to this half dtype (kBFloat16 on CPU); unset: fp32. Logits are
  // returned in fp32 either way.
  TORCH_ARG(c10::optional<torch::ScalarType>, autocast) = c10::nullopt;
  TORCH_ARG(int64_t, batch_size) = 200;  // evaluate(): samples per forward
  // Keep the model's 4-D parameters (convolution weights) in channels-last memory, as Python's
  // `model.to(memory_format=torch.channels_last)`: see Note [Channels-last weights for inference].
  TORCH_ARG(bool, channels_last) = true;
};

// A trained model for inference: eval mode (BatchNorm uses its running statistics, dropout is off),
// no autograd, the chosen precision. The exporter and the server use it; so does evaluation. The
// model is the caller's: eval mode and, by default, the weights' channels-last layout stay on it.
//
//   auto model = lockstep::models::make_model("convnet");
//   lockstep::models::load_state_dict_file(*model, "model.pt");
//   lockstep::infer::Predictor predictor(torch::nn::AnyModule(model));
//   torch::Tensor classes = predictor.predict(images);   // images (B, 1, 28, 28) -> (B) int64
class Predictor {
 public:
  explicit Predictor(torch::nn::AnyModule model, PredictorOptions options = {});

  // input (B, ...) fp32 -> logits (B, classes) fp32.
  torch::Tensor forward(const torch::Tensor& input);
  // input (B, ...) -> the most likely class of each sample, (B) int64.
  torch::Tensor predict(const torch::Tensor& input);
  // The fraction of `dataset` predicted correctly (see train::evaluate; with a group each rank
  // scores its share).
  double evaluate(const data::Dataset& dataset, dist::ProcessGroup* group = nullptr);

  torch::nn::Module& module() { return *module_; }

 private:
  torch::nn::AnyModule model_;
  std::shared_ptr<torch::nn::Module> module_;
  torch::Tensor first_parameter_;  // where the model is: inputs go to its device
  PredictorOptions options_;
};

}  // namespace lockstep::infer
