// Sharded checkpoints (Note [Sharded checkpoint files]): every rank writes its own shards, and the
// files resume shard by shard under the strategy that wrote them, or as the full form under any
// other strategy or world size. Two real ranks over Gloo, as threads (library) or processes (CLI).
#include "lockstep/train/sharded_checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "../parallel/sharding_fixtures.h"
#include "../test_util.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/parallel/fsdp_strategy.h"
#include "lockstep/train/checkpointer.h"

namespace lockstep::train {
namespace {

namespace fs = std::filesystem;
namespace fixtures = parallel::sharding_test;
using ::testing::HasSubstr;
using ::testing::Not;

// The mlp's fsdp units over 2 ranks: fc1 (200960 parameters) and fc2 (2570), 100480 and 1285 per rank.
constexpr int64_t kFc1 = 200960, kFc2 = 2570;

// The names in `dir` that start with `prefix`, sorted.
std::vector<std::string> names_in(const std::string& dir, const std::string& prefix = "") {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TrainingPosition at_step(int64_t step) {
  TrainingPosition p;
  p.step = step;
  return p;
}

// fsdp with Adam after 2 steps on 2 ranks: saving sharded sends nothing but the ranks' vote (one
// all-gathered int64: 8 bytes per rank), while the full form gathers the model and the optimizer
// state (at least the parameters' 4 bytes x Psi x (N-1)/N). The N files put back together are
// exactly what the full form gathers: the same model entries and per-parameter optimizer state.
TEST(ShardedCheckpoint, FsdpSavesWithoutGatheringAndTheFilesHoldTheFullStateInPieces) {
  testing::TempDir dir;
  const fixtures::Data d = fixtures::random_data(96, 5);
  const auto initial = fixtures::mlp(3);
  std::vector<int64_t> sharded_sent(2), full_sent(2);
  c10::Dict<std::string, torch::Tensor> gathered_model;
  c10::IValue gathered_optimizer;
  testing::run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    parallel::FsdpStrategy fsdp(torch::nn::AnyModule(fixtures::copy_of(*initial)),
                                fixtures::with_optimizer(optim::OptimizerKind::kAdam).group(testing::lent(group)));
    fixtures::train(fsdp, d, 0, 2, rank, false);
    {
      Checkpointer sharded(CheckpointerOptions().dir(dir / "sharded").format(CheckpointFormat::kSharded),
                           string_dict(), &group);
      const int64_t before = group.bytes_sent();
      sharded.save(at_step(2), fsdp);
      sharded_sent[rank] = group.bytes_sent() - before;
    }
    {
      Checkpointer full(CheckpointerOptions().dir(dir / "full"), string_dict(), &group);
      const int64_t before = group.bytes_sent();
      full.save(at_step(2), fsdp);
      full_sent[rank] = group.bytes_sent() - before;
    }
    const auto model = fsdp.model_state_dict();
    const auto training = fsdp.training_state_dict();
    if (rank == 0) {
      gathered_model = model;
      gathered_optimizer = training.at("optimizer");
    }
  });
  for (int64_t rank : {0, 1}) {
    // The vote (an int64 all-gathered: 8 bytes) and the save id (an int64 broadcast: 4 bytes a
    // rank on 2 ranks, as Note [Counting bytes on the wire] counts a broadcast).
    EXPECT_EQ(sharded_sent[rank], 12) << "rank " << rank << ": only the vote and the save id travel";
    EXPECT_GE(full_sent[rank], 4 * (kFc1 + kFc2) / 2) << "rank " << rank;
  }
  const std::string step = sharded_checkpoint_path(dir / "sharded", 2);
  EXPECT_EQ(names_in(step), (std::vector<std::string>{"metadata.pt", "rank-00000-of-00002.pt", "rank-00001-of-00002.pt"}));

  Checkpoint c = load_checkpoint(step);
  ASSERT_TRUE(c.sharded.has_value());
  EXPECT_EQ(c.sharded->strategy, "fsdp");
  EXPECT_EQ(c.sharded->world_size, 2);
  ASSERT_EQ(c.sharded->layouts.size(), 2u);
  EXPECT_EQ(c.sharded->layouts[0].shard_numel, kFc1 / 2);
  EXPECT_TRUE(c.model.isNone());
  reassemble_sharded_checkpoint(c);
  const auto model = c.model.toGenericDict();
  ASSERT_EQ(model.size(), gathered_model.size());
  auto it = gathered_model.begin();
  for (const auto& item : model) {
    EXPECT_EQ(item.key().toStringRef(), it->key());
    EXPECT_TRUE(torch::equal(item.value().toTensor(), it->value())) << it->key();
    ++it;
  }
  const auto state = c.optimizer.toGenericDict().at("state").toGenericDict();
  const auto expected = gathered_optimizer.toGenericDict().at("state").toGenericDict();
  ASSERT_EQ(state.size(), 4u);
  for (int64_t i = 0; i < 4; ++i)
    for (const char* key : {"step", "exp_avg", "exp_avg_sq"})
      EXPECT_TRUE(torch::equal(state.at(i).toGenericDict().at(key).toTensor(),
                               expected.at(i).toGenericDict().at(key).toTensor()))
          << "parameter " << i << " " << key;
  EXPECT_EQ(c.rng.size(), 2u);

  const std::string python = testing::python_with_torch();
  if (python.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  // Python's torch.load reads a rank file and the metadata; the rank file holds rank 1's shards only.
  auto r = testing::run_command(
      python + " -c \"import torch, json; f = torch.load('" + step + "/rank-00001-of-00002.pt'); m = torch.load('" +
      step + "/metadata.pt'); s = f['optimizer']['state']; print(json.dumps({'rank': f['rank'], 'world': "
      "f['world_size'], 'shards': {k: v.numel() for k, v in f['shards'].items()}, 'exp_avg': [s[k]['exp_avg'].numel()"
      " for k in sorted(s)], 'units': [u['name'] for u in m['units']], 'files': m['files'], 'step': "
      "m['position']['step'], 'strategy': m['strategy']}))\"");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(testing::last_json_line(r.output));
  EXPECT_EQ(j["rank"], 1);
  EXPECT_EQ(j["world"], 2);
  EXPECT_EQ(j["shards"], nlohmann::json({{"fc1", kFc1 / 2}, {"fc2", kFc2 / 2}}));
  EXPECT_EQ(j["exp_avg"], nlohmann::json({kFc1 / 2, kFc2 / 2}));
  EXPECT_EQ(j["units"], nlohmann::json({"fc1", "fc2"}));
  EXPECT_EQ(j["files"], nlohmann::json({"rank-00000-of-00002.pt", "rank-00001-of-00002.pt"}));
  EXPECT_EQ(j["step"], 2);
  EXPECT_EQ(j["strategy"], "fsdp");
}

// Under the strategy that wrote it, on as many ranks, each rank loads its own file: 2 steps, a
// sharded save, a fresh strategy from the initial weights resumed from it and 2 more steps end
// exactly where 4 uninterrupted steps end, for fsdp and for zero2 (which all-gathers the loaded
// shards into its full weights).
TEST(ShardedCheckpoint, SameStrategyAndWorldSizeResumeShardByShardExactly) {
  const fixtures::Data d = fixtures::random_data(96, 5);
  const auto initial = fixtures::mlp(3);
  for (parallel::StrategyKind kind : {parallel::StrategyKind::kFsdp, parallel::StrategyKind::kZero2}) {
    testing::TempDir dir;
    std::vector<std::vector<torch::Tensor>> straight(2), resumed(2);
    testing::run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
      const auto options = fixtures::with_optimizer(optim::OptimizerKind::kAdam).group(testing::lent(group));
      auto reference = parallel::make_strategy(kind, torch::nn::AnyModule(fixtures::copy_of(*initial)), options);
      fixtures::train(*reference, d, 0, 4, rank, false);
      straight[rank] = fixtures::weights(*reference);
      {
        auto first = parallel::make_strategy(kind, torch::nn::AnyModule(fixtures::copy_of(*initial)), options);
        fixtures::train(*first, d, 0, 2, rank, false);
        Checkpointer(CheckpointerOptions().dir(dir.path()).format(CheckpointFormat::kSharded), string_dict(), &group)
            .save(at_step(2), *first);
      }
      Checkpointer resuming(CheckpointerOptions().resume(sharded_checkpoint_path(dir.path(), 2))
                                .strategy(parallel::to_string(kind)), string_dict(), &group);
      const std::optional<Checkpoint> c = resuming.load_resume(1);
      ASSERT_TRUE(c && c->sharded && c->sharded->own) << "rank " << rank << " did not load its own file";
      EXPECT_TRUE(c->model.isNone()) << "rank " << rank << " read the full model";
      auto second = parallel::make_strategy(kind, torch::nn::AnyModule(fixtures::copy_of(*initial)), options);
      EXPECT_EQ(resuming.restore(c, *second).step, 2);
      fixtures::train(*second, d, 2, 2, rank, false);
      resumed[rank] = fixtures::weights(*second);
    });
    for (int64_t rank : {0, 1})
      fixtures::expect_close(resumed[rank], straight[rank], 0.0, parallel::to_string(kind) + " rank " + std::to_string(rank));
  }
}

const std::string kCli = LOCKSTEP_CLI;
const std::string kRun = " train --quiet --model mlp --data synthetic --limit 400 --seed 4 --optimizer adam --lr 0.002";
const std::string kTwoRanks = kCli + " run --nproc-per-node 2 -- " + kCli + kRun + " --batch-size 20";
const std::string kSharded = " --checkpoint-format sharded";

void expect_close_state(const std::string& a_path, const std::string& b_path, double tolerance) {
  auto a = torch::pickle_load(read_file(a_path)).toGenericDict(), b = torch::pickle_load(read_file(b_path)).toGenericDict();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& entry : a) {
    const torch::Tensor ta = entry.value().toTensor(), tb = b.at(entry.key()).toTensor();
    EXPECT_LE((ta - tb).abs().max().item<double>(), tolerance) << entry.key().toStringRef();
  }
}

// Through the CLI: an epoch of fsdp on 2 ranks (10 steps) writes step-00000010/ with one file per
// rank and the metadata; the second epoch resumed under fsdp on 2 ranks reads only its own files
// and ends bit for bit where two uninterrupted epochs end; --keep-last prunes directories.
TEST(ShardedCheckpointTrain, FsdpWritesOneFilePerRankAndResumesExactly) {
  testing::TempDir dir;
  auto straight = testing::run_command(kTwoRanks + " --strategy fsdp --epochs 2 --save-model " + (dir / "straight.pt"));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const std::string ckpt = dir / "ckpt";
  auto first = testing::run_command(kTwoRanks + " --strategy fsdp --epochs 1" + kSharded + " --checkpoint-dir " + ckpt);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_EQ(names_in(ckpt, "step-"), std::vector<std::string>{"step-00000010"});
  EXPECT_EQ(names_in(ckpt + "/step-00000010"),
            (std::vector<std::string>{"metadata.pt", "rank-00000-of-00002.pt", "rank-00001-of-00002.pt"}));
  const std::string out = dir / "resumed.pt";
  auto second = testing::run_command(kTwoRanks + " --strategy fsdp --epochs 2" + kSharded + " --keep-last 1 " +
                                     "--checkpoint-dir " + ckpt + " --resume latest --save-model " + out);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_THAT(second.output, HasSubstr("resumed from '" + ckpt + "/step-00000010'"));
  EXPECT_THAT(second.output, Not(HasSubstr("reading the full model")));
  expect_close_state(dir / "straight.pt", out, 0.0);
  EXPECT_EQ(names_in(ckpt, "step-"), std::vector<std::string>{"step-00000020"});
}

// fsdp's shards resumed under ddp on 2 ranks end where two epochs of ddp end (1e-5, as
// ZeroTrain.CheckpointsResumeAcrossStrategies), and by one process of batch 40 (the same global
// batch) within 1e-4, as FsdpTrain.TwoRankCheckpointResumesInOneProcess explains.
TEST(ShardedCheckpointTrain, FsdpShardsResumeUnderDdpAndInOneProcess) {
  testing::TempDir dir;
  auto straight = testing::run_command(kTwoRanks + " --strategy ddp --epochs 2 --save-model " + (dir / "straight.pt"));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const std::string ckpt = dir / "ckpt";
  auto first = testing::run_command(kTwoRanks + " --strategy fsdp --epochs 1" + kSharded + " --checkpoint-dir " + ckpt);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string step = ckpt + "/step-00000010";

  auto ddp = testing::run_command(kTwoRanks + " --strategy ddp --epochs 2 --resume " + step + " --save-model " +
                                  (dir / "ddp.pt"));
  ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
  EXPECT_THAT(ddp.output, HasSubstr("sharded checkpoint '" + step + "' was written by fsdp on 2 rank(s); this run is "
                                    "ddp on 2: reading the full model and optimizer state from its 2 rank files"));
  expect_close_state(dir / "straight.pt", dir / "ddp.pt", 1e-5);

  auto one = testing::run_command(kCli + kRun + " --batch-size 40 --epochs 2 --resume " + step + " --save-model " +
                                  (dir / "one.pt"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_THAT(one.output, HasSubstr("this run is local on 1"));
  EXPECT_THAT(one.output, HasSubstr("was written by 2 data-parallel replica(s) of batch 20 (40 samples per "
                                    "step); this run "
                                    "has 1 of batch 40 (40). The global batch is the same"));
  expect_close_state(dir / "straight.pt", dir / "one.pt", 1e-4);
}

// An fsdp run on 2 ranks that saves sharded checkpoints into `ckpt` at steps 5 and 10.
void save_at_steps_5_and_10(const std::string& ckpt) {
  auto run = testing::run_command(kTwoRanks + " --strategy fsdp --epochs 1 --save-every 5" + kSharded +
                                  " --checkpoint-dir " + ckpt);
  ASSERT_EQ(run.exit_code, 0) << run.output;
}

// A checkpoint missing a rank file or its metadata is incomplete: "latest" skips it with a
// warning, and named explicitly it is refused naming the file, the rank and the fix; a corrupt
// rank file is refused the same way when it is read.
TEST(ShardedCheckpointTrain, IncompleteOrCorruptCheckpointsAreSkippedOrRefusedNamingTheFile) {
  testing::TempDir dir;
  const std::string ckpt = dir / "ckpt";
  save_at_steps_5_and_10(ckpt);
  if (HasFatalFailure()) return;
  const std::string step5 = sharded_checkpoint_path(ckpt, 5), step10 = sharded_checkpoint_path(ckpt, 10);
  ASSERT_EQ(names_in(ckpt, "step-"), (std::vector<std::string>{"step-00000005", "step-00000010"}));

  fs::remove(step10 + "/rank-00001-of-00002.pt");
  EXPECT_THAT(testing::error_message([&] { load_checkpoint(step10); }),
              ::testing::AllOf(HasSubstr("is incomplete: the file of rank 1 of 2, '" + step10 +
                                         "/rank-00001-of-00002.pt', is missing"),
                               HasSubstr("restore that file, or resume from an earlier checkpoint")));
  ::testing::internal::CaptureStderr();
  Checkpointer latest(CheckpointerOptions().dir(ckpt).resume("latest"), string_dict(), nullptr);
  const auto c = latest.load_resume(1);
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(latest.resumed_from(), step5);
  EXPECT_THAT(warnings, HasSubstr("skipping checkpoint '" + step10 + "'"));
  EXPECT_FALSE(c->model.isNone());  // another strategy (none named) on 1 rank: the full form, reassembled

  std::ofstream(step5 + "/rank-00000-of-00002.pt", std::ios::trunc) << "not a zip";
  EXPECT_THAT(testing::error_message([&] {
                Checkpointer(CheckpointerOptions().resume(step5), string_dict(), nullptr).load_resume(1);
              }),
              ::testing::AllOf(HasSubstr("the file of rank 0 of sharded checkpoint '" + step5 + "'"),
                               HasSubstr("cannot be resumed without rank 0's file '" + step5 +
                                         "/rank-00000-of-00002.pt': restore it, or resume from an earlier checkpoint")));

  fs::remove(step5 + "/metadata.pt");
  EXPECT_THAT(testing::error_message([&] { load_checkpoint(step5); }),
              ::testing::AllOf(HasSubstr("sharded checkpoint '" + step5 + "' is incomplete: it has no metadata.pt"),
                               HasSubstr("--resume latest skips this one")));
}

// A rank file left from another save (here step 5's, put in step 10's place: same rank, world size
// and units) is refused naming the file and why, instead of resuming with step 5's shards; "latest"
// falls back past the checkpoint.
TEST(ShardedCheckpointTrain, ARankFileFromAnotherSaveIsRefusedNotResumedSilently) {
  testing::TempDir dir;
  const std::string ckpt = dir / "ckpt";
  save_at_steps_5_and_10(ckpt);
  if (HasFatalFailure()) return;
  const std::string step5 = sharded_checkpoint_path(ckpt, 5), step10 = sharded_checkpoint_path(ckpt, 10);
  fs::copy_file(step5 + "/rank-00001-of-00002.pt", step10 + "/rank-00001-of-00002.pt",
                fs::copy_options::overwrite_existing);
  EXPECT_THAT(testing::error_message([&] {
                Checkpoint c = load_checkpoint(step10);
                reassemble_sharded_checkpoint(c);
              }),
              ::testing::AllOf(HasSubstr("the file of rank 1 of sharded checkpoint '" + step10 + "'"),
                               HasSubstr("is from another save (save id "),
                               HasSubstr("restore it, or resume from an earlier checkpoint")));
  // "latest" resumes as a run would (another strategy on one process: every rank file is read)
  // and falls back past it to step 5, saying why; before, it failed on every restart.
  std::vector<std::string> warnings;
  const auto options = CheckpointerOptions().dir(ckpt).resume("latest").reporter(
      [&](ReportKind kind, const std::string& line) {
        if (kind == ReportKind::kWarning) warnings.push_back(line);
      });
  const std::optional<Checkpoint> resumed = Checkpointer(options, string_dict(), nullptr).load_resume(1);
  ASSERT_TRUE(resumed.has_value());
  EXPECT_EQ(resumed->position.step, 5);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], ::testing::AllOf(HasSubstr("skipping checkpoint '" + step10 + "'"),
                                            HasSubstr("is from another save"), HasSubstr("trying the one before it")));
}

// --checkpoint-format sharded without shards to write fails before training, naming the fix.
TEST(ShardedCheckpointTrain, ShardedFormatWithoutAShardingStrategyIsRefused) {
  testing::TempDir dir;
  auto r = testing::run_command(kTwoRanks + " --strategy ddp" + kSharded + " --checkpoint-dir " + (dir / "ckpt"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--checkpoint-format sharded with --strategy ddp: every rank of that strategy holds "
                                  "the whole model, so there are no shards to write; use --strategy fsdp, zero1 or "
                                  "zero2, or --checkpoint-format full"));
  EXPECT_THAT(r.output, Not(HasSubstr("epoch 1")));
  auto alone = testing::run_command(kCli + kRun + kSharded + " --checkpoint-dir " + (dir / "ckpt2"));
  EXPECT_EQ(alone.exit_code, 2) << alone.output;
  EXPECT_THAT(alone.output, HasSubstr("--strategy unset (ddp or local)"));
}

}  // namespace
}  // namespace lockstep::train
