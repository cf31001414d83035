// `lockstep train` started by Open MPI's mpirun (openmpi-bin 4.1) instead of `lockstep run`: on one
// host, and on two network-namespace "hosts" reached through an rsh agent. The losses must equal
// those of `lockstep run --nproc-per-node 2`: the same 2 ranks with 1 thread each compute the same
// operations in the same order, so the comparison is exact; only who started the ranks differs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>

#include "../test_util.h"
#include "engine_runs.h"
#include "namespaces.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;

std::string mpirun_missing() {
  return testing::run_command("command -v mpirun").exit_code == 0
             ? ""
             : "mpirun not found: install openmpi-bin (scripts/bootstrap --test)";
}

const char* const kMpirun = "mpirun --allow-run-as-root --oversubscribe -np 2 ";

TEST(MpiRun, TwoRanksOnOneHostTrainAsLockstepRunsTwoWorkers) {
  if (const std::string why = mpirun_missing(); !why.empty()) GTEST_SKIP() << why;
  testing::TempDir dir;
  const int port = testing::free_port_pair();
  ASSERT_NE(port, 0);
  // MASTER_ADDR defaults to 127.0.0.1, right on one host; the port is exported so that parallel
  // tests do not meet on PyTorch's default 29500.
  const auto r = testing::run_command(std::string(kMpirun) + "-x MASTER_PORT=" + std::to_string(port) + " " +
                                      testing::shell_words(testing::small_train_args(dir / "mpi.jsonl")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("\"world_size\":2"));
  const std::vector<double> expected = testing::lockstep_run_losses(dir);
  ASSERT_EQ(expected.size(), 10u);
  EXPECT_EQ(testing::step_losses(dir / "mpi.jsonl"), expected);
}

// An rsh agent for mpirun: "AGENT [ssh options] HOST COMMAND..." runs COMMAND in HOST's namespace,
// as ssh would run it on HOST.
std::string write_agent(const testing::TempDir& dir, const testing::NamespacePair& ns) {
  const std::string path = dir / "netns-rsh";
  std::ofstream(path) << "#!/bin/sh\n"
                         "while [ \"${1#-}\" != \"$1\" ]; do shift; done\n"
                         "host=$1; shift\n"
                         "case $host in\n"
                      << "  " << testing::NamespacePair::kAddresses[0] << ") ns=" << ns.name(0) << ";;\n"
                      << "  " << testing::NamespacePair::kAddresses[1] << ") ns=" << ns.name(1) << ";;\n"
                      << "  *) echo \"netns-rsh: unknown host $host\" >&2; exit 1;;\n"
                         "esac\n"
                         "exec ip netns exec \"$ns\" /bin/sh -c \"$*\"\n";
  ::chmod(path.c_str(), 0755);
  return path;
}

// mpirun runs in namespace A (host 10.231.77.1) and starts rank 1 in namespace B through the agent.
// Without MASTER_ADDR each rank would look for rank 0 on itself: lockstep says so at once.
TEST(MpiRun, TwoHostsInNetworkNamespacesNeedAndUseMasterAddr) {
  if (const std::string why = mpirun_missing(); !why.empty()) GTEST_SKIP() << why;
  if (const std::string why = testing::namespaces_unavailable(); !why.empty()) GTEST_SKIP() << why;
  testing::NamespacePair ns;
  if (!ns.error().empty()) GTEST_SKIP() << "cannot create network namespaces here: " << ns.error();
  testing::TempDir dir;
  const std::string hosts = std::string(testing::NamespacePair::kAddresses[0]) + "," +
                            testing::NamespacePair::kAddresses[1];
  // Gloo binds the interface GLOO_SOCKET_IFNAME names; its host-name lookup resolves outside the
  // namespaces. Fresh namespaces have every port free, so PyTorch's default port is safe.
  const std::string mpirun = "ip netns exec " + ns.name(0) + " " + kMpirun + "--mca plm_rsh_agent " +
                             write_agent(dir, ns) + " --host " + hosts + " -x GLOO_SOCKET_IFNAME=" +
                             testing::NamespacePair::kDevice + " ";
  const auto start = std::chrono::steady_clock::now();
  const auto without = testing::run_command(mpirun + testing::shell_words(testing::small_train_args(dir / "x.jsonl")));
  EXPECT_NE(without.exit_code, 0);
  EXPECT_THAT(without.output, HasSubstr("mpirun started ranks on several hosts (1 of 2 on this one) but MASTER_ADDR "
                                        "is not set"));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20.0);

  const auto r = testing::run_command(mpirun + "-x MASTER_ADDR=" + testing::NamespacePair::kAddresses[0] + " " +
                                      testing::shell_words(testing::small_train_args(dir / "mpi.jsonl")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> expected = testing::lockstep_run_losses(dir);
  ASSERT_EQ(expected.size(), 10u);
  EXPECT_EQ(testing::step_losses(dir / "mpi.jsonl"), expected);
}

}  // namespace
}  // namespace lockstep
