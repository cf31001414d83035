// `lockstep run` inside a Kubeflow PyTorchJob: the variables the training operator writes (fixtures
// copied from its envvar.go / elastic.go / master.go, release 1.9, and 1.5 for the older set), and
// two launchers that get a 2-pod job's variables forming one job. See Note [Kubeflow PyTorchJob variables].
#include "lockstep/launch/cluster_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "../test_util.h"
#include "engine_runs.h"
#include "lockstep/core/process.h"

namespace lockstep::launch {
namespace {

using ::testing::HasSubstr;
using Env = std::map<std::string, std::string>;

LaunchSettings from(const Env& env) {
  return launch_settings_from_env([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const Env& env) { return testing::error_message([&] { from(env); }); }

// What operator 1.9 writes into pod `index` of job "mnist" (Master replica 1, Worker replica 1,
// spec.nprocPerNode `nproc`, container port 23456): setPodEnv and MasterEnvVarGenerator.
Env pytorchjob_pod(int rank, const std::string& nproc) {
  const int pods = 2;
  // getNprocPerNodeInt: the number, or 1 when nprocPerNode is not one ("auto").
  const int per_pod = nproc.find_first_not_of("0123456789") == std::string::npos ? std::stoi(nproc) : 1;
  return {{"PYTHONUNBUFFERED", "1"},
          {"MASTER_PORT", "23456"},
          {"PET_MASTER_PORT", "23456"},
          {"MASTER_ADDR", "mnist-master-0"},
          {"PET_MASTER_ADDR", "mnist-master-0"},
          {"WORLD_SIZE", std::to_string(pods * per_pod)},
          {"RANK", std::to_string(rank)},
          {"PET_NODE_RANK", std::to_string(rank)},
          {"PET_NPROC_PER_NODE", nproc},
          {"PET_NNODES", std::to_string(pods)}};
}

TEST(ClusterEnv, PyTorchJobPodsGiveNodesRanksAndTheMaster) {
  for (int rank : {0, 1}) {
    const LaunchSettings s = from(pytorchjob_pod(rank, "2"));
    EXPECT_EQ(s.nnodes, 2);
    EXPECT_EQ(s.node_rank, rank);  // the pod index, not a process rank
    EXPECT_EQ(s.nproc_per_node, 2);
    EXPECT_EQ(s.master_addr, "mnist-master-0");
    EXPECT_EQ(s.master_port, 23456);
    EXPECT_FALSE(s.max_restarts.has_value());
    EXPECT_THAT(s.origins, ::testing::Contains("nnodes 2 from PET_NNODES"));
  }
}

// The operator writes nprocPerNode "auto" when the job leaves it unset; torchrun then starts one
// process per visible GPU, or per core on a host without, and so does lockstep run.
TEST(ClusterEnv, NprocAutoIsOneProcessPerGpuOrCore) {
  const VisibleDevices here = VisibleDevices::probe();
  EXPECT_EQ(from(pytorchjob_pod(1, "auto")).nproc_per_node, here.cuda > 0 ? here.cuda : available_cores());
  if (here.cuda == 0)
    EXPECT_THAT(error_of(pytorchjob_pod(1, "gpu")),
                HasSubstr("PET_NPROC_PER_NODE gpu starts one worker per CUDA device, but this host has no CUDA"));
  else
    EXPECT_EQ(from(pytorchjob_pod(1, "gpu")).nproc_per_node, here.cuda);
  EXPECT_THAT(error_of(pytorchjob_pod(1, "two")), HasSubstr("PET_NPROC_PER_NODE='two' is not an integer"));
}

// Operator 1.5: only MASTER_ADDR, MASTER_PORT, WORLD_SIZE (pods) and RANK (the pod's index).
TEST(ClusterEnv, OldPyTorchJobsCountPodsInWorldSize) {
  const LaunchSettings s = from({{"MASTER_ADDR", "mnist-master-0"}, {"MASTER_PORT", "23456"}, {"WORLD_SIZE", "3"},
                                 {"RANK", "2"}, {"PYTHONUNBUFFERED", "0"}});
  EXPECT_EQ(s.nnodes, 3);
  EXPECT_EQ(s.node_rank, 2);
  EXPECT_EQ(s.master_addr, "mnist-master-0");
  EXPECT_EQ(s.master_port, 23456);
  EXPECT_FALSE(s.nproc_per_node.has_value());
}

// A worker of lockstep run or torchrun (LOCAL_RANK set) or a lone MASTER_ADDR is no job description.
TEST(ClusterEnv, AWorkersVariablesAreNotAJob) {
  EXPECT_TRUE(from({}).empty());
  EXPECT_TRUE(from({{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}}).empty());
  EXPECT_TRUE(from({{"MASTER_ADDR", "127.0.0.1"}, {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}}).empty());
}

// ElasticEnvVarGenerator with minReplicas = maxReplicas = 2 (or none: "2"), maxRestarts 3,
// nProcPerNode 2 and a rendezvous conf; the pod's index comes from its replica-index label.
TEST(ClusterEnv, FixedSizeElasticJobMeetsAtTheRendezvousEndpoint) {
  const Env elastic{{"PET_RDZV_ENDPOINT", "mnist-worker-0:23456"}, {"PET_RDZV_BACKEND", "c10d"},
                    {"PET_NNODES", "2:2"}, {"PET_MAX_RESTARTS", "3"}, {"PET_NPROC_PER_NODE", "2"},
                    {"PET_RDZV_CONF", "join_timeout=900,last_call_timeout=5"}, {"PET_NODE_RANK", "1"}};
  const LaunchSettings s = from(elastic);
  EXPECT_EQ(s.nnodes, 2);
  EXPECT_EQ(s.node_rank, 1);
  EXPECT_EQ(s.master_addr, "mnist-worker-0");
  EXPECT_EQ(s.master_port, 23456);
  EXPECT_EQ(s.max_restarts, 3);
  EXPECT_EQ(s.rdzv_timeout, 900.0);
  Env no_port = elastic;
  no_port["PET_RDZV_ENDPOINT"] = "mnist-worker-0";
  EXPECT_EQ(from(no_port).master_port, 29400);  // torchrun's default rendezvous port
}

// An elasticPolicy with minReplicas 1 and maxReplicas 4: no node rank is needed.
TEST(ClusterEnv, ElasticRangeMakesAnElasticJob) {
  const LaunchSettings s = from({{"PET_RDZV_ENDPOINT", "mnist-worker-0:23456"}, {"PET_RDZV_BACKEND", "c10d"},
                                 {"PET_NNODES", "1:4"}, {"PET_NPROC_PER_NODE", "2"}});
  EXPECT_EQ(s.nnodes, 4);
  EXPECT_EQ(s.min_nodes, 1);
  EXPECT_FALSE(s.node_rank.has_value());
  EXPECT_EQ(s.master_addr, "mnist-worker-0");
  LaunchOptions o({"true"});
  s.apply_to(o);
  EXPECT_TRUE(o.elastic());
  EXPECT_EQ(o.min_nodes(), 1);
  EXPECT_EQ(o.nnodes(), 4);
}

TEST(ClusterEnv, WhatLockstepCannotDoIsRefusedNamingTheVariable) {
  const Env elastic{{"PET_RDZV_ENDPOINT", "mnist-worker-0:23456"}, {"PET_RDZV_BACKEND", "c10d"},
                    {"PET_NNODES", "1:4"}, {"PET_NODE_RANK", "0"}};
  Env reversed = elastic;
  reversed["PET_NNODES"] = "4:1";
  EXPECT_THAT(error_of(reversed), HasSubstr("PET_NNODES=4:1 has MIN above MAX"));
  Env etcd = elastic;
  etcd["PET_NNODES"] = "2";
  etcd["PET_RDZV_BACKEND"] = "etcd";
  EXPECT_THAT(error_of(etcd), HasSubstr("PET_RDZV_BACKEND=etcd is not a rendezvous lockstep run has"));
  Env no_rank = elastic;
  no_rank["PET_NNODES"] = "2";
  no_rank.erase("PET_NODE_RANK");
  EXPECT_THAT(error_of(no_rank), HasSubstr("training.kubeflow.org/replica-index"));
  Env outside = pytorchjob_pod(1, "2");
  outside["PET_NODE_RANK"] = "5";
  EXPECT_THAT(error_of(outside), HasSubstr("PET_NODE_RANK=5 is outside [0, 2)"));
}

TEST(ClusterEnv, StandaloneIsOneNode) {
  const LaunchSettings s = from({{"PET_STANDALONE", ""}, {"PET_NPROC_PER_NODE", "3"}});
  EXPECT_EQ(s.nnodes, 1);
  EXPECT_EQ(s.node_rank, 0);
  EXPECT_EQ(s.nproc_per_node, 3);
  EXPECT_FALSE(s.master_addr.has_value());
}

// Two `lockstep run` launchers with no flags but the program, each given the variables of one pod
// of a 2-pod PyTorchJob (nprocPerNode 2; the master's address 127.0.0.1 instead of its pod name),
// form one job of 4 ranks, as torchrun does in such a pod.
TEST(ClusterEnv, TwoLaunchersWithAPyTorchJobsVariablesFormOneJob) {
  testing::TempDir dir;
  const int port = testing::free_port_pair();
  ASSERT_NE(port, 0);
  std::vector<std::unique_ptr<testing::ChildProcess>> pods;
  for (int rank : {0, 1}) {
    std::vector<std::string> env;
    for (auto [name, value] : pytorchjob_pod(rank, "2")) {
      if (name == "MASTER_ADDR" || name == "PET_MASTER_ADDR") value = "127.0.0.1";
      if (name == "MASTER_PORT" || name == "PET_MASTER_PORT") value = std::to_string(port);
      env.push_back(name + "=" + value);
    }
    pods.push_back(std::make_unique<testing::ChildProcess>(
        std::vector<std::string>{LOCKSTEP_CLI, "run", "--rdzv-timeout", "20", "--", "sh", "-c",
                                 "echo rank $RANK of $WORLD_SIZE node $GROUP_RANK"},
        dir / ("pod" + std::to_string(rank)), env));
  }
  for (int rank : {0, 1}) {
    const std::optional<int> code = pods[rank]->wait_for(std::chrono::seconds(30));
    const std::string out = testing::read_text(dir / ("pod" + std::to_string(rank)));
    EXPECT_EQ(code.value_or(-1), 0) << out;
    EXPECT_THAT(out, HasSubstr("from the environment: nnodes 2 from PET_NNODES, node rank " + std::to_string(rank) +
                               " from PET_NODE_RANK, nproc per node 2 from PET_NPROC_PER_NODE"));
    for (int local : {0, 1}) {
      const int r = rank * 2 + local;
      EXPECT_THAT(out, HasSubstr("[rank " + std::to_string(r) + "] rank " + std::to_string(r) + " of 4 node " +
                                 std::to_string(rank)));
    }
  }
}

// The same two pods training: the losses equal those of one launcher with two workers, since the
// world (2 ranks, 1 thread each, the same seeds) is the same; only who started it differs. A flag
// given explicitly (--nproc-per-node 1) wins over PET_NPROC_PER_NODE.
TEST(ClusterEnv, TwoPodsTrainAsOneLauncherWithTwoWorkers) {
  testing::TempDir dir;
  const int port = testing::free_port_pair();
  ASSERT_NE(port, 0);
  std::vector<std::unique_ptr<testing::ChildProcess>> pods;
  for (int rank : {0, 1}) {
    std::vector<std::string> env{"PET_NNODES=2", "PET_NODE_RANK=" + std::to_string(rank), "PET_NPROC_PER_NODE=2",
                                 "PET_MASTER_ADDR=127.0.0.1", "PET_MASTER_PORT=" + std::to_string(port),
                                 "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port),
                                 "RANK=" + std::to_string(rank), "WORLD_SIZE=4"};
    std::vector<std::string> argv{LOCKSTEP_CLI, "run", "--nproc-per-node", "1", "--rdzv-timeout", "20", "--"};
    for (const std::string& w : testing::small_train_args(dir / "pods.jsonl")) argv.push_back(w);
    pods.push_back(std::make_unique<testing::ChildProcess>(argv, dir / ("pod" + std::to_string(rank)), env));
  }
  for (int rank : {0, 1})
    ASSERT_EQ(pods[rank]->wait_for(std::chrono::seconds(60)).value_or(-1), 0)
        << testing::read_text(dir / ("pod" + std::to_string(rank)));
  const std::vector<double> expected = testing::lockstep_run_losses(dir);
  ASSERT_EQ(expected.size(), 10u);
  EXPECT_EQ(testing::step_losses(dir / "pods.jsonl"), expected);  // exact: the same computation
}

}  // namespace
}  // namespace lockstep::launch
