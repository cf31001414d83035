#pragma once
// Checks of class-index targets that name the sample (internal to src/train).
//
// Note [Naming the sample behind a bad label]
// A label the model has no class for reaches LibTorch's nll_loss as "Target 7 is out of bounds."
// (on CUDA, a device-side assert), naming neither the sample nor the class count. The library's
// cross_entropy_loss checks its labels first and names the row of the batch; the Trainer and
// evaluate(), which know which samples a batch holds, name the sample by its index in its split:
// the Trainer when the step's loss fails (any loss: it scans the step's targets against the class
// count of the output the loss was given), evaluate() before it counts an answer.

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::train {

// PyTorch's ignore_index default: cross_entropy skips such rows, so they are no bad label.
constexpr int64_t kCrossEntropyIgnoreIndex = -100;

// The first row of `target` whose label is not a class of a `classes`-way output: outside
// [0, classes) and not kCrossEntropyIgnoreIndex. -1 when every label is one, or when `target` is
// not class indices (an integral (B) tensor): nothing else is checked.
int64_t first_bad_label(const torch::Tensor& target, int64_t classes);

// "sample 13 of the training split has label 7, but the model outputs 3 classes (labels 0 to
// 2): ..." with the fix. `split`: "training" or "held-out".
std::string bad_label_message(int64_t sample, int64_t label, int64_t classes, const std::string& split);

// Throws c10::ValueError with bad_label_message() for the first bad label of `target`, whose
// rows are the samples `indices` of `split`, between `prefix` ("rank 1: ") and `suffix`; returns
// when there is none.
void check_labels(const torch::Tensor& target, int64_t classes, const std::vector<int64_t>& indices,
                  const std::string& split, const std::string& prefix = "", const std::string& suffix = "");

}  // namespace lockstep::train
