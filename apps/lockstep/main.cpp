// lockstep: the command-line tool. `lockstep train` trains a reference model.
// Exit codes: 0 success, 1 runtime failure (missing data, I/O), 2 bad command line.
#include <CLI/CLI.hpp>
#include <c10/util/StringUtil.h>

#include <iostream>

#include "lockstep/core/process.h"
#include "lockstep/models/zoo.h"
#include "lockstep/train/trainer.h"

namespace {

constexpr int kUsageError = 2;

void add_train_options(CLI::App& cmd, lockstep::train::TrainOptions& o) {
  const auto& models = lockstep::models::model_names();
  cmd.add_option("--model", o.model(), "Reference model: " + c10::Join(", ", models))
      ->check(CLI::IsMember(models));
  cmd.add_option("--data", o.data(), "Dataset: fashion-mnist or synthetic (seeded random images)")
      ->check(CLI::IsMember({"fashion-mnist", "synthetic"}));
  cmd.add_option("--data-dir", o.data_dir(), "Directory with the Fashion-MNIST IDX files");
  cmd.add_option("--limit", o.limit(), "Use only the first N training samples (0: all)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--epochs", o.epochs(), "Epochs to train")->check(CLI::PositiveNumber);
  cmd.add_option("--batch-size", o.batch_size(), "Samples per step, per process")
      ->check(CLI::PositiveNumber);
  cmd.add_option("--lr", o.lr(), "SGD learning rate")->check(CLI::NonNegativeNumber);
  cmd.add_option("--momentum", o.momentum(), "SGD momentum")->check(CLI::NonNegativeNumber);
  cmd.add_option("--weight-decay", o.weight_decay(), "SGD weight decay (L2)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--seed", o.seed(), "Seed for initialisation and data order");
  cmd.add_option("--threads", o.threads(),
                 "Intra-op threads (0: cores / LOCAL_WORLD_SIZE, here " +
                     std::to_string(lockstep::default_intra_op_threads()) + ")")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--save-model", o.save_model(),
                 "Write the final state dict here (readable by Python's torch.load)");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lockstep: distributed and mixed-precision training for LibTorch"};
  app.set_version_flag("--version", "lockstep 0.1.0");
  app.require_subcommand(0, 1);
  app.option_defaults()->always_capture_default();

  lockstep::train::TrainOptions train_options;
  CLI::App* train_cmd = app.add_subcommand(
      "train", "Train a reference model; prints one JSON summary line last");
  train_cmd->option_defaults()->always_capture_default();
  add_train_options(*train_cmd, train_options);
  bool quiet = false;
  train_cmd->add_flag("--quiet", quiet, "No progress display (the JSON summary is still printed)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, or the error with a hint
    return code == 0 ? 0 : kUsageError;
  }

  if (app.get_subcommands().empty()) {
    std::cerr << "lockstep: a subcommand is required (train)\n" << app.help();
    return kUsageError;
  }
  try {
    if (*train_cmd) {
      auto result = lockstep::train::train(train_options.progress(!quiet));
      std::cout << result.summary_json() << std::endl;
    }
    return 0;
  } catch (const c10::ValueError& e) {
    std::cerr << "lockstep: error: " << e.what_without_backtrace() << "\n";
    return kUsageError;
  } catch (const c10::Error& e) {
    std::cerr << "lockstep: error: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "lockstep: error: " << e.what() << "\n";
    return 1;
  }
}
