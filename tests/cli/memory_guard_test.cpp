// `lockstep train` under a real cgroup memory limit: refused with the plan's breakdown below the
// plan's peak, trained above it (see Note [Memory available to a rank]).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <optional>
#include <unistd.h>

#include "../test_util.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;
using testing::run_command;
namespace fs = std::filesystem;

const std::string kCli = LOCKSTEP_CLI;
const std::string kRun = " --model mlp --data synthetic --limit 200 --epochs 1 --quiet";

// A child of this process's memory cgroup (v2, or v1 where the memory controller is mounted
// apart), removed at the end; nullopt when this host does not let the test make one.
class ChildCgroup {
 public:
  static std::optional<ChildCgroup> make(std::string* why) {
    std::ifstream in("/proc/self/cgroup");
    std::string line, v2, v1;
    while (std::getline(in, line)) {
      const size_t a = line.find(':'), b = line.find(':', a + 1);
      if (line.rfind("0::", 0) == 0) v2 = line.substr(3);
      if (line.substr(a + 1, b - a - 1) == "memory") v1 = line.substr(b + 1);
    }
    std::vector<std::pair<fs::path, std::string>> candidates;
    if (!v1.empty()) candidates.push_back({fs::path("/sys/fs/cgroup/memory") / v1.substr(1), "memory.limit_in_bytes"});
    if (!v2.empty()) candidates.push_back({fs::path("/sys/fs/cgroup") / v2.substr(1), "memory.max"});
    for (const auto& [parent, file] : candidates) {
      const fs::path dir = parent / ("lockstep-test-" + std::to_string(::getpid()));
      std::error_code error;
      if (!fs::create_directory(dir, error) || !fs::exists(dir / file)) {
        fs::remove(dir, error);
        continue;
      }
      return ChildCgroup(dir, file);
    }
    *why = "no writable memory cgroup under this process's (/proc/self/cgroup: v2 '" + v2 + "', v1 memory '" + v1 + "')";
    return std::nullopt;
  }
  ChildCgroup(ChildCgroup&& other) noexcept : dir_(std::move(other.dir_)), file_(other.file_) { other.dir_.clear(); }
  ~ChildCgroup() {
    std::error_code error;
    if (!dir_.empty()) fs::remove(dir_, error);  // empty again once its processes ended
  }

  void limit(int64_t bytes) const { std::ofstream(dir_ / file_) << bytes; }
  // `command`, started inside the cgroup.
  std::string inside(const std::string& command) const {
    return "sh -c 'echo $$ > " + (dir_ / "cgroup.procs").string() + " && exec " + command + "'";
  }

 private:
  ChildCgroup(fs::path dir, std::string file) : dir_(std::move(dir)), file_(std::move(file)) {}
  fs::path dir_;
  std::string file_;
};

TEST(MemoryGuard, TrainIsRefusedBelowThePlannedPeakAndTrainsAboveIt) {
  std::string why;
  auto cgroup = ChildCgroup::make(&why);
  if (!cgroup) GTEST_SKIP() << why;
  const auto plan = run_command(kCli + " plan" + kRun.substr(0, kRun.find(" --epochs")) + " --json");
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  const int64_t peak = nlohmann::json::parse(plan.output)["ranks"][0]["peak"].get<int64_t>();

  cgroup->limit(peak * 8 / 10);
  const auto refused = run_command(cgroup->inside(kCli + " train" + kRun));
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("rank 0 of 1 would need"));
  EXPECT_THAT(refused.output, HasSubstr("MiB it may use (cgroup"));
  EXPECT_THAT(refused.output, HasSubstr("parameters"));
  EXPECT_THAT(refused.output, HasSubstr("--ignore-memory-plan"));

  cgroup->limit(peak * 13 / 10);
  const auto trained = run_command(cgroup->inside(kCli + " train" + kRun));
  EXPECT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_THAT(trained.output, HasSubstr("\"final_loss\""));
}

// The check's dry run draws from the CPU generator; the run must not see it.
TEST(MemoryGuard, TheCheckAtLaunchChangesNoResult) {
  const auto checked = run_command(kCli + " train" + kRun);
  const auto unchecked = run_command(kCli + " train" + kRun + " --ignore-memory-plan");
  ASSERT_EQ(checked.exit_code, 0) << checked.output;
  ASSERT_EQ(unchecked.exit_code, 0) << unchecked.output;
  const auto last_line = [](const std::string& out) {
    return nlohmann::json::parse(out.substr(out.rfind('{')));
  };
  EXPECT_EQ(last_line(checked.output)["final_loss"], last_line(unchecked.output)["final_loss"]);
  EXPECT_EQ(last_line(checked.output)["test_acc"], last_line(unchecked.output)["test_acc"]);
}

TEST(MemoryGuard, PlanHelpListsTheRunsShapeAndBadValuesAreNamed) {
  const auto help = run_command(kCli + " plan --help");
  ASSERT_EQ(help.exit_code, 0) << help.output;
  for (const char* flag : {"--model", "--strategy", "--precision", "--opt-level", "--batch-size", "--world-size",
                           "--stages", "--micro-batches", "--checkpoint-activations", "--optimizer", "--json"})
    EXPECT_THAT(help.output, HasSubstr(flag));
  const auto zero = run_command(kCli + " plan --world-size 0");
  EXPECT_EQ(zero.exit_code, 2);
  EXPECT_THAT(zero.output, HasSubstr("--world-size"));
  const auto stages = run_command(kCli + " plan --model mlp --data synthetic --strategy pipeline --world-size 3");
  EXPECT_NE(stages.exit_code, 0);
  EXPECT_THAT(stages.output, HasSubstr("--stages 3 is more than the model's 2 blocks"));
}

}  // namespace
}  // namespace lockstep
