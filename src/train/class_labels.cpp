#include "class_labels.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

namespace lockstep::train {

int64_t first_bad_label(const torch::Tensor& target, int64_t classes) {
  if (!target.defined() || target.dim() != 1 || !c10::isIntegralType(target.scalar_type(), /*includeBool=*/false))
    return -1;
  const torch::Tensor bad = ((target < 0) & (target != kCrossEntropyIgnoreIndex)) | (target >= classes);
  if (!bad.any().item<bool>()) return -1;
  return bad.to(torch::kInt).argmax().item<int64_t>();  // argmax: the first of the largest (1)
}

std::string bad_label_message(int64_t sample, int64_t label, int64_t classes, const std::string& split) {
  const std::string fix = label < 0 ? c10::str("class indices start at 0 (", kCrossEntropyIgnoreIndex,
                                               ", cross_entropy's ignore_index, skips a sample): correct the label")
                                    : c10::str("correct the label, or give the model's last layer ", label + 1,
                                               " or more outputs");
  return c10::str("sample ", sample, " of the ", split, " split has label ", label, ", but the model outputs ", classes,
                  " classes (labels 0 to ", classes - 1, "): ", fix);
}

void check_labels(const torch::Tensor& target, int64_t classes, const std::vector<int64_t>& indices,
                  const std::string& split, const std::string& prefix, const std::string& suffix) {
  const int64_t row = first_bad_label(target, classes);
  if (row < 0) return;
  TORCH_CHECK_VALUE(false, prefix, bad_label_message(indices.at(row), target[row].item<int64_t>(), classes, split),
                    suffix);
}

}  // namespace lockstep::train
