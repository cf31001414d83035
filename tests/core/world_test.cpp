#include "lockstep/core/world.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "../test_util.h"
#include "lockstep/core/process.h"

namespace lockstep {
namespace {

// Sets environment variables for one test and restores the previous values afterwards.
class ScopedEnv {
 public:
  ScopedEnv() : ScopedEnv(std::map<std::string, std::string>{}) {}
  explicit ScopedEnv(const std::map<std::string, std::string>& vars) {
    for (const char* name : kAll) {
      const char* old = std::getenv(name);
      if (old != nullptr) saved_[name] = old;
      ::unsetenv(name);
    }
    for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~ScopedEnv() {
    for (const char* name : kAll) ::unsetenv(name);
    for (const auto& [k, v] : saved_) ::setenv(k.c_str(), v.c_str(), 1);
  }

 private:
  static constexpr const char* kAll[] = {
      "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
      "MASTER_PORT", "LOCKSTEP_RESTART_COUNT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
      "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
      "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE",
      "SLURM_STEP_NUM_NODES", "SLURM_STEP_NODELIST"};
  std::map<std::string, std::string> saved_;
};

TEST(World, SingleProcessWithoutLauncher) {
  ScopedEnv env;
  WorldInfo w = world_from_env();
  EXPECT_EQ(w.rank, 0);
  EXPECT_EQ(w.world_size, 1);
  EXPECT_EQ(w.master_port, 29500);
  EXPECT_EQ(w.source, "default");
}

TEST(World, ReadsTorchrunVariables) {
  ScopedEnv env({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                 {"GROUP_RANK", "1"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29611"},
                 {"LOCKSTEP_RESTART_COUNT", "2"}, {"OMPI_COMM_WORLD_RANK", "0"}});
  WorldInfo w = world_from_env();
  EXPECT_EQ(w.source, "torchrun");  // RANK wins over mpirun's variables
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.world_size, 4);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world_size, 2);
  EXPECT_EQ(w.group_rank, 1);
  EXPECT_EQ(w.master_addr, "10.0.0.1");
  EXPECT_EQ(w.master_port, 29611);
  EXPECT_EQ(w.restart_count, 2);
}

TEST(World, FallsBackToMpirunThenSrun) {
  {
    ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                   {"SLURM_PROCID", "0"}});
    WorldInfo w = world_from_env();
    EXPECT_EQ(w.source, "mpirun");
    EXPECT_EQ(w.rank, 5);
    EXPECT_EQ(w.world_size, 8);
    EXPECT_EQ(w.local_rank, 1);
  }
  ScopedEnv env({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "3"}, {"SLURM_LOCALID", "0"},
                 {"SLURM_NTASKS_PER_NODE", "1"}, {"SLURM_NODEID", "2"}});
  WorldInfo w = world_from_env();
  EXPECT_EQ(w.source, "srun");
  EXPECT_EQ(w.rank, 2);
  EXPECT_EQ(w.world_size, 3);
  EXPECT_EQ(w.group_rank, 2);
}

TEST(World, RejectsRankOutsideWorldNamingTheVariables) {
  ScopedEnv env({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
  std::string msg = testing::error_message([] { world_from_env(); });
  EXPECT_THAT(msg, ::testing::HasSubstr("RANK=4"));
  EXPECT_THAT(msg, ::testing::HasSubstr("WORLD_SIZE=4"));
  ScopedEnv bad(std::map<std::string, std::string>{{"RANK", "x"}});
  EXPECT_THAT(testing::error_message([] { world_from_env(); }), ::testing::HasSubstr("RANK='x'"));
}

TEST(Process, DefaultThreadsDivideCoresByLocalWorldSize) {
  const int cores = available_cores();
  {
    ScopedEnv env;
    EXPECT_EQ(default_intra_op_threads(), cores);
  }
  ScopedEnv env({{"LOCAL_WORLD_SIZE", std::to_string(cores * 4)}});
  EXPECT_EQ(default_intra_op_threads(), 1);  // never below one
}

TEST(Process, DefaultThreadsDivideCoresByMpirunsLocalSize) {
  const int cores = available_cores();
  ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(default_intra_op_threads(), std::max(1, cores / 2));
}

TEST(World, SaysWhereMasterAddrCameFrom) {
  {
    ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
    EXPECT_EQ(world_from_env().master_addr_from, "default");
  }
  ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"}});
  EXPECT_EQ(world_from_env().master_addr_from, "MASTER_ADDR");
}

// What srun -N3 -n7 writes on the last node (SLURM 22.05): 3 tasks on each of the first two
// nodes, 1 on the third; rank 0 runs on the first host of the step.
TEST(World, SrunStepGivesLocalSizeAndRankZerosHost) {
  {
    ScopedEnv env({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "7"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "2"},
                   {"SLURM_STEP_TASKS_PER_NODE", "3(x2),1"}, {"SLURM_STEP_NUM_NODES", "3"},
                   {"SLURM_STEP_NODELIST", "gpu[07-08,12]"}});
    const WorldInfo w = world_from_env();
    EXPECT_EQ(w.local_world_size, 1);
    EXPECT_EQ(w.master_addr, "gpu07");
    EXPECT_EQ(w.master_addr_from, "SLURM_STEP_NODELIST");
  }
  {
    ScopedEnv env({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "0"},
                   {"SLURM_STEP_TASKS_PER_NODE", "2"}, {"SLURM_STEP_NUM_NODES", "1"}, {"SLURM_STEP_NODELIST", "vm"}});
    const WorldInfo w = world_from_env();
    EXPECT_EQ(w.local_world_size, 2);
    EXPECT_EQ(w.master_addr, "127.0.0.1");  // one node: loopback, whatever the host's name resolves to
  }
  ScopedEnv env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NODEID", "0"}, {"SLURM_STEP_NUM_NODES", "2"},
                 {"SLURM_STEP_NODELIST", "a1,b2"}, {"MASTER_ADDR", "10.0.0.9"}});
  EXPECT_EQ(world_from_env().master_addr, "10.0.0.9");  // an exported MASTER_ADDR wins
}

}  // namespace
}  // namespace lockstep
