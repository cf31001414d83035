#include "lockstep/train/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include <signal.h>
#include <unistd.h>

#include "../test_util.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/core/torch_load.h"
#include "lockstep/core/torch_save.h"
#include "lockstep/models/state_dict.h"
#include "lockstep/models/zoo.h"
#include "lockstep/optim/state_dict.h"

namespace lockstep::train {
namespace {

using ::testing::HasSubstr;

// An SGD optimizer over a small model that has taken two steps, so it holds momentum buffers.
struct Trained {
  std::shared_ptr<models::Classifier> model = models::make_model("mlp");
  torch::optim::SGD optimizer{model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-4)};
  Trained() {
    torch::manual_seed(0);
    for (int i = 0; i < 2; ++i) {
      optimizer.zero_grad();
      model->forward(torch::randn({4, 1, 28, 28})).square().mean().backward();
      optimizer.step();
    }
  }
};

Checkpoint sample_checkpoint(Trained& t) {
  Checkpoint c;
  c.position.epoch = 1;
  c.position.micro_batch = 7;
  c.position.step = 19;
  c.position.skipped_steps = 2;
  c.position.epoch_loss_sum = 3.25;
  c.position.epoch_steps = 6;
  c.run.insert("model", std::string("mlp"));
  c.run.insert("world_size", int64_t{2});
  c.run.insert("seed", int64_t{1});
  c.model = models::state_dict_to_dict(*t.model);
  c.optimizer = optim::optimizer_state_dict(t.optimizer);
  c.rng = {torch::arange(5, torch::kUInt8), torch::arange(3, torch::kUInt8)};
  return c;
}

TEST(Checkpoint, RoundTripRestoresPositionModelOptimizerAndRng) {
  testing::TempDir dir;
  Trained a;
  save_checkpoint(sample_checkpoint(a), dir / "c.pt");
  Checkpoint c = load_checkpoint(dir / "c.pt");
  EXPECT_EQ(c.position.epoch, 1);
  EXPECT_EQ(c.position.micro_batch, 7);
  EXPECT_EQ(c.position.step, 19);
  EXPECT_EQ(c.position.skipped_steps, 2);
  EXPECT_EQ(c.position.epoch_loss_sum, 3.25);
  EXPECT_EQ(c.position.epoch_steps, 6);
  ASSERT_EQ(c.rng.size(), 2u);
  EXPECT_TRUE(torch::equal(c.rng[1], torch::arange(3, torch::kUInt8)));

  // A different model and optimizer loaded from it continue exactly as the original.
  torch::manual_seed(5);
  auto fresh = models::make_model("mlp");
  torch::optim::SGD fresh_opt(fresh->parameters(), torch::optim::SGDOptions(0.5));
  models::load_state_dict(*fresh, c.model, "test");
  optim::load_optimizer_state_dict(fresh_opt, c.optimizer, "test");
  const auto& o = static_cast<torch::optim::SGDOptions&>(fresh_opt.param_groups()[0].options());
  EXPECT_EQ(o.lr(), 0.1);
  EXPECT_EQ(o.momentum(), 0.9);
  EXPECT_EQ(o.weight_decay(), 1e-4);
  const torch::Tensor x = torch::randn({4, 1, 28, 28});
  auto step = [&x](models::Classifier& model, torch::optim::SGD& opt) {
    opt.zero_grad();
    model.forward(x).square().mean().backward();
    opt.step();
  };
  step(*a.model, a.optimizer);
  step(*fresh, fresh_opt);
  auto pa = a.model->parameters(), pf = fresh->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pf[i])) << "parameter " << i;
}

TEST(Checkpoint, PythonTorchLoadReadsModelWeightsAndOptimizerLayout) {
  const std::string python = testing::python_with_torch();
  if (python.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  testing::TempDir dir;
  Trained a;
  save_checkpoint(sample_checkpoint(a), dir / "c.pt");
  auto r = testing::run_command(
      python + " -c \"import torch, json; c = torch.load('" + (dir / "c.pt") +
      "'); print(json.dumps({'keys': list(c['model'].keys()), 'fc1': c['model']['fc1.weight'].sum().item(),"
      " 'groups': len(c['optimizer']['param_groups']), 'lr': c['optimizer']['param_groups'][0]['lr'],"
      " 'buffers': len(c['optimizer']['state']), 'step': c['position']['step']}))\"");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(testing::last_json_line(r.output));
  EXPECT_EQ(j["keys"], nlohmann::json({"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
  EXPECT_NEAR(j["fc1"].get<double>(), a.model->named_parameters()["fc1.weight"].sum().item<double>(), 1e-3);
  EXPECT_EQ(j["groups"], 1);
  EXPECT_EQ(j["lr"], 0.1);
  EXPECT_EQ(j["buffers"], 4);
  EXPECT_EQ(j["step"], 19);
}

TEST(Checkpoint, DifferentRunIsRefusedNamingEachDifference) {
  testing::TempDir dir;
  Trained a;
  save_checkpoint(sample_checkpoint(a), dir / "c.pt");
  Checkpoint c = load_checkpoint(dir / "c.pt");
  auto run = string_dict();
  run.insert("model", std::string("mlp"));
  run.insert("world_size", int64_t{4});  // may differ: see Note [Resuming on another world size]
  run.insert("seed", int64_t{3});
  run.insert("accum_steps", int64_t{1});
  run.insert("precision", std::string("bf16"));
  const std::string msg = testing::error_message([&] { check_same_run(c, run, dir / "c.pt"); });
  EXPECT_THAT(msg, HasSubstr("seed=1 in the checkpoint but 3 in this run"));
  EXPECT_THAT(msg, HasSubstr("precision (absent from the checkpoint"));
  // World size and accumulation may change (a global batch kept by another accumulation).
  EXPECT_THAT(msg, ::testing::Not(HasSubstr("world_size")));
  EXPECT_THAT(msg, ::testing::Not(HasSubstr("accum_steps")));
  EXPECT_THAT(msg, HasSubstr(dir / "c.pt"));
  EXPECT_THAT(msg, ::testing::Not(HasSubstr("model=")));  // equal settings are not listed
}

c10::impl::GenericDict world(int64_t world_size, int64_t batch_size, int64_t accum_steps) {
  auto run = string_dict();
  run.insert("world_size", world_size);
  run.insert("batch_size", batch_size);
  run.insert("accum_steps", accum_steps);
  return run;
}

// A pipeline's stages together are one data-parallel replica: zero2 on 2 ranks (2 replicas) resumed
// by a 2-stage pipeline (1 replica) takes half the samples per micro-batch. Before replicas were
// recorded, both counted 2 and the resume retrained part of the epoch without a word.
TEST(Checkpoint, APipelinesStagesCountAsOneReplicaWhenResuming) {
  Trained a;
  Checkpoint c = sample_checkpoint(a);
  c.run.insert("batch_size", int64_t{10});
  c.run.insert("replicas", int64_t{2});
  c10::impl::GenericDict pipeline = world(2, 10, 1);
  pipeline.insert("replicas", int64_t{1});
  const std::string notice = adapt_position(c.position, c.run, pipeline, "c.pt");
  EXPECT_EQ(c.position.micro_batch, 14);
  EXPECT_THAT(notice, HasSubstr("written by 2 data-parallel replica(s) of batch 10 (20 samples per step); this "
                                "run has 1 of batch 10 (10)"));
  EXPECT_THAT(notice, HasSubstr("The data order differs from here on"));
}

// See Note [Resuming on another world size]: 7 micro-batches of 10 on 2 ranks consumed the first
// 140 samples of the epoch's permutation.
TEST(Checkpoint, AnotherWorldSizeResumesAfterTheSamplesAlreadyConsumed) {
  Trained a;
  auto at = [&](int64_t world_size, int64_t batch_size, int64_t accum_steps, std::string& notice) {
    Checkpoint c = sample_checkpoint(a);
    c.run.insert("batch_size", int64_t{10});
    notice = adapt_position(c.position, c.run, world(world_size, batch_size, accum_steps), "c.pt");
    return c.position.micro_batch;
  };
  std::string notice;
  EXPECT_EQ(at(2, 10, 1, notice), 7);  // the same run
  EXPECT_EQ(notice, "");
  EXPECT_EQ(at(1, 20, 1, notice), 7);  // the same global batch: the same steps
  EXPECT_THAT(notice, HasSubstr("written by 2 data-parallel replica(s) of batch 10 (20 samples per step); this "
                                "run has 1 of "
                                "batch 20 (20)"));
  EXPECT_THAT(notice, HasSubstr("every later step holds the samples it held in the original run"));
  EXPECT_THAT(notice, HasSubstr("BatchNorm's running statistics, kept per replica without sync_batchnorm"));
  EXPECT_EQ(at(1, 10, 1, notice), 14);  // half the global batch: twice the micro-batches
  EXPECT_THAT(notice, HasSubstr("The data order differs from here on"));
  EXPECT_THAT(notice, ::testing::Not(HasSubstr("second time")));
  EXPECT_EQ(at(4, 10, 1, notice), 3);  // 140 samples are 3.5 micro-batches of 40: back to 120
  EXPECT_THAT(notice, HasSubstr("20 samples of this epoch are seen a second time"));
  EXPECT_EQ(at(1, 10, 4, notice), 12);  // 14 micro-batches, rounded down to whole steps of 4
  EXPECT_THAT(notice, HasSubstr("20 samples of this epoch are seen a second time"));
}

TEST(Checkpoint, CorruptOrForeignFilesAreRefusedWithTheReason) {
  testing::TempDir dir;
  Trained a;
  save_checkpoint(sample_checkpoint(a), dir / "c.pt");
  std::vector<char> bytes = read_file(dir / "c.pt");
  bytes.resize(bytes.size() / 2);
  write_file_atomic(dir / "truncated.pt", bytes);
  EXPECT_THAT(testing::error_message([&] { load_checkpoint(dir / "truncated.pt"); }),
              HasSubstr("cannot read checkpoint '" + (dir / "truncated.pt") + "' (corrupt or not a checkpoint)"));

  models::save_state_dict(*a.model, dir / "weights.pt");  // a state dict, not a checkpoint
  EXPECT_THAT(testing::error_message([&] { load_checkpoint(dir / "weights.pt"); }),
              HasSubstr("has no 'format' entry: it is not a complete lockstep checkpoint"));

}

// Issue 53 items 15 and 20: forged positions were taken as they were (a negative step reached the
// LR schedule's check, a string step an INTERNAL ASSERT, an empty RNG state the generator, none
// naming the file; -7 skipped steps were printed). Each field is checked on read, naming both.
TEST(Checkpoint, ForgedPositionFieldsAreRefusedNamingTheFileAndTheField) {
  testing::TempDir dir;
  Trained a;
  save_checkpoint(sample_checkpoint(a), dir / "c.pt");
  const std::vector<char> good = read_file(dir / "c.pt");
  // The checkpoint with `change` made to its top-level dict, saved as bad.pt.
  auto forged = [&](const std::function<void(c10::impl::GenericDict&)>& change) {
    c10::impl::GenericDict top = torch_load(good).toGenericDict();
    change(top);
    write_file_atomic(dir / "bad.pt", torch_save(top));
    return testing::error_message([&] { load_checkpoint(dir / "bad.pt"); });
  };
  auto position = [&](const std::string& key, const c10::IValue& value) {
    return forged([&](c10::impl::GenericDict& top) { top.at("position").toGenericDict().insert_or_assign(key, value); });
  };
  const std::string file = "checkpoint '" + (dir / "bad.pt") + "'";
  EXPECT_THAT(position("step", int64_t{-5}), HasSubstr(file + " position.step is -5; it counts, so it is at least 0"));
  EXPECT_THAT(position("step", std::string("19")), HasSubstr(file + " position.step is a String, not an integer"));
  EXPECT_THAT(position("skipped_steps", int64_t{-7}), HasSubstr(file + " position.skipped_steps is -7"));
  EXPECT_THAT(position("skipped_steps", int64_t{20}), HasSubstr("counts 20 skipped steps (0 in a row) of 19"));
  EXPECT_THAT(position("epoch_loss_sum", std::numeric_limits<double>::quiet_NaN()),
              HasSubstr(file + " position.epoch_loss_sum is nan, not a finite number"));
  EXPECT_THAT(forged([](c10::impl::GenericDict& top) {
                top.insert_or_assign("rng", c10::List<torch::Tensor>({torch::empty({0}, torch::kUInt8)}));
              }),
              HasSubstr(file + " rng holds an empty or non-byte tensor, not a generator state"));
  EXPECT_THAT(forged([](c10::impl::GenericDict& top) { top.insert_or_assign("rng", int64_t{3}); }),
              HasSubstr(file + " rng is a Int, not a list of generator states"));
}

TEST(Checkpoint, ListingIgnoresTemporaryFilesAndKeepLastRemovesTheOldest) {
  testing::TempDir dir;
  for (int64_t step : {30, 10, 20}) write_file_atomic(checkpoint_path(dir.path(), step), {'x'});
  write_file_atomic(dir / "step-00000040.pt.tmp.123", {'x'});  // an interrupted write
  write_file_atomic(dir / "notes.txt", {'x'});
  write_file_atomic(dir / "step-123456789012345678901234.pt", {'x'});  // too many digits for a step
  EXPECT_EQ(checkpoint_path(dir.path(), 10), dir / "step-00000010.pt");
  EXPECT_EQ(list_checkpoints(dir.path()),
            (std::vector<std::string>{dir / "step-00000010.pt", dir / "step-00000020.pt", dir / "step-00000030.pt"}));
  EXPECT_EQ(latest_checkpoint(dir.path()), dir / "step-00000030.pt");
  remove_old_checkpoints(dir.path(), 2);
  EXPECT_EQ(list_checkpoints(dir.path()), (std::vector<std::string>{dir / "step-00000020.pt", dir / "step-00000030.pt"}));
  EXPECT_FALSE(latest_checkpoint(dir / "missing").has_value());
}

TEST(StateDict, LoadsPythonStyleDictWithDdpPrefixAndNamesMismatches) {
  auto a = models::make_model("mlp");
  auto b = models::make_model("mlp");
  c10::Dict<std::string, torch::Tensor> prefixed;
  for (auto& [k, v] : models::state_dict(*a)) prefixed.insert("module." + k, v);
  models::load_state_dict(*b, prefixed, "prefixed");
  auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i]));

  c10::Dict<std::string, torch::Tensor> wrong;
  for (auto& [k, v] : models::state_dict(*a)) wrong.insert(k == "fc2.bias" ? "head.bias" : k, v);
  const std::string msg = testing::error_message([&] { models::load_state_dict(*b, wrong, "'w.pt'"); });
  EXPECT_THAT(msg, HasSubstr("'w.pt' does not match the model's state dict: missing 'fc2.bias', unexpected 'head.bias'"));

  c10::Dict<std::string, torch::Tensor> shaped;
  for (auto& [k, v] : models::state_dict(*a)) shaped.insert(k, k == "fc1.bias" ? torch::zeros({3}) : v);
  EXPECT_THAT(testing::error_message([&] { models::load_state_dict(*b, shaped, "s"); }),
              HasSubstr("'fc1.bias' has shape [3] but the model's has shape"));
}

TEST(StateDict, NonFiniteWeightsAreRefusedNamingTheTensorAndTheCount) {
  auto a = models::make_model("mlp");
  c10::Dict<std::string, torch::Tensor> poisoned;
  for (auto& [k, v] : models::state_dict(*a)) poisoned.insert(k, k == "fc1.weight" ? v.clone() : v);
  auto w = poisoned.at("fc1.weight");
  w.view(-1)[0] = NAN;
  w.view(-1)[5] = INFINITY;
  EXPECT_THAT(testing::error_message([&] { models::load_state_dict(*models::make_model("mlp"), poisoned, "'p.pt'"); }),
              HasSubstr("'p.pt': 'fc1.weight' holds 2 non-finite values (NaN or inf) of " +
                        std::to_string(w.numel())));
}

// A whole checkpoint, lockstep's or Python's {"model": ..., "optimizer": ...}, gives its model entry,
// so a checkpoint of another run can start a new one (--init-weights).
TEST(StateDict, ACheckpointGivesItsModelEntry) {
  testing::TempDir dir;
  Trained t;
  save_checkpoint(sample_checkpoint(t), dir / "c.pt");
  auto fresh = models::make_model("mlp");
  models::load_state_dict_file(*fresh, dir / "c.pt");
  auto pa = t.model->parameters(), pb = fresh->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i]));
}

const std::string kCli = LOCKSTEP_CLI;

bool has_temporary_file(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
  return false;
}

// SIGKILL while a checkpoint is being written (its temporary file exists) leaves the previous
// checkpoint complete and loadable, and the interrupted one is not mistaken for a checkpoint.
TEST(CheckpointFiles, SigkillDuringASaveLeavesThePreviousCheckpointLoadable) {
  testing::TempDir dir;
  const std::string ckpt = dir / "ckpt";
  // resnet18's checkpoint is about 90 MB (weights and momentum): each save takes a while.
  testing::ChildProcess trainer({kCli, "train", "--quiet", "--model", "resnet18", "--data", "synthetic", "--limit",
                                 "400", "--batch-size", "4", "--checkpoint-dir", ckpt, "--save-every", "1"},
                                dir / "out.txt");
  const bool caught = testing::wait_until(
      [&] { return !list_checkpoints(ckpt).empty() && has_temporary_file(ckpt); }, std::chrono::seconds(120));
  ::kill(trainer.pid(), SIGKILL);
  ASSERT_TRUE(caught) << "never saw a save in progress after a complete one:\n" << testing::read_text(dir / "out.txt");
  ASSERT_EQ(trainer.wait_for(std::chrono::seconds(10)), 128 + SIGKILL);

  const auto latest = latest_checkpoint(ckpt);
  ASSERT_TRUE(latest.has_value());
  Checkpoint c = load_checkpoint(*latest);
  auto model = models::make_model("resnet18");
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  models::load_state_dict(*model, c.model, *latest);
  optim::load_optimizer_state_dict(optimizer, c.optimizer, *latest);
  EXPECT_EQ(c.position.step, std::stoll(latest->substr(latest->size() - 11, 8)));
}

// Unmounts a tmpfs when the test ends, however it ends.
struct Mount {
  std::string path;
  bool mounted = false;
  ~Mount() {
    if (mounted) testing::run_command("umount -l " + path);
  }
};

// A full disk during a save: the error names the path and the cause, training finishes with its
// summary, and the last good checkpoint still resumes. Needs root to mount a small tmpfs.
TEST(CheckpointFiles, FullDiskLogsTheErrorFinishesAndTheLastGoodCheckpointResumes) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount a small tmpfs";
  testing::TempDir dir;
  Mount disk{dir / "disk"};
  std::filesystem::create_directories(disk.path);
  // A convnet checkpoint is about 240 kB: the first fits in 400 kB, a second beside it does not.
  auto m = testing::run_command("mount -t tmpfs -o size=400k lockstep-test " + disk.path);
  if (m.exit_code != 0) GTEST_SKIP() << "cannot mount a tmpfs here: " << m.output;
  disk.mounted = true;

  const std::string run = kCli + " train --quiet --model convnet --data synthetic --limit 400 --batch-size 50 "
                          "--epochs 1 --checkpoint-dir " + disk.path + " --save-every 2";
  auto full = testing::run_command(run);
  ASSERT_EQ(full.exit_code, 0) << full.output;
  EXPECT_THAT(full.output, HasSubstr("error: checkpoint at step 4 not saved: cannot write '" + disk.path +
                                     "/step-00000004.pt'"));
  EXPECT_THAT(full.output, HasSubstr("No space left on device"));
  EXPECT_THAT(full.output, HasSubstr("the last good checkpoint is '" + disk.path + "/step-00000002.pt'"));
  EXPECT_THAT(testing::last_json_line(full.output), HasSubstr("\"steps\":8"));
  EXPECT_EQ(list_checkpoints(disk.path), std::vector<std::string>{disk.path + "/step-00000002.pt"});
  EXPECT_FALSE(has_temporary_file(disk.path));

  auto resumed = testing::run_command(run + " --resume latest");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("resumed from '" + disk.path + "/step-00000002.pt': epoch 1, step 2"));
  EXPECT_THAT(testing::last_json_line(resumed.output), HasSubstr("\"steps\":8"));
}

}  // namespace
}  // namespace lockstep::train
