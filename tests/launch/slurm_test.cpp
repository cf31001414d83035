// `lockstep train` under a real SLURM (slurm-wlm 22.05 with munge): a one-host cluster that the test
// starts (munged, slurmctld and slurmd in the foreground, as root, everything in a temporary
// directory), then `srun -N1 -n2 lockstep train` and an `sbatch` script that uses `lockstep run`;
// and a cluster of two nodes, one per network namespace, where `srun -N2` and `sbatch -N2` do the
// same with one rank per node. Their losses equal those of `lockstep run --nproc-per-node 2` exactly: the same two ranks with one
// thread each compute the same operations in the same order.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <memory>

#include "../test_util.h"
#include "engine_runs.h"
#include "namespaces.h"

namespace lockstep {
namespace {

using std::chrono::seconds;
using testing::ChildProcess;

// Why a SLURM cannot be started here, or "" when it can.
std::string slurm_unavailable() {
  if (::geteuid() != 0) return "not root: slurmd runs jobs as their users and needs root";
  for (const char* tool : {"munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo"})
    if (testing::run_command(std::string("command -v ") + tool).exit_code != 0)
      return std::string(tool) + " not found: install munge slurmctld slurmd slurm-client (scripts/bootstrap --test)";
  return "";
}

// One host as a SLURM cluster of one node with 2 CPUs, or, given namespace hosts, of one node per
// host (slurmctld and node 0 on host 0, each slurmd in its host's network); the daemons die with
// the object.
class LocalSlurm {
 public:
  explicit LocalSlurm(const testing::TempDir& dir, const testing::NamespaceHosts* hosts = nullptr)
      : dir_(dir), hosts_(hosts) {
    const int port = testing::free_port_pair();  // slurmctld's, and slurmd's on port + 1
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    for (const char* sub : {"/munge", "/spool", "/state"}) ::mkdir((dir.path() + sub).c_str(), 0700);
    std::string nodes = std::string("NodeName=") + host + " NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN\n";
    std::vector<std::string> names{host};
    if (hosts != nullptr) {
      nodes.clear();
      names.clear();
      for (int h = 0; h < hosts->size(); ++h) {
        names.push_back("lsnode" + std::to_string(h));
        nodes += "NodeName=" + names.back() + " NodeAddr=" + hosts->address(h) + " CPUs=2 State=UNKNOWN\n";
      }
    }
    const std::string controller = hosts != nullptr ? hosts->address(0) : "127.0.0.1";
    // munged refuses a key that others may read; 1 KiB of random bytes, as mungekey writes.
    if (testing::run_command("head -c 1024 /dev/urandom > " + (dir / "munge/key") + " && chmod 600 " +
                             (dir / "munge/key")).exit_code != 0) {
      error_ = "cannot write a munge key in " + dir.path();
      return;
    }
    std::ofstream(dir / "slurm.conf")
        << "ClusterName=lockstep\nSlurmctldHost=" << host << "(" << controller << ")\nSlurmctldPort=" << port
        << "\nSlurmdPort=" << port + 1 << "\nSlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\n"
        << "CredType=cred/munge\nAuthInfo=socket=" << (dir / "munge/socket") << "\nStateSaveLocation="
        << (dir / "state") << "\nSlurmdSpoolDir=" << (dir / "spool") << "/%n\nSlurmctldPidFile=" << (dir / "ctld.pid")
        << "\nSlurmdPidFile=" << (dir / "d-%n.pid") << "\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
        << "SchedulerType=sched/builtin\nSelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
        << "MpiDefault=none\nReturnToService=2\nJobAcctGatherType=jobacct_gather/none\n"
        << nodes << "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n";
    daemons_.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{"munged", "--foreground", "--force", "--key-file=" + (dir / "munge/key"),
                                 "--socket=" + (dir / "munge/socket"), "--pid-file=" + (dir / "munge/pid"),
                                 "--log-file=" + (dir / "munge/log"), "--seed-file=" + (dir / "munge/seed")},
        dir / "munged.out"));
    if (!testing::wait_until([&] { return ::access((dir / "munge/socket").c_str(), F_OK) == 0; }, seconds(10))) {
      error_ = "munged did not start: " + testing::read_text(dir / "munged.out") + testing::read_text(dir / "munge/log");
      return;
    }
    const std::string conf = dir / "slurm.conf";
    daemons_.push_back(std::make_unique<ChildProcess>(in_host(0, {"slurmctld", "-D", "-f", conf}), dir / "slurmctld.out"));
    for (size_t n = 0; n < names.size(); ++n)
      daemons_.push_back(std::make_unique<ChildProcess>(in_host(static_cast<int>(n), {"slurmd", "-D", "-f", conf, "-N", names[n]}),
                                                        dir / ("slurmd" + std::to_string(n) + ".out")));
    const std::string all_idle = std::to_string(names.size()) + " idle";
    if (!testing::wait_until([&] { return run("sinfo -h -o '%D %T'").output.find(all_idle) != std::string::npos; },
                             seconds(30)))
      error_ = "the nodes did not become idle in 30 s: " + testing::read_text(dir / "slurmctld.out") +
               testing::read_text(dir / "slurmd0.out") + run("sinfo").output;
  }
  ~LocalSlurm() {
    while (!daemons_.empty()) daemons_.pop_back();  // slurmd first, munged last
  }
  LocalSlurm(const LocalSlurm&) = delete;
  LocalSlurm& operator=(const LocalSlurm&) = delete;

  const std::string& error() const { return error_; }
  // `command` with this cluster's slurm.conf (on host 0).
  testing::CommandResult run(const std::string& command) const {
    const std::vector<std::string> enter = in_host(0, {});
    return testing::run_command(testing::shell_words(enter) + (enter.empty() ? "" : " ") + "env SLURM_CONF=" +
                                (dir_ / "slurm.conf") + " " + command);
  }

 private:
  std::vector<std::string> in_host(int host, std::vector<std::string> argv) const {
    if (hosts_ == nullptr) return argv;
    std::vector<std::string> all = hosts_->enter(host);
    all.insert(all.end(), argv.begin(), argv.end());
    return all;
  }

  const testing::TempDir& dir_;
  const testing::NamespaceHosts* hosts_;
  std::vector<std::unique_ptr<ChildProcess>> daemons_;  // in order of start
  std::string error_;
};

TEST(Slurm, SrunAndSbatchTrainAsLockstepRunsTwoWorkers) {
  if (const std::string why = slurm_unavailable(); !why.empty()) GTEST_SKIP() << why;
  testing::TempDir dir;
  LocalSlurm slurm(dir);
  ASSERT_EQ(slurm.error(), "");
  const std::vector<double> expected = testing::lockstep_run_losses(dir);
  ASSERT_EQ(expected.size(), 10u);

  // srun's tasks read SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID; one node, so rank 0 is on loopback.
  const int port = testing::free_port_pair();
  const auto srun = slurm.run("MASTER_PORT=" + std::to_string(port) + " timeout 60 srun -N1 -n2 " +
                              testing::shell_words(testing::small_train_args(dir / "srun.jsonl")));
  ASSERT_EQ(srun.exit_code, 0) << srun.output;
  EXPECT_EQ(testing::step_losses(dir / "srun.jsonl"), expected);

  // A batch job of one task with 2 CPUs whose script starts lockstep run, as a user's would.
  std::ofstream(dir / "job.sh") << "#!/bin/sh\nexec " << LOCKSTEP_CLI << " run --nproc-per-node 2 -- "
                                << testing::shell_words(testing::small_train_args(dir / "sbatch.jsonl")) << "\n";
  const auto sbatch = slurm.run("timeout 60 sbatch --wait -N1 -n1 -c2 -o " + (dir / "job.out") + " " + (dir / "job.sh"));
  ASSERT_EQ(sbatch.exit_code, 0) << sbatch.output << testing::read_text(dir / "job.out");
  EXPECT_THAT(testing::read_text(dir / "job.out"), ::testing::HasSubstr("all 2 workers finished successfully"));
  EXPECT_EQ(testing::step_losses(dir / "sbatch.jsonl"), expected);
}

// Two SLURM nodes, each slurmd in its own network namespace: `srun -N2 --ntasks-per-node=1` puts
// one rank on each, which meet over the hosts' link (no shared memory), and their losses equal
// those of `lockstep run --nproc-per-node 2` on one host; likewise an `sbatch -N2` job whose one
// task per node starts `lockstep run`.
TEST(Slurm, SrunAndSbatchAcrossTwoNodesInTheirOwnNetworks) {
  if (const std::string why = slurm_unavailable(); !why.empty()) GTEST_SKIP() << why;
  if (const std::string why = testing::namespaces_unavailable(); !why.empty()) GTEST_SKIP() << why;
  testing::NamespaceHosts hosts(2);
  ASSERT_EQ(hosts.error(), "");
  testing::TempDir dir;
  LocalSlurm slurm(dir, &hosts);
  ASSERT_EQ(slurm.error(), "");
  const std::vector<double> expected = testing::lockstep_run_losses(dir);
  ASSERT_EQ(expected.size(), 10u);

  // The node names (lsnode0, ...) do not resolve here: rank 0's address is exported, as a user
  // exports the first of `scontrol show hostnames`.
  const std::string network = "MASTER_ADDR=" + hosts.address(0) + " LOCKSTEP_SOCKET_IFNAME=" +
                              testing::NamespaceHosts::kDevice + " ";
  const auto srun = slurm.run(network + "timeout 90 srun -N2 --ntasks-per-node=1 " +
                              testing::shell_words(testing::small_train_args(dir / "srun.jsonl")));
  ASSERT_EQ(srun.exit_code, 0) << srun.output;
  EXPECT_THAT(srun.output, ::testing::HasSubstr("one Gloo ring over 2 ranks on 2 hosts"));
  EXPECT_EQ(testing::step_losses(dir / "srun.jsonl"), expected);

  std::ofstream(dir / "job2.sh") << "#!/bin/sh\nexec srun sh -c 'exec " << LOCKSTEP_CLI
                                 << " run --nnodes 2 --node-rank $SLURM_NODEID --master-addr " << hosts.address(0)
                                 << " --iface " << testing::NamespaceHosts::kDevice << " -- "
                                 << testing::shell_words(testing::small_train_args(dir / "sbatch2.jsonl")) << "'\n";
  const auto sbatch = slurm.run("timeout 90 sbatch --wait -N2 --ntasks-per-node=1 -o " + (dir / "job2.out") + " " +
                                (dir / "job2.sh"));
  ASSERT_EQ(sbatch.exit_code, 0) << sbatch.output << testing::read_text(dir / "job2.out");
  EXPECT_THAT(testing::read_text(dir / "job2.out"), ::testing::HasSubstr("all 2 workers finished successfully"));
  EXPECT_EQ(testing::step_losses(dir / "sbatch2.jsonl"), expected);
}

}  // namespace
}  // namespace lockstep
