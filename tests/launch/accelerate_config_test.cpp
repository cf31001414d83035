// accelerate configs as `lockstep run` settings: accelerate's own templates and those of projects
// that publish them (tests/launch/configs/README.md names each file's source). See Note [accelerate configs].
#include "lockstep/launch/accelerate_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "../test_util.h"
#include "lockstep/parallel/strategy_registry.h"
#include "lockstep/train/options.h"

namespace lockstep::launch {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

const std::string kConfigs = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/launch/configs/";

struct Read {
  LaunchSettings settings;
  std::vector<std::string> warnings;
  std::map<std::string, std::string> env;  // the workers' LOCKSTEP_* variables
};

Read read(const std::string& path, bool strict = false) {
  Read r;
  r.settings = accelerate_launch_settings(
      path, AccelerateConfigOptions().strict(strict).reporter(
                [&r](ReportKind, const std::string& line) { r.warnings.push_back(line); }));
  for (const auto& [name, value] : r.settings.worker_env) r.env[name] = value;
  return r;
}

std::string write(const testing::TempDir& dir, const std::string& text) {
  std::ofstream(dir / "c.yaml") << text;
  return dir / "c.yaml";
}

// accelerate's multi_node template: num_processes is the total of both machines.
TEST(AccelerateConfig, NumProcessesCountsAllMachines) {
  const Read r = read(kConfigs + "accelerate-multi_node.yaml");
  EXPECT_EQ(r.settings.nnodes, 2);
  EXPECT_EQ(r.settings.nproc_per_node, 4);  // 8 over 2 machines
  EXPECT_EQ(r.settings.node_rank, 0);
  EXPECT_EQ(r.settings.master_addr, "1234");  // the template's placeholder, taken as written
  EXPECT_EQ(r.settings.master_port, 9999);
  EXPECT_EQ(r.env.at(kStrategyEnv), "ddp");
  EXPECT_TRUE(r.warnings.empty()) << r.warnings[0];
}

TEST(AccelerateConfig, TrainingKeysBecomeTheWorkersVariables) {
  const Read fsdp = read(kConfigs + "accelerate-fsdp.yaml");
  EXPECT_EQ(fsdp.settings.nproc_per_node, 2);
  EXPECT_EQ(fsdp.env.at(kStrategyEnv), "fsdp");  // FULL_SHARD
  EXPECT_EQ(fsdp.env.at(kPrecisionEnv), "bf16");
  const Read fsdp2 = read(kConfigs + "trl-fsdp2.yaml");  // fsdp_reshard_after_forward: true
  EXPECT_EQ(fsdp2.env.at(kStrategyEnv), "fsdp");
  EXPECT_EQ(read(kConfigs + "trl-deepspeed_zero1.yaml").env.at(kStrategyEnv), "zero1");
  EXPECT_EQ(read(kConfigs + "trl-deepspeed_zero1.yaml").env.at(kAccumStepsEnv), "1");
  EXPECT_EQ(read(kConfigs + "trl-deepspeed_zero2.yaml").env.at(kStrategyEnv), "zero2");
  EXPECT_EQ(read(kConfigs + "alignment-handbook-zero3.yaml").env.at(kStrategyEnv), "fsdp");
  const Read ds = read(kConfigs + "accelerate-deepspeed.yaml");
  EXPECT_EQ(ds.env.at(kDeepSpeedConfigEnv), "../deepspeed_config_templates/zero_stage1_config.json");
  EXPECT_EQ(read(kConfigs + "accelerate-single_accelerator.yaml").env.at(kStrategyEnv), "local");
}

TEST(AccelerateConfig, UnsupportedKeysWarnOrFailWhenStrict) {
  testing::TempDir dir;
  const std::string path = write(dir, "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n"
                                      "  zero_stage: 3\n  offload_optimizer_device: cpu\n"
                                      "dynamo_config:\n  dynamo_backend: INDUCTOR\n");
  const Read r = read(path);
  ASSERT_EQ(r.warnings.size(), 2u);
  EXPECT_THAT(r.warnings[0], HasSubstr("deepspeed_config.offload_optimizer_device cpu: lockstep does not offload"));
  EXPECT_THAT(r.warnings[1], HasSubstr("dynamo_config: LibTorch has no torch.compile"));
  EXPECT_EQ(r.env.at(kStrategyEnv), "fsdp");  // the supported keys still apply
  const std::string strict = testing::error_message([&] { read(path, /*strict=*/true); });
  EXPECT_THAT(strict, HasSubstr("2 key(s) lockstep does not support (strict)"));
  EXPECT_THAT(strict, HasSubstr("offload_optimizer_device"));
  EXPECT_THAT(read(kConfigs + "accelerate-fp8.yaml").warnings, Contains(HasSubstr("mixed_precision fp8")));
}

TEST(AccelerateConfig, BadValuesAreErrorsNamingTheKey) {
  testing::TempDir dir;
  EXPECT_THAT(testing::error_message([&] { read(write(dir, "distributed_type: MULTI_CPU\nnum_processes: 3\nnum_machines: 2\n")); }),
              HasSubstr("num_processes 3 is not a multiple of num_machines 2"));
  EXPECT_THAT(testing::error_message([&] { read(write(dir, "distributed_type: MULTI_CPU\nnum_machines: 2\nmachine_rank: 2\n")); }),
              HasSubstr("machine_rank 2 is outside [0, 2)"));
  EXPECT_THAT(testing::error_message([&] { read(write(dir, "distributed_type: SOMETHING\n")); }),
              HasSubstr("distributed_type 'SOMETHING' is not one of accelerate's"));
  EXPECT_THAT(testing::error_message([&] { read(write(dir, "num_processes: 2\n")); }), HasSubstr("no distributed_type"));
  EXPECT_THAT(testing::error_message([&] { read(dir / "missing.yaml"); }), HasSubstr("cannot read the accelerate config"));
}

// PyYAML (so accelerate) keeps a key's last value, yaml-cpp's lookup finds the first: a key given
// twice in one mapping is an error naming both lines, not a silent choice.
TEST(AccelerateConfig, DuplicateKeysAreErrorsNamingBothLines) {
  testing::TempDir dir;
  EXPECT_THAT(testing::error_message([&] {
                read(write(dir, "distributed_type: MULTI_CPU\nmixed_precision: bf16\nnum_processes: 2\n"
                                "mixed_precision: fp16\n"));
              }),
              HasSubstr("c.yaml, line 4: mixed_precision is given twice (lines 2 and 4)"));
  EXPECT_THAT(testing::error_message([&] {
                read(write(dir, "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n"
                                "  gradient_clipping: 1.0\n  zero_stage: 3\n"));
              }),
              HasSubstr("c.yaml, line 5: deepspeed_config.zero_stage is given twice (lines 3 and 5)"));
  EXPECT_THAT(testing::error_message([&] { read(write(dir, "{distributed_type: NO, distributed_type: FSDP}\n")); }),
              HasSubstr("distributed_type is given twice (lines 1 and 1)"));
  // The same key in different mappings, and an alias of a mapping, are no duplicates.
  const Read r = read(write(dir, "distributed_type: MULTI_CPU\ntpu_env:\n  - {name: a}\n  - {name: b}\n"
                                 "fsdp_config: &shared\n  fsdp_offload_params: false\nmegatron_lm_config: *shared\n"));
  EXPECT_EQ(r.env.at(kStrategyEnv), "ddp");
}

// yaml-cpp's parser recurses with a depth guard: a value nested a million levels deep (and 500,
// past its guard) is refused naming the file, the line and the nesting. Before: "bad file", the
// guard's message, which names neither.
TEST(AccelerateConfig, NestingAMillionLevelsDeepIsRefusedNamingTheNesting) {
  testing::TempDir dir;
  for (const size_t levels : {size_t{500}, size_t{1000000}}) {
    const std::string text =
        "distributed_type: MULTI_CPU\nx: " + std::string(levels, '[') + std::string(levels, ']') + "\n";
    EXPECT_THAT(testing::error_message([&] { read(write(dir, text)); }),
                HasSubstr("c.yaml is not valid YAML (line 2): collections nested deeper than yaml-cpp reads (about 500 "
                          "levels)"))
        << levels;
  }
  const std::string hundred = std::string(100, '[') + std::string(100, ']');
  EXPECT_NO_THROW(read(write(dir, "distributed_type: MULTI_CPU\nx: " + hundred + "\n")));
}

// Values are bounded before they are used or echoed: a host name by RFC 1035's 253 bytes, any value
// by a path's 4096; the error names the key and the length, never the value.
TEST(AccelerateConfig, LongValuesAreRefusedByLengthWithoutEchoingThem) {
  testing::TempDir dir;
  const std::string ip = testing::error_message(
      [&] { read(write(dir, "distributed_type: MULTI_CPU\nmain_process_ip: " + std::string(300, 'a') + "\n")); });
  EXPECT_THAT(ip, HasSubstr("c.yaml, line 2: main_process_ip is 300 bytes long; a host name is at most 253 bytes "
                            "(RFC 1035)"));
  EXPECT_THAT(ip, ::testing::Not(HasSubstr("aaaa")));
  const std::string longest(253, 'h');
  EXPECT_EQ(read(write(dir, "distributed_type: MULTI_CPU\nmain_process_ip: " + longest + "\n")).settings.master_addr,
            longest);
  const std::string huge = testing::error_message([&] {
    read(write(dir, "distributed_type: MULTI_CPU\nmain_process_ip: " + std::string(10 << 20, '1') + "\n"));
  });
  EXPECT_THAT(huge, HasSubstr("c.yaml, line 2: main_process_ip is 10485760 bytes long"));
  EXPECT_LT(huge.size(), 1000u);
  EXPECT_THAT(testing::error_message([&] { read(write(dir, "distributed_type: " + std::string(5000, 'M') + "\n")); }),
              HasSubstr("line 1: distributed_type is 5000 bytes long; an accelerate config's keys and values"));
  // An implicit key is at most 1024 characters (YAML 1.2); an explicit one (`? key`) has no limit.
  EXPECT_THAT(testing::error_message([&] { read(write(dir, "? " + std::string(5000, 'k') + "\n: 1\n")); }),
              HasSubstr("line 1: a key in the top level is 5000 bytes long"));
}

// The launchers meet on main_process_port + 1 (Note [Launcher rendezvous port]): 65535 leaves
// them none, and the error says so and which ports work.
TEST(AccelerateConfig, PortsLeaveRoomForTheLaunchersPort) {
  testing::TempDir dir;
  const std::string error =
      testing::error_message([&] { read(write(dir, "distributed_type: MULTI_CPU\nmain_process_port: 65535\n")); });
  EXPECT_THAT(error, HasSubstr("c.yaml, line 2: main_process_port 65535 leaves no port for the launchers"));
  EXPECT_THAT(error, HasSubstr("meet on the next port (main_process_port + 1), so give a port in [1, 65534], or 0"));
  EXPECT_EQ(read(write(dir, "distributed_type: MULTI_CPU\nmain_process_port: 65534\n")).settings.master_port, 65534);
}

// Every config kept under tests/launch/configs parses, and the strategy and precision it hands to
// the workers are names `lockstep train` accepts.
TEST(AccelerateConfig, PublicProjectsConfigsAllParse) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kConfigs)) {
    if (entry.path().extension() != ".yaml") continue;
    ++files;
    Read r;
    ASSERT_NO_THROW(r = read(entry.path())) << entry.path();
    EXPECT_TRUE(r.settings.nproc_per_node.has_value() || r.env.at(kStrategyEnv) == "local") << entry.path();
    if (r.env.count(kStrategyEnv))
      EXPECT_THAT(parallel::strategy_names(), Contains(r.env.at(kStrategyEnv))) << entry.path();
    if (r.env.count(kPrecisionEnv))
      EXPECT_THAT(train::precision_names(), Contains(r.env.at(kPrecisionEnv))) << entry.path();
  }
  EXPECT_GE(files, 14);
}

// `lockstep run --config`: the config's num_processes start the workers, its precision reaches
// them; a flag given explicitly wins over the file, and the file over the environment.
TEST(AccelerateConfig, RunStartsWhatTheConfigSaysAndFlagsWin) {
  const std::string cli = LOCKSTEP_CLI;
  const std::string program = " -- sh -c 'echo rank $RANK of $WORLD_SIZE $LOCKSTEP_PRECISION $LOCKSTEP_STRATEGY'";
  auto r = testing::run_command(cli + " run --config " + kConfigs + "accelerate-fsdp.yaml" + program);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("[rank 0] rank 0 of 2 bf16 fsdp"));
  EXPECT_THAT(r.output, HasSubstr("[rank 1] rank 1 of 2 bf16 fsdp"));
  EXPECT_THAT(r.output, HasSubstr("nproc per node 2 from num_processes 2 / num_machines 1"));
  r = testing::run_command(cli + " run --nproc-per-node 1 --config " + kConfigs + "accelerate-fsdp.yaml" + program);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 0 of 1 bf16 fsdp"));
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("rank 1")));
  // The environment (a PyTorchJob's PET_NPROC_PER_NODE) gives way to the config, and fills in
  // what nothing else gives.
  r = testing::run_command("PET_NPROC_PER_NODE=3 " + cli + " run --config " + kConfigs + "accelerate-fsdp.yaml" + program);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 1 of 2 bf16 fsdp"));
  r = testing::run_command("PET_NPROC_PER_NODE=3 " + cli + " run" + program);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 2 of 3"));
}

}  // namespace
}  // namespace lockstep::launch
