// `lockstep train`: trains a reference model and prints one JSON summary line last.
#include <c10/util/StringUtil.h>

#include <iostream>
#include <memory>

#include "commands.h"
#include "lockstep/core/process.h"
#include "lockstep/models/zoo.h"
#include "lockstep/train/trainer.h"

namespace lockstep::cli {

Command add_train_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("train", "Train a reference model; prints one JSON summary line last");
  cmd->option_defaults()->always_capture_default();
  auto o = std::make_shared<train::TrainOptions>();
  auto quiet = std::make_shared<bool>(false);

  const auto& models = models::model_names();
  cmd->add_option("--model", o->model(), "Reference model: " + c10::Join(", ", models))
      ->check(CLI::IsMember(models));
  cmd->add_option("--data", o->data(), "Dataset: fashion-mnist or synthetic (seeded random images)")
      ->check(CLI::IsMember({"fashion-mnist", "synthetic"}));
  cmd->add_option("--data-dir", o->data_dir(), "Directory with the Fashion-MNIST IDX files");
  cmd->add_option("--limit", o->limit(), "Use only the first N training samples (0: all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--epochs", o->epochs(), "Epochs to train")->check(CLI::PositiveNumber);
  cmd->add_option("--batch-size", o->batch_size(), "Samples per step, per process")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--lr", o->lr(), "SGD learning rate")->check(CLI::NonNegativeNumber);
  cmd->add_option("--momentum", o->momentum(), "SGD momentum")->check(CLI::NonNegativeNumber);
  cmd->add_option("--weight-decay", o->weight_decay(), "SGD weight decay (L2)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", o->seed(), "Seed for initialisation and data order");
  cmd->add_option("--threads", o->threads(),
                  "Intra-op threads (0: cores / LOCAL_WORLD_SIZE, here " +
                      std::to_string(default_intra_op_threads()) + ")")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--save-model", o->save_model(),
                  "Write the final state dict here (readable by Python's torch.load)");
  cmd->add_flag("--quiet", *quiet, "No progress display (the JSON summary is still printed)");

  return {cmd, [o, quiet] {
            auto result = train::train(o->progress(!*quiet));
            if (result.rank == 0) std::cout << result.summary_json() << std::endl;
            return 0;
          }};
}

}  // namespace lockstep::cli
