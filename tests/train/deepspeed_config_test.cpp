// DeepSpeed JSON configs as TrainOptions: the batch rule, "auto", conflicts with explicit values,
// unsupported keys, and real configs from public projects (tests/train/ds_configs/README.md).
// See Note [DeepSpeed configs].
#include "lockstep/train/deepspeed_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../launch/engine_runs.h"
#include "../test_util.h"

namespace lockstep::train {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using nlohmann::json;

const std::string kConfigs = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/train/ds_configs/";

struct Applied {
  TrainOptions options;
  std::vector<std::string> warnings;
};

Applied apply_config(const json& config, int64_t world = 1, ExplicitTrainValues given = {}, TrainOptions base = {},
              bool strict = false) {
  Applied a;
  a.options = with_deepspeed_config(
      std::move(base), config, "ds.json",
      DeepSpeedConfigOptions().world_size(world).given(given).strict(strict).reporter(
          [&a](ReportKind, const std::string& line) { a.warnings.push_back(line); }));
  return a;
}

std::string error_of(const json& config, int64_t world = 1, ExplicitTrainValues given = {}, TrainOptions base = {}) {
  return testing::error_message([&] { apply_config(config, world, given, std::move(base)); });
}

// The error of the config file at `path` ("<no error>" when it applies), warnings dropped.
std::string file_error(const std::string& path) {
  return testing::error_message([&] {
    with_deepspeed_config_file(TrainOptions(), path,
                               DeepSpeedConfigOptions().reporter([](ReportKind, const std::string&) {}));
  });
}

// train_batch_size = micro x accumulation x world size: any two give the third (DeepSpeed's rule).
TEST(DeepSpeedConfig, AnyTwoBatchSizesGiveTheThird) {
  auto t = apply_config({{"train_batch_size", 64}, {"train_micro_batch_size_per_gpu", 8}}, 4).options.trainer();
  EXPECT_EQ(t.batch_size(), 8);
  EXPECT_EQ(t.accum_steps(), 2);
  t = apply_config({{"train_batch_size", 64}, {"gradient_accumulation_steps", 4}}, 2).options.trainer();
  EXPECT_EQ(t.batch_size(), 8);
  EXPECT_EQ(t.accum_steps(), 4);
  t = apply_config({{"train_batch_size", 64}}, 4).options.trainer();  // accumulation 1, as DeepSpeed
  EXPECT_EQ(t.batch_size(), 16);
  EXPECT_EQ(t.accum_steps(), 1);
  t = apply_config({{"train_micro_batch_size_per_gpu", 5}, {"gradient_accumulation_steps", 3}}, 4).options.trainer();
  EXPECT_EQ(t.batch_size(), 5);
  EXPECT_EQ(t.accum_steps(), 3);
}

TEST(DeepSpeedConfig, BatchSizesThatDisagreeWithTheWorldSizeAreNamed) {
  const std::string all_three = error_of(
      {{"train_batch_size", 64}, {"train_micro_batch_size_per_gpu", 8}, {"gradient_accumulation_steps", 2}}, 2);
  EXPECT_THAT(all_three, HasSubstr("train_batch_size 64 is not train_micro_batch_size_per_gpu 8 x "
                                   "gradient_accumulation_steps 2 x world size 2"));
  EXPECT_THAT(all_three, HasSubstr("= 32; set train_batch_size to 32"));
  EXPECT_THAT(error_of({{"train_batch_size", 60}, {"train_micro_batch_size_per_gpu", 8}}, 2),
              HasSubstr("train_batch_size 60 is not divisible by train_micro_batch_size_per_gpu 8 x world size 2"));
  EXPECT_THAT(error_of({{"train_batch_size", 10}}, 4), HasSubstr("train_batch_size 10 is not divisible by the world size 4"));
  EXPECT_THAT(error_of({{"train_micro_batch_size_per_gpu", 2.5}}), HasSubstr("give a whole number"));
}

// "auto" takes the command line's value (or lockstep's default), as the HF Trainer fills it.
TEST(DeepSpeedConfig, AutoTakesTheCommandLinesValue) {
  TrainOptions base;
  base.trainer().batch_size(12).accum_steps(2);
  base.lr(0.05);
  const json config{{"train_batch_size", "auto"}, {"train_micro_batch_size_per_gpu", "auto"},
                    {"gradient_accumulation_steps", "auto"}, {"gradient_clipping", "auto"},
                    {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", "auto"}, {"weight_decay", "auto"}}}}},
                    {"bf16", {{"enabled", "auto"}}}};
  ExplicitTrainValues given;
  given.batch_size = given.accum_steps = given.lr = true;
  const TrainOptions o = apply_config(config, 2, given, base).options;
  EXPECT_EQ(o.trainer().batch_size(), 12);
  EXPECT_EQ(o.trainer().accum_steps(), 2);
  EXPECT_EQ(o.optimizer_options().lr(), 0.05);
  EXPECT_EQ(o.optimizer().kind(), optim::OptimizerKind::kAdamW);
  EXPECT_EQ(o.precision(), Precision::kFp32);
}

// A value in the file and a different one given explicitly: the run stops naming both.
TEST(DeepSpeedConfig, ExplicitValuesThatDisagreeWithTheFileAreErrors) {
  TrainOptions base;
  base.trainer().batch_size(32);
  ExplicitTrainValues given;
  given.batch_size = true;
  EXPECT_THAT(error_of({{"train_micro_batch_size_per_gpu", 16}}, 1, given, base),
              HasSubstr("train_micro_batch_size_per_gpu is 16 but batch size 32 was given explicitly"));
  // The same value, or the default (not given), is no conflict.
  EXPECT_EQ(apply_config({{"train_micro_batch_size_per_gpu", 32}}, 1, given, base).options.trainer().batch_size(), 32);
  EXPECT_EQ(apply_config({{"train_micro_batch_size_per_gpu", 16}}, 1, {}, base).options.trainer().batch_size(), 16);
  base.trainer().strategy(parallel::StrategyKind::kZero1);
  given.strategy = true;
  EXPECT_THAT(error_of({{"zero_optimization", {{"stage", 3}}}}, 2, given, base),
              HasSubstr("zero_optimization.stage 3 (strategy) is fsdp but strategy zero1 was given explicitly"));
}

TEST(DeepSpeedConfig, ZeroStagesAreStrategies) {
  EXPECT_FALSE(apply_config({{"zero_optimization", {{"stage", 0}}}}, 2).options.trainer().strategy().has_value());
  EXPECT_EQ(apply_config({{"zero_optimization", {{"stage", 1}}}}, 2).options.trainer().strategy(), parallel::StrategyKind::kZero1);
  EXPECT_EQ(apply_config({{"zero_optimization", {{"stage", 2}}}}, 2).options.trainer().strategy(), parallel::StrategyKind::kZero2);
  EXPECT_EQ(apply_config({{"zero_optimization", {{"stage", 3}}}}, 2).options.trainer().strategy(), parallel::StrategyKind::kFsdp);
  EXPECT_THAT(error_of({{"zero_optimization", {{"stage", 4}}}}), HasSubstr("zero_optimization.stage is 4"));
  // One process: sharding over one rank is none; the run is a local one, as DeepSpeed's would be.
  EXPECT_FALSE(apply_config({{"zero_optimization", {{"stage", 3}}}}, 1).options.trainer().strategy().has_value());
}

TEST(DeepSpeedConfig, PrecisionClippingOptimizerAndSchedule) {
  const json config{
      {"bf16", {{"enabled", true}}},
      {"gradient_clipping", 1.0},
      {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 3e-4}, {"betas", {0.8, 0.95}}, {"eps", 1e-6}}}}},
      {"scheduler", {{"type", "WarmupCosineLR"},
                     {"params", {{"total_num_steps", 100}, {"warmup_num_steps", 10}, {"warmup_type", "linear"},
                                 {"cos_min_ratio", 0.1}}}}}};
  const Applied a = apply_config(config);
  const TrainOptions& o = a.options;
  EXPECT_EQ(o.precision(), Precision::kBf16);
  EXPECT_EQ(o.trainer().strategy_options().clip_norm(), 1.0);
  EXPECT_EQ(o.optimizer().kind(), optim::OptimizerKind::kAdamW);  // DeepSpeed's Adam: adam_w_mode defaults to true
  EXPECT_EQ(o.optimizer_options().weight_decay().value(), 0.0);   // DeepSpeed's default, not AdamW's 0.01
  EXPECT_DOUBLE_EQ(o.optimizer_options().lr(), 3e-4);
  EXPECT_EQ(o.optimizer().beta1(), 0.8);
  EXPECT_EQ(o.optimizer().eps(), 1e-6);
  EXPECT_EQ(o.lr_schedule().kind(), LrScheduleKind::kCosine);
  EXPECT_EQ(o.lr_schedule().total_steps(), 100);
  EXPECT_EQ(o.lr_schedule().warmup_steps(), 10);
  EXPECT_DOUBLE_EQ(o.lr_schedule().eta_min(), 3e-5);
  EXPECT_TRUE(a.warnings.empty()) << a.warnings[0];
  const json adam{{"optimizer", {{"type", "Adam"}, {"params", {{"adam_w_mode", false}}}}}};
  EXPECT_EQ(apply_config(adam).options.optimizer().kind(), optim::OptimizerKind::kAdam);
  const TrainOptions sgd = apply_config({{"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}}}).options;
  EXPECT_EQ(sgd.optimizer_options().momentum(), 0.0);  // torch.optim.SGD's, not lockstep's 0.9
  const TrainOptions warm = apply_config({{"scheduler", {{"type", "WarmupLR"},
                                                  {"params", {{"warmup_max_lr", 0.01}, {"warmup_num_steps", 5}}}}}})
                                .options;
  EXPECT_EQ(warm.lr_schedule().kind(), LrScheduleKind::kConstant);
  EXPECT_EQ(warm.lr_schedule().warmup_steps(), 5);
  EXPECT_EQ(warm.optimizer_options().lr(), 0.01);
  // fp16 is applied as asked; a CPU run refuses it at start (see the CLI test below).
  const TrainOptions fp16 = apply_config({{"fp16", {{"enabled", true}, {"loss_scale", 0}}}}).options;
  EXPECT_EQ(fp16.precision(), Precision::kFp16);
  EXPECT_EQ(fp16.loss_scale(), "dynamic");
}

TEST(DeepSpeedConfig, UnsupportedKeysWarnOrFailWhenStrict) {
  const json config{{"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "nvme"}}},
                                           {"overlap_comm", true}}},
                    {"optimizer", {{"type", "OneBitAdam"}}},
                    {"wandb", {{"enabled", true}}},
                    {"flops_profiler", {{"enabled", false}}}};
  const Applied a = apply_config(config, 2);
  ASSERT_EQ(a.warnings.size(), 3u) << c10::Join("\n", a.warnings);
  EXPECT_THAT(a.warnings[0], HasSubstr("ds.json: zero_optimization.offload_optimizer.device \"nvme\": lockstep does not offload"));
  EXPECT_THAT(a.warnings[1], HasSubstr("optimizer.type OneBitAdam: lockstep has SGD, Adam and AdamW"));
  EXPECT_THAT(a.warnings[2], HasSubstr("wandb: lockstep logs to JSONL and TensorBoard only"));
  EXPECT_EQ(a.options.trainer().strategy(), parallel::StrategyKind::kZero2);  // the rest applies
  const std::string strict = testing::error_message([&] { apply_config(config, 2, {}, {}, /*strict=*/true); });
  EXPECT_THAT(strict, HasSubstr("3 setting(s) lockstep does not support (strict)"));
}

// A section lockstep reads, of the wrong type, is an error strict or not: skipped, "bf16": true
// and "optimizer": "AdamW" trained fp32 with SGD and exited 0.
TEST(DeepSpeedConfig, SectionsOfTheWrongTypeAreErrorsEvenWhenNotStrict) {
  EXPECT_THAT(error_of({{"bf16", true}}),
              HasSubstr("ds.json: bf16 is true; it is a section: write it as an object such as {\"enabled\": true}"));
  EXPECT_THAT(error_of({{"optimizer", "AdamW"}}), HasSubstr("ds.json: optimizer is \"AdamW\"; it is a section"));
  EXPECT_THAT(error_of({{"zero_optimization", "yes"}}, 2), HasSubstr("ds.json: zero_optimization is \"yes\""));
  EXPECT_THAT(error_of({{"optimizer", {{"type", "Adam"}, {"params", {{"adam_w_mode", "no"}}}}}}),
              HasSubstr("optimizer.params.adam_w_mode is \"no\"; give true or false"));
  EXPECT_THAT(error_of({{"optimizer", {{"type", "SGD"}, {"params", json::array({0.1})}}}}), HasSubstr("optimizer.params is an array"));
  EXPECT_THAT(error_of({{"tensorboard", {{"enabled", true}, {"output_path", 5}}}}),
              HasSubstr("tensorboard.output_path is 5; give a string such as \"runs\""));
  EXPECT_THAT(error_of({{"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_type", 1}}}}}}),
              HasSubstr("scheduler.params.warmup_type is 1; give a string such as \"linear\""));
  const std::string long_value = error_of({{"amp", std::string(100000, 'x')}});
  EXPECT_THAT(long_value, HasSubstr("amp is \"xxxx"));
  EXPECT_LT(long_value.size(), 1000u);  // cut, not echoed
  // DeepSpeed still reads zero_optimization's old boolean form: true is stage 1, false stage 0.
  EXPECT_EQ(apply_config({{"zero_optimization", true}}, 2).options.trainer().strategy(), parallel::StrategyKind::kZero1);
  EXPECT_FALSE(apply_config({{"zero_optimization", false}}, 2).options.trainer().strategy().has_value());
  // null is an absent section, as before.
  EXPECT_EQ(apply_config({{"bf16", nullptr}, {"optimizer", nullptr}}).options.precision(), Precision::kFp32);
  // From a file, the message gives the key's line; `lockstep train` exits 2 with it.
  testing::TempDir dir;
  std::ofstream(dir / "ds.json") << "{\n  \"train_batch_size\": 8,\n  \"fp16\": [true]\n}\n";
  EXPECT_THAT(file_error(dir / "ds.json"), HasSubstr("ds.json, line 3: fp16 is an array; it is a section"));
  const auto r = testing::run_command(std::string(LOCKSTEP_CLI) + " train --quiet --model mlp --data synthetic "
                                      "--limit 40 --deepspeed " + (dir / "ds.json"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("line 3: fp16 is an array"));
}

// DeepSpeed refuses a key given twice in one object (Python's json alone would keep the last).
TEST(DeepSpeedConfig, DuplicateKeysAreErrorsNamingBothLines) {
  testing::TempDir dir;
  std::ofstream(dir / "top.json") << "{\n  \"bf16\": {\"enabled\": true},\n  \"train_batch_size\": 8,\n"
                                     "  \"bf16\": {\"enabled\": false}\n}\n";
  EXPECT_THAT(file_error(dir / "top.json"), HasSubstr("top.json, line 4: bf16 is given twice (lines 2 and 4)"));
  std::ofstream(dir / "nested.json") << "{\"zero_optimization\": {\"stage\": 2,\n  // a comment\n  \"stage\": 3}}";
  EXPECT_THAT(file_error(dir / "nested.json"),
              HasSubstr("nested.json, line 3: zero_optimization.stage is given twice (lines 1 and 3)"));
  // The same key in different objects (and in the objects of an array) is no duplicate.
  std::ofstream(dir / "ok.json") << R"({"bf16": {"enabled": false}, "fp16": {"enabled": false},
      "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "scheduler": {"type": "WarmupLR",
      "params": {"warmup_num_steps": 5, "warmup_type": "linear"}}, "x": [{"a": 1}, {"a": 2}]})";
  EXPECT_EQ(file_error(dir / "ok.json"), "<no error>");
}

// A number beyond a double (Python reads 1e400 as inf) names the file, the key and the line.
TEST(DeepSpeedConfig, NumbersBeyondADoubleNameTheFileKeyAndLine) {
  testing::TempDir dir;
  std::ofstream(dir / "big.json") << "{\n  \"train_batch_size\": 8,\n  \"gradient_clipping\": 1e400\n}\n";
  const std::string error = file_error(dir / "big.json");
  EXPECT_THAT(error, HasSubstr("big.json, line 3: gradient_clipping: number overflow parsing '1e400'"));
  EXPECT_THAT(error, HasSubstr("give a finite number"));
  std::ofstream(dir / "betas.json") << R"({"optimizer": {"params": {"betas": [0.9, -1e400]}}})";
  EXPECT_THAT(file_error(dir / "betas.json"), HasSubstr("line 1: optimizer.params.betas[1]: number overflow parsing"));
}

// A count past int64's range was cast to it before it was checked: undefined behaviour (found by
// the deepspeed_config fuzz target under UBSan, fuzz/crashes/deepspeed_config/). Now compared as a
// double first and refused naming the file and the key; 2^63 - 1024, a double below 2^63, is whole.
TEST(DeepSpeedConfig, CountsPastInt64AreRefusedBeforeTheyAreCast) {
  testing::TempDir dir;
  for (const char* big : {"256444444444444444444444444444", "9223372036854775808", "1e19"}) {
    std::ofstream(dir / "big.json") << "{\"train_batch_size\": " << big << "}";
    EXPECT_THAT(file_error(dir / "big.json"),
                AllOf(HasSubstr("big.json: train_batch_size is "),
                      HasSubstr("give a whole number of at least 1 and below 2^63")))
        << big;
  }
  std::ofstream(dir / "fraction.json") << R"({"train_batch_size": 8.5})";
  EXPECT_THAT(file_error(dir / "fraction.json"), HasSubstr("train_batch_size is 8.5; give a whole number"));
}

// Nesting is refused past 100 levels while parsing, so a million levels cost no more than 100.
TEST(DeepSpeedConfig, NestingAMillionLevelsDeepIsRefused) {
  testing::TempDir dir;
  const int64_t levels = 1000000;
  std::string objects;
  for (int64_t i = 0; i < levels; ++i) objects += "{\"a\": ";
  std::ofstream(dir / "objects.json") << objects << 1 << std::string(levels, '}');
  EXPECT_THAT(file_error(dir / "objects.json"), HasSubstr("line 1: a.a.a.a"));
  EXPECT_THAT(file_error(dir / "objects.json"), HasSubstr("nests more than 100 levels deep"));
  std::ofstream(dir / "arrays.json") << "{\"x\": " << std::string(levels, '[') << std::string(levels, ']') << "}";
  EXPECT_THAT(file_error(dir / "arrays.json"), HasSubstr("x[0][0][0]"));
}

// Every config kept under tests/train/ds_configs applies to TrainOptions that validate, on a world
// of 2 (or the one its batch sizes need); the ones with offload say so.
TEST(DeepSpeedConfig, PublicProjectsConfigsAllApply) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kConfigs)) {
    if (entry.path().extension() != ".json") continue;
    ++files;
    std::vector<std::string> warnings;
    const auto how = DeepSpeedConfigOptions().world_size(1).reporter(
        [&](ReportKind, const std::string& line) { warnings.push_back(line); });
    TrainOptions o;
    ASSERT_NO_THROW(o = with_deepspeed_config_file(TrainOptions(), entry.path(), how)) << entry.path();
    EXPECT_NO_THROW(o.validate()) << entry.path();
    const std::string text = testing::read_text(entry.path());
    const bool offloads = text.find("\"device\": \"cpu\"") != std::string::npos;
    if (offloads) EXPECT_THAT(warnings, ::testing::Contains(HasSubstr("does not offload"))) << entry.path();
  }
  EXPECT_GE(files, 14);
}

// `lockstep train --deepspeed`: a stage-2 config with clipping trains exactly as the same flags do;
// fp16 is refused on CPU with --precision fp16's hint.
TEST(DeepSpeedConfig, TrainWithAConfigEqualsTheSameFlags) {
  testing::TempDir dir;
  std::ofstream(dir / "ds.json") << R"({"train_batch_size": 40, "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 2, "overlap_comm": true}, "gradient_clipping": 0.5,
    "optimizer": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}}})";
  const std::string cli = LOCKSTEP_CLI;
  const std::string common = " train --quiet --model mlp --data synthetic --limit 400 --seed 3 --threads 1 --log-every 1";
  auto config = testing::run_command(cli + " run --nproc-per-node 2 -- " + cli + common + " --deepspeed " +
                                     (dir / "ds.json") + " --log-jsonl " + (dir / "config.jsonl"));
  ASSERT_EQ(config.exit_code, 0) << config.output;
  auto flags = testing::run_command(cli + " run --nproc-per-node 2 -- " + cli + common +
                                    " --strategy zero2 --batch-size 20 --clip-norm 0.5 --lr 0.05 --log-jsonl " +
                                    (dir / "flags.jsonl"));
  ASSERT_EQ(flags.exit_code, 0) << flags.output;
  EXPECT_THAT(testing::read_text(dir / "config.jsonl"), HasSubstr("\"strategy\":\"zero2\""));
  const std::vector<double> expected = testing::step_losses(dir / "flags.jsonl");
  ASSERT_EQ(expected.size(), 10u);
  EXPECT_EQ(testing::step_losses(dir / "config.jsonl"), expected);  // exact: the same options

  // fp16 trains on CPU with LibTorch 2.x: the config's "fp16" is --precision fp16, step for step.
  std::ofstream(dir / "fp16.json") << R"({"fp16": {"enabled": true}})";
  auto fp16 = testing::run_command(cli + common + " --deepspeed " + (dir / "fp16.json") + " --log-jsonl " +
                                   (dir / "fp16_config.jsonl"));
  auto flag = testing::run_command(cli + common + " --precision fp16 --log-jsonl " + (dir / "fp16_flag.jsonl"));
  ASSERT_EQ(fp16.exit_code, 0) << fp16.output;
  ASSERT_EQ(flag.exit_code, 0) << flag.output;
  const std::vector<double> fp16_losses = testing::step_losses(dir / "fp16_flag.jsonl");
  ASSERT_FALSE(fp16_losses.empty());
  EXPECT_EQ(testing::step_losses(dir / "fp16_config.jsonl"), fp16_losses);
  auto conflict = testing::run_command(cli + common + " --batch-size 10 --deepspeed " + (dir / "ds.json"));
  EXPECT_EQ(conflict.exit_code, 2) << conflict.output;
  EXPECT_THAT(conflict.output, HasSubstr("train_micro_batch_size_per_gpu"));
}

}  // namespace
}  // namespace lockstep::train
