// deploy/pytorchjob.yaml: a PyTorchJob the training operator accepts, whose command is made of
// flags lockstep really has.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>

#include "../test_util.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;

// The words of the command's flags ("--name"), up to the first "--" (lockstep run's own) or after it.
std::vector<std::string> flags(const std::vector<std::string>& words, bool after_separator) {
  std::vector<std::string> out;
  bool after = false;
  for (const std::string& w : words) {
    if (w == "--") {
      after = true;
      continue;
    }
    if (after == after_separator && w.rfind("--", 0) == 0) out.push_back(w);
  }
  return out;
}

TEST(Deploy, PyTorchJobRunsLockstepWithFlagsItHas) {
  const YAML::Node job = YAML::LoadFile(std::string(LOCKSTEP_SOURCE_DIR) + "/deploy/pytorchjob.yaml");
  EXPECT_EQ(job["apiVersion"].as<std::string>(), "kubeflow.org/v1");
  EXPECT_EQ(job["kind"].as<std::string>(), "PyTorchJob");
  EXPECT_EQ(job["spec"]["nprocPerNode"].as<std::string>(), "2");  // a string in the CRD
  const std::string run_help = testing::run_command(std::string(LOCKSTEP_CLI) + " run --help").output;
  const std::string train_help = testing::run_command(std::string(LOCKSTEP_CLI) + " train --help").output;
  int replicas = 0;
  for (const char* type : {"Master", "Worker"}) {
    const YAML::Node spec = job["spec"]["pytorchReplicaSpecs"][type];
    ASSERT_TRUE(spec) << type;
    replicas += spec["replicas"].as<int>();
    const YAML::Node container = spec["template"]["spec"]["containers"][0];
    // The operator finds the port (MASTER_PORT) in the container named "pytorch", port "pytorchjob-port".
    EXPECT_EQ(container["name"].as<std::string>(), "pytorch");
    EXPECT_EQ(container["ports"][0]["name"].as<std::string>(), "pytorchjob-port");
    const auto command = container["command"].as<std::vector<std::string>>();
    ASSERT_GE(command.size(), 4u);
    EXPECT_EQ(command[0], "lockstep");
    EXPECT_EQ(command[1], "run");
    for (const std::string& flag : flags(command, false)) EXPECT_THAT(run_help, HasSubstr(flag + " ")) << type;
    for (const std::string& flag : flags(command, true)) EXPECT_THAT(train_help, HasSubstr(flag + " ")) << type;
    // No node flags: the operator's variables say which node this is.
    for (const char* node_flag : {"--nnodes", "--node-rank", "--master-addr"})
      EXPECT_THAT(command, ::testing::Not(::testing::Contains(std::string(node_flag))));
  }
  EXPECT_EQ(replicas, 2);
}

// deploy/pytorchjob-elastic.yaml: an elastic job whose command lists every pod it may have as a
// rendezvous endpoint and keeps its global batch; its flags are lockstep's.
TEST(Deploy, ElasticPyTorchJobListsItsPodsAndKeepsItsGlobalBatch) {
  const YAML::Node job = YAML::LoadFile(std::string(LOCKSTEP_SOURCE_DIR) + "/deploy/pytorchjob-elastic.yaml");
  EXPECT_EQ(job["kind"].as<std::string>(), "PyTorchJob");
  const YAML::Node policy = job["spec"]["elasticPolicy"];
  const int min = policy["minReplicas"].as<int>(), max = policy["maxReplicas"].as<int>();
  EXPECT_LT(min, max);
  const YAML::Node spec = job["spec"]["pytorchReplicaSpecs"]["Worker"];
  EXPECT_EQ(spec["replicas"].as<int>(), max);
  const auto command = spec["template"]["spec"]["containers"][0]["command"].as<std::vector<std::string>>();
  const std::string run_help = testing::run_command(std::string(LOCKSTEP_CLI) + " run --help").output;
  const std::string train_help = testing::run_command(std::string(LOCKSTEP_CLI) + " train --help").output;
  for (const std::string& flag : flags(command, false)) EXPECT_THAT(run_help, HasSubstr(flag + " "));
  for (const std::string& flag : flags(command, true)) EXPECT_THAT(train_help, HasSubstr(flag + " "));
  const auto endpoints = std::find(command.begin(), command.end(), "--rdzv-endpoint");
  ASSERT_NE(endpoints, command.end());
  const std::string name = job["metadata"]["name"].as<std::string>();
  for (int pod = 0; pod < max; ++pod) EXPECT_THAT(*(endpoints + 1), HasSubstr(name + "-worker-" + std::to_string(pod)));
  // The global batch fits every world size of MIN to MAX pods x nprocPerNode workers.
  const auto value = [&](const std::string& flag) {
    const auto it = std::find(command.begin(), command.end(), flag);
    return it == command.end() || it + 1 == command.end() ? 0 : std::stoi(*(it + 1));
  };
  const int global = value("--global-batch-size"), batch = value("--batch-size");
  const int nproc = std::stoi(job["spec"]["nprocPerNode"].as<std::string>());
  ASSERT_GT(global, 0);
  ASSERT_GT(batch, 0);
  for (int pods = min; pods <= max; ++pods) EXPECT_EQ(global % (batch * nproc * pods), 0) << pods << " pods";
  EXPECT_THAT(command, ::testing::Contains(std::string("latest")));
}

}  // namespace
}  // namespace lockstep
