#include "lockstep/train/checkpointer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "../dist/multi_rank.h"
#include "lockstep/core/atomic_file.h"
#include "../test_util.h"
#include "lockstep/models/mlp.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/parallel/local_strategy.h"

namespace lockstep::train {
namespace {

using ::testing::HasSubstr;

c10::impl::GenericDict run_of(const std::string& model) {
  c10::impl::GenericDict run = string_dict();
  run.insert("model", model);
  return run;
}

// A local strategy over a fresh mlp with Adam, after `steps` steps on fixed data.
std::unique_ptr<parallel::Strategy> adam_strategy(int steps) {
  torch::manual_seed(3);
  const auto adam = optim::OptimizerOptions(optim::OptimizerKind::kAdam, 1e-3);
  auto strategy = std::make_unique<parallel::LocalStrategy>(
      torch::nn::AnyModule(std::make_shared<models::MLPImpl>()),
      parallel::StrategyOptions().optimizer(
          [adam](std::vector<torch::Tensor> p) { return optim::make_optimizer(std::move(p), adam); }));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const torch::Tensor x = torch::randn({8, 1, 28, 28}, gen), y = torch::randint(0, 10, {8}, gen, torch::kInt64);
  for (int i = 0; i < steps; ++i) {
    strategy->forward_backward({{x, y, 1.0}}, [](const torch::Tensor& out, const torch::Tensor& target) {
      return torch::nn::functional::cross_entropy(out, target);
    });
    strategy->step();
  }
  return strategy;
}

TEST(Checkpointer, IsDueEverySaveEverySteps) {
  testing::TempDir dir;
  EXPECT_FALSE(Checkpointer(CheckpointerOptions().save_every(3), run_of("mlp"), nullptr).due(3));  // no directory
  {
    Checkpointer every3(CheckpointerOptions().dir(dir.path()).save_every(3), run_of("mlp"), nullptr);
    EXPECT_TRUE(every3.due(3));
    EXPECT_FALSE(every3.due(4));
    EXPECT_TRUE(every3.due(6));
  }
  EXPECT_FALSE(Checkpointer(CheckpointerOptions().dir(dir.path()), run_of("mlp"), nullptr).due(3));  // epoch ends only
}

// Saves keep the newest K; "latest" finds the newest, and restoring it gives a fresh strategy the
// saved optimizer state (Adam's moments and steps) and this process the saved RNG state.
TEST(Checkpointer, ResumesTheNewestOfTheLastKWithOptimizerStateAndRng) {
  testing::TempDir dir;
  auto trained = adam_strategy(2);
  {
    Checkpointer writer(CheckpointerOptions().dir(dir.path()).keep_last(2), run_of("mlp"), nullptr);
    for (int64_t step : {1, 2, 3}) {
      TrainingPosition at;
      at.step = step;
      writer.save(at, *trained);
    }
  }  // the writer's run ends, releasing the directory
  const torch::Tensor next_random = torch::rand({4});  // what the RNG gives after the last save
  EXPECT_EQ(list_checkpoints(dir.path()), (std::vector<std::string>{checkpoint_path(dir.path(), 2),
                                                                      checkpoint_path(dir.path(), 3)}));

  Checkpointer reader(CheckpointerOptions().dir(dir.path()).resume("latest"), run_of("mlp"), nullptr);
  const std::optional<Checkpoint> c = reader.load_resume(/*epochs=*/2);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(reader.resumed_from(), checkpoint_path(dir.path(), 3));
  auto fresh = adam_strategy(0);
  const TrainingPosition at = reader.restore(c, *fresh);
  EXPECT_EQ(at.step, 3);
  EXPECT_TRUE(torch::equal(torch::rand({4}), next_random));
  const auto saved = trained->training_state_dict().at("optimizer").toGenericDict().at("state").toGenericDict();
  const auto loaded = fresh->training_state_dict().at("optimizer").toGenericDict().at("state").toGenericDict();
  ASSERT_EQ(loaded.size(), saved.size());
  for (const auto& entry : saved) {
    const auto mine = loaded.at(entry.key()).toGenericDict();
    for (const auto& buffer : entry.value().toGenericDict())
      EXPECT_TRUE(torch::equal(buffer.value().toTensor(), mine.at(buffer.key()).toTensor())) << buffer.key();
  }
}

// A finished run resumes with nothing left to train (so a restarted command still writes its
// outputs); asking for fewer epochs than it has done is refused.
TEST(Checkpointer, LatestWithNoneStartsAfreshAnotherRunIsRefusedAndAFinishedOneLoads) {
  testing::TempDir dir;
  EXPECT_FALSE(Checkpointer(CheckpointerOptions().dir(dir.path()).resume("latest"), run_of("mlp"), nullptr)
                   .load_resume(1)
                   .has_value());
  TrainingPosition done;
  done.epoch = 2;
  Checkpointer(CheckpointerOptions().dir(dir.path()), run_of("mlp"), nullptr).save(done, *adam_strategy(0));
  EXPECT_THAT(testing::error_message([&] {
                Checkpointer(CheckpointerOptions().dir(dir.path()).resume("latest"), run_of("convnet"), nullptr)
                    .load_resume(2);
              }),
              HasSubstr("model=mlp in the checkpoint but convnet in this run"));
  const auto finished =
      Checkpointer(CheckpointerOptions().dir(dir.path()).resume("latest"), run_of("mlp"), nullptr).load_resume(2);
  ASSERT_TRUE(finished.has_value());
  EXPECT_EQ(finished->position.epoch, 2);
  EXPECT_THAT(testing::error_message([&] {
                Checkpointer(CheckpointerOptions().dir(dir.path()).resume("latest"), run_of("mlp"), nullptr).load_resume(1);
              }),
              HasSubstr("has completed 2 epochs and --epochs is 1"));
  EXPECT_THAT(testing::error_message([] { Checkpointer(CheckpointerOptions().resume("latest"), run_of("mlp"), nullptr); }),
              HasSubstr("--resume latest needs --checkpoint-dir"));
}

TEST(Checkpointer, ASecondRunOnTheDirectoryIsRefusedNamingTheFirstRunsPid) {
  testing::TempDir dir;
  {
    Checkpointer first(CheckpointerOptions().dir(dir.path()), run_of("mlp"), nullptr);
    EXPECT_THAT(testing::error_message([&] { Checkpointer(CheckpointerOptions().dir(dir.path()), run_of("mlp"), nullptr); }),
                ::testing::AllOf(HasSubstr("--checkpoint-dir '" + dir.path() + "' is in use by another run (pid " +
                                         std::to_string(::getpid()) + " on "),
                               HasSubstr("its own --checkpoint-dir")));
  }
  EXPECT_NO_THROW(Checkpointer(CheckpointerOptions().dir(dir.path()), run_of("mlp"), nullptr));  // released
}

// Issue 54 item 6: `rm -rf` of the directory mid-run; the run re-created it without its lock, and a
// second `--resume latest` run was accepted beside it: both wrote. See Note [A lock that survives
// its directory].
TEST(Checkpointer, ADirectoryRemovedMidRunIsLockedAgainOrNoLongerWritten) {
  testing::TempDir root;
  const std::string dir = root / "ckpt";
  std::vector<std::string> said;
  Checkpointer run(CheckpointerOptions().dir(dir).save_every(1).reporter(
                       [&](ReportKind, const std::string& line) { said.push_back(line); }),
                   run_of("mlp"), nullptr);
  const std::unique_ptr<parallel::Strategy> strategy = adam_strategy(1);
  TrainingPosition at;
  at.step = 1;
  run.save(at, *strategy);
  ASSERT_TRUE(std::filesystem::exists(checkpoint_path(dir, 1)));

  // Removed: the next save makes the directory again and holds its new lock.
  std::filesystem::remove_all(dir);
  at.step = 2;
  run.save(at, *strategy);
  EXPECT_TRUE(std::filesystem::exists(checkpoint_path(dir, 2)));
  ASSERT_FALSE(said.empty());
  EXPECT_THAT(said.back(), HasSubstr("was removed or replaced while this run held it; it is made again and locked "
                                     "again, and checkpoints go on there from step 2"));
  EXPECT_THAT(testing::error_message([&] { Checkpointer(CheckpointerOptions().dir(dir).resume("latest"), run_of("mlp"), nullptr); }),
              HasSubstr("is in use by another run"));

  // Removed, and another run took the new directory first: this run writes there no more.
  std::filesystem::remove_all(dir);
  DirectoryLock other(dir, "--checkpoint-dir");
  said.clear();
  for (int64_t step : {3, 4}) {
    at.step = step;
    run.save(at, *strategy);
  }
  ASSERT_EQ(said.size(), 1u) << "said once, not at every save";
  EXPECT_THAT(said[0], HasSubstr("checkpoint at step 3 not saved, and no more will be: --checkpoint-dir '" + dir +
                                 "' was removed while this run held it, and --checkpoint-dir '" + dir +
                                 "' is in use by another run (pid "));
  EXPECT_FALSE(latest_checkpoint(dir).has_value());
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()), 1)
      << "only the other run's .lock";
}

// Without --resume, a directory that already holds checkpoints would get two runs' files mixed.
TEST(Checkpointer, StartingAfreshInADirectoryWithCheckpointsIsRefused) {
  testing::TempDir dir;
  TrainingPosition at;
  at.step = 4;
  Checkpointer(CheckpointerOptions().dir(dir.path()), run_of("mlp"), nullptr).save(at, *adam_strategy(0));
  EXPECT_THAT(testing::error_message([&] {
                Checkpointer(CheckpointerOptions().dir(dir.path()), run_of("convnet"), nullptr).load_resume(1);
              }),
              ::testing::AllOf(HasSubstr("already holds checkpoints of another run (different settings), up to '" +
                                       checkpoint_path(dir.path(), 4) + "'"),
                             HasSubstr("Pass --resume latest to continue that run")));
  EXPECT_THAT(testing::error_message([&] {
                Checkpointer(CheckpointerOptions().dir(dir.path()), run_of("mlp"), nullptr).load_resume(1);
              }),
              HasSubstr("already holds checkpoints of a run with these same settings"));
}

// See Note [Interrupted saves]: a SIGKILL during a save leaves a temporary file, or a sharded step
// without its metadata; the next run on the directory removes them, says so, and keeps the rest.
TEST(Checkpointer, AStartRemovesWhatInterruptedSavesLeftAndSaysSo) {
  namespace fs = std::filesystem;
  testing::TempDir dir;
  TrainingPosition at;
  at.step = 2;
  Checkpointer(CheckpointerOptions().dir(dir.path()), run_of("mlp"), nullptr).save(at, *adam_strategy(2));
  const std::string pending = checkpoint_path(dir.path(), 3) + ".tmp.4242";
  const std::string unfinished = sharded_checkpoint_path(dir.path(), 4);
  const std::string committed = sharded_checkpoint_path(dir.path(), 5);
  fs::create_directories(unfinished);
  fs::create_directories(committed);
  for (const std::string& f : {pending, unfinished + "/rank-00000-of-00002.pt", committed + "/metadata.pt",
                               committed + "/rank-00001-of-00002.pt.tmp.77", dir / "notes.tmp.txt"})
    std::ofstream(f) << "bytes";
  std::vector<std::pair<ReportKind, std::string>> reports;
  Checkpointer(CheckpointerOptions().dir(dir.path()).resume("latest").reporter(
                   [&](ReportKind kind, const std::string& line) { reports.emplace_back(kind, line); }),
               run_of("mlp"), nullptr);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].first, ReportKind::kNotice);
  EXPECT_EQ(reports[0].second, "removed what interrupted saves left in '" + dir.path() + "': 2 temporary file(s) and "
                               "the unfinished sharded checkpoint(s) step-00000004 (no metadata.pt: never loadable)");
  EXPECT_FALSE(fs::exists(pending));
  EXPECT_FALSE(fs::exists(unfinished));
  EXPECT_FALSE(fs::exists(committed + "/rank-00001-of-00002.pt.tmp.77"));
  EXPECT_TRUE(fs::exists(committed + "/metadata.pt"));  // committed: a missing rank file can be restored
  EXPECT_TRUE(fs::exists(checkpoint_path(dir.path(), 2)));
  EXPECT_TRUE(fs::exists(dir / "notes.tmp.txt"));  // not a temporary file of ours
}

// See Note [Falling back to an older checkpoint].
TEST(Checkpointer, LatestSkipsACorruptNewestCheckpointButANamedOneIsRefused) {
  testing::TempDir dir;
  for (int64_t step : {1, 2}) {
    TrainingPosition at;
    at.step = step;
    Checkpointer(CheckpointerOptions().dir(dir.path()), run_of("mlp"), nullptr).save(at, *adam_strategy(step));
  }
  std::vector<char> bytes = read_file(checkpoint_path(dir.path(), 2));
  bytes[bytes.size() / 2] ^= 0x04;  // inside Adam's state or the weights
  write_file_atomic(checkpoint_path(dir.path(), 2), bytes);

  ::testing::internal::CaptureStderr();
  Checkpointer latest(CheckpointerOptions().dir(dir.path()).resume("latest"), run_of("mlp"), nullptr);
  const auto c = latest.load_resume(1);
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(latest.resumed_from(), checkpoint_path(dir.path(), 1));
  EXPECT_THAT(warnings, ::testing::AllOf(HasSubstr("skipping checkpoint '" + checkpoint_path(dir.path(), 2) + "'"),
                                       HasSubstr("CRC-32")));
  EXPECT_THAT(testing::error_message([&] {
                Checkpointer(CheckpointerOptions().resume(checkpoint_path(dir.path(), 2)), run_of("mlp"), nullptr)
                    .load_resume(1);
              }),
              ::testing::AllOf(HasSubstr(checkpoint_path(dir.path(), 2)), HasSubstr("fails its CRC-32 check")));
}

// Rank 0 found a checkpoint, rank 1 none (no shared directory): both refuse to train, before
// either reads one.
TEST(Checkpointer, RanksThatWouldResumeAtDifferentStepsBothRefuse) {
  testing::TempDir dir;
  TrainingPosition at;
  at.step = 5;
  Checkpointer(CheckpointerOptions().dir(dir.path()), run_of("mlp"), nullptr).save(at, *adam_strategy(0));
  testing::TempDir elsewhere;  // rank 1's own, empty directory
  std::vector<std::string> messages(2);
  testing::run_ranks(2, [&](int64_t rank, dist::ProcessGroup& group) {
    Checkpointer c(CheckpointerOptions().dir(rank == 0 ? dir.path() : elsewhere.path()).resume("latest"),
                   run_of("mlp"), &group);
    auto strategy = adam_strategy(0);
    messages[rank] = testing::error_message([&] { c.restore(c.load_resume(2), *strategy); });
  });
  EXPECT_THAT(messages[0], HasSubstr("rank 0 finds 1 checkpoint(s) in '" + dir.path() +
                                     "' but other ranks find between 0 and 1: every rank must see the same"));
  EXPECT_THAT(messages[1], HasSubstr("rank 1 finds 0 checkpoint(s) in '" + elsewhere.path() + "'"));
}

}  // namespace
}  // namespace lockstep::train
