// `lockstep train --strategy pipeline` and `--checkpoint-activations` end to end: real processes
// under `lockstep run`, against one process; convnet, and gpt-mini with its tied embedding.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "../test_util.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/train/options.h"
#include "text_corpus.h"

namespace lockstep::train {
namespace {

const std::string kCli = LOCKSTEP_CLI;

c10::Dict<c10::IValue, c10::IValue> load_state(const std::string& path) {
  return torch::pickle_load(read_file(path)).toGenericDict();
}

void expect_near_state(const std::string& a_path, const std::string& b_path, double tolerance) {
  auto a = load_state(a_path), b = load_state(b_path);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& entry : a) {
    ASSERT_TRUE(b.contains(entry.key())) << entry.key().toStringRef();
    const torch::Tensor ta = entry.value().toTensor().to(torch::kDouble), tb = b.at(entry.key()).toTensor().to(torch::kDouble);
    EXPECT_LE((ta - tb).abs().max().item<double>(), tolerance) << entry.key().toStringRef();
  }
}

// 2 stages x 4 micro-batches of a 40-sample batch == one process accumulating 4 micro-batches of
// 10 (the same samples: every stage reads the one replica's batches): the saved models, BatchNorm
// statistics included, agree within 1e-5 and hold the usual keys. Then the pipeline's checkpoint
// resumes under ddp on 2 ranks (weights and optimizer state in the whole model's layout).
TEST(PipelineTrain, TwoStagesEndWhereOneProcessAccumulatingEndsAndItsCheckpointResumesUnderDdp) {
  testing::TempDir dir;
  // One thread everywhere: oneDNN blocks a convolution by its thread count, and the ranks would
  // otherwise run with one thread each and the single process with two.
  const std::string common = " train --quiet --model convnet --data synthetic --limit 240 --seed 3 --threads 1";
  auto pipelined = testing::run_command(kCli + " run --nproc-per-node 2 -- " + kCli + common +
                                        " --epochs 1 --batch-size 40 --strategy pipeline --micro-batches 4 --schedule 1f1b"
                                        " --checkpoint-dir " + (dir / "ckpt") + " --save-model " + (dir / "pipe.pt"));
  ASSERT_EQ(pipelined.exit_code, 0) << pipelined.output;
  EXPECT_THAT(pipelined.output, ::testing::HasSubstr("\"world_size\":2"));
  auto one = testing::run_command(kCli + common + " --epochs 1 --batch-size 10 --accum-steps 4 --save-model " + (dir / "one.pt"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  expect_near_state(dir / "pipe.pt", dir / "one.pt", 1e-5);

  auto resumed = testing::run_command(kCli + " run --nproc-per-node 2 -- " + kCli + common +
                                      " --epochs 2 --batch-size 40 --strategy ddp --checkpoint-dir " + (dir / "ckpt") +
                                      " --resume latest");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output, ::testing::HasSubstr("resumed from"));
}

// 2 stages x 2 replicas on 4 ranks (Note [Pipeline replicas]) == ddp on 2 ranks accumulating 4
// micro-batches: each replica reads the DistributedSampler share a ddp rank reads, so the saved
// models agree within 1e-5, BatchNorm's running statistics included (both keep rank 0's / replica
// 0's). Every rank reports its figures in the summary.
TEST(PipelineTrain, TwoStagesTimesTwoReplicasEndWhereDdpAccumulatingEnds) {
  testing::TempDir dir;
  const std::string common = " train --quiet --model convnet --data synthetic --limit 160 --seed 5 --threads 1 --epochs 1";
  auto pipelined = testing::run_command(kCli + " run --nproc-per-node 4 -- " + kCli + common +
                                        " --batch-size 20 --strategy pipeline --stages 2 --micro-batches 4 --schedule gpipe"
                                        " --report-memory --save-model " + (dir / "pipe.pt"));
  ASSERT_EQ(pipelined.exit_code, 0) << pipelined.output;
  EXPECT_THAT(pipelined.output, ::testing::HasSubstr("\"world_size\":4"));
  EXPECT_THAT(pipelined.output, ::testing::HasSubstr("{\"rank\":3,"));
  EXPECT_THAT(pipelined.output, ::testing::HasSubstr("activations held for backward at most"));
  auto ddp = testing::run_command(kCli + " run --nproc-per-node 2 -- " + kCli + common +
                                  " --batch-size 5 --accum-steps 4 --strategy ddp --save-model " + (dir / "ddp.pt"));
  ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
  expect_near_state(dir / "pipe.pt", dir / "ddp.pt", 1e-5);
}

// gpt-mini through 2 stages, its tied embedding on both (Note [Tied weights across stages]), ==
// one process accumulating the same 4 micro-batches of 4 sequences: every line is cut to 8
// tokens, so a micro-batch's mean token loss weighs as its sequences do. The saved models agree
// within 1e-5 and hold one wte.weight and no lm_head.weight, as the unwrapped model's state dict.
TEST(PipelineTrain, GptMiniOnTwoStagesEndsWhereOneProcessAccumulatingEnds) {
  testing::TempDir dir;
  testing::write_grammar_corpus(dir / "corpus.txt", 200);
  const std::string common = " train --quiet --model gpt-mini --data text:" + (dir / "corpus.txt") +
                             " --vocab-size 300 --max-length 8 --n-layer 2 --n-head 2 --n-embd 32 --limit 160 --seed 4"
                             " --threads 1 --epochs 1 --optimizer adamw --lr 0.003";
  auto pipelined = testing::run_command(kCli + " run --nproc-per-node 2 -- " + kCli + common +
                                        " --batch-size 16 --strategy pipeline --micro-batches 4 --schedule 1f1b"
                                        " --save-model " + (dir / "pipe.pt"));
  ASSERT_EQ(pipelined.exit_code, 0) << pipelined.output;
  EXPECT_THAT(pipelined.output, ::testing::HasSubstr("\"perplexity\":"));
  auto one = testing::run_command(kCli + common + " --batch-size 4 --accum-steps 4 --save-model " + (dir / "one.pt"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  expect_near_state(dir / "pipe.pt", dir / "one.pt", 1e-5);
  const auto saved = load_state(dir / "pipe.pt");
  EXPECT_TRUE(saved.contains("wte.weight"));
  EXPECT_FALSE(saved.contains("lm_head.weight"));
}

// The run: gpt-mini on fortunes through a 2-stage pipeline trains, checkpoints, resumes
// under ddp, and ddp's checkpoint resumes in the pipeline (weights and the whole model's
// optimizer state both ways; the tokenizer beside the checkpoints).
TEST(PipelineTrain, GptMiniOnFortunesCheckpointResumesUnderDdpAndBack) {
  if (!std::filesystem::exists(kFortunesDir)) GTEST_SKIP() << "fortunes not installed (scripts/bootstrap)";
  testing::TempDir dir;
  const std::string run = kCli + " run --nproc-per-node 2 -- " + kCli +
                          " train --quiet --model gpt-mini --data fortunes --limit 96 --vocab-size 300 --max-length 32"
                          " --n-layer 2 --n-head 2 --n-embd 32 --batch-size 16 --seed 2 --checkpoint-dir " + (dir / "ckpt");
  auto pipelined = testing::run_command(run + " --epochs 1 --strategy pipeline --micro-batches 4 --schedule gpipe");
  ASSERT_EQ(pipelined.exit_code, 0) << pipelined.output;
  EXPECT_THAT(pipelined.output, ::testing::HasSubstr("\"perplexity\":"));
  EXPECT_TRUE(std::filesystem::exists(dir / "ckpt/tokenizer.json"));
  auto ddp = testing::run_command(run + " --epochs 2 --strategy ddp --resume latest");
  ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
  EXPECT_THAT(ddp.output, ::testing::HasSubstr("resumed from"));
  auto back = testing::run_command(run + " --epochs 3 --strategy pipeline --micro-batches 4 --resume latest");
  ASSERT_EQ(back.exit_code, 0) << back.output;
  EXPECT_THAT(back.output, ::testing::HasSubstr("resumed from"));
  EXPECT_THAT(back.output, ::testing::HasSubstr("\"perplexity\":"));
}

// --checkpoint-activations changes memory, not results: the same run with and without it saves
// the same model (BatchNorm statistics included), within 1e-5. The convnet keeps it fast; the
// ResNet-18 blocks are checked in tests/parallel/checkpoint_test.cpp.
TEST(PipelineTrain, CheckpointActivationsTrainsTheSameModel) {
  testing::TempDir dir;
  const std::string run = kCli + " train --quiet --model convnet --data synthetic --limit 64 --batch-size 16 --seed 4";
  auto plain = testing::run_command(run + " --save-model " + (dir / "plain.pt"));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  auto checkpointed = testing::run_command(run + " --checkpoint-activations --save-model " + (dir / "ckpt.pt"));
  ASSERT_EQ(checkpointed.exit_code, 0) << checkpointed.output;
  expect_near_state(dir / "plain.pt", dir / "ckpt.pt", 1e-5);
}

// Bad pipeline settings stop `lockstep train` before training, with the value and the fix.
TEST(PipelineTrain, BadSettingsFailBeforeTraining) {
  auto big = testing::run_command(kCli + " train --quiet --model mlp --data synthetic --limit 40 --batch-size 4"
                                  " --strategy pipeline --micro-batches 8");
  EXPECT_NE(big.exit_code, 0);
  EXPECT_THAT(big.output, ::testing::HasSubstr("--micro-batches 8 is larger than the batch (--batch-size 4)"));
  auto deep = testing::run_command(kCli + " train --quiet --model mlp --data synthetic --limit 40 --strategy pipeline"
                                   " --stages 3");
  EXPECT_NE(deep.exit_code, 0);
  EXPECT_THAT(deep.output, ::testing::HasSubstr("--stages 3 is more than the model's 2 blocks (fc1, fc2)"));
  auto uneven = testing::run_command(kCli + " run --nproc-per-node 3 -- " + kCli +
                                    " train --quiet --model mlp --data synthetic --limit 40 --strategy pipeline --stages 2");
  EXPECT_NE(uneven.exit_code, 0);
  EXPECT_THAT(uneven.output, ::testing::HasSubstr("the world size 3 is not divisible by --stages 2"));
  auto stray = testing::run_command(kCli + " train --quiet --model mlp --data synthetic --limit 40 --micro-batches 2");
  EXPECT_NE(stray.exit_code, 0);
  EXPECT_THAT(stray.output, ::testing::HasSubstr("add --strategy pipeline"));
}

}  // namespace
}  // namespace lockstep::train
