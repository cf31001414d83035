// TrainerOptions' checks and defaults (the loop is trainer.cpp).
#include <torch/torch.h>

#include "class_labels.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train {

// See Note [Naming the sample behind a bad label]: LibTorch's own check names neither the row nor
// the class count (and is a device-side assert on CUDA).
torch::Tensor cross_entropy_loss(const torch::Tensor& output, const torch::Tensor& target) {
  if (output.dim() == 2) {
    const int64_t classes = output.size(1), row = first_bad_label(target, classes);
    TORCH_CHECK_INDEX(row < 0, "cross_entropy_loss: label ", target[row].item<int64_t>(), " in row ", row,
                      " of the batch is not a class of the model's ", classes, " outputs (labels 0 to ", classes - 1,
                      ")");
  }
  return torch::nn::functional::cross_entropy(output, target);
}

void TrainerOptions::validate() const {
  TORCH_CHECK_VALUE(epochs() >= 1, "TrainerOptions: epochs=", epochs(), " must be at least 1");
  TORCH_CHECK_VALUE(batch_size() >= 1, "TrainerOptions: batch_size=", batch_size(), " must be at least 1");
  TORCH_CHECK_VALUE(accum_steps() >= 1, "TrainerOptions: accum_steps=", accum_steps(), " must be at least 1");
  TORCH_CHECK_VALUE(eval_batch_size() >= 1, "TrainerOptions: eval_batch_size=", eval_batch_size(),
                    " must be at least 1");
  TORCH_CHECK_VALUE(max_skipped_steps() >= 1, "TrainerOptions: max_skipped_steps=", max_skipped_steps(),
                    " must be at least 1");
  TORCH_CHECK_VALUE(log_every() >= 1, "TrainerOptions: log_every=", log_every(), " must be at least 1");
  loader().validate();
  TORCH_CHECK_VALUE(static_cast<bool>(loss()), "TrainerOptions: no loss function; set loss (default: cross_entropy_loss)");
  const CheckpointerOptions& c = checkpoint();
  TORCH_CHECK_VALUE(c.save_every() >= 0 && c.keep_last() >= 0, "CheckpointerOptions: save_every=", c.save_every(),
                    " and keep_last=", c.keep_last(), " must be >= 0 (0: at epoch ends only; 0: keep all)");
  TORCH_CHECK_VALUE(!c.dir().empty() || (c.save_every() == 0 && c.keep_last() == 0 && c.resume() != "latest" &&
                                         c.format() == CheckpointFormat::kFull),
                    "CheckpointerOptions: save_every, keep_last, resume \"latest\" and the sharded format need dir ",
                    "(where the checkpoints go); set dir");
  if (c.format() == CheckpointFormat::kSharded && !make_strategy()) {
    TORCH_CHECK_VALUE(strategy() && parallel::has_sharded_state(*strategy()),
                      "CheckpointerOptions: format sharded with strategy ",
                      strategy() ? parallel::to_string(*strategy()) : "unset (ddp or local)",
                      ": every rank of that strategy holds the whole model, so there are no shards to write; use ",
                      "fsdp, zero1 or zero2, or the full format");
  }
}

}  // namespace lockstep::train
