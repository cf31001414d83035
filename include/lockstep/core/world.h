#pragma once

#include <cstdint>
#include <string>

namespace lockstep {

// Who this process is in a job, as its launcher described it in the environment.
struct WorldInfo {
  int64_t rank = 0;              // global rank, in [0, world_size)
  int64_t world_size = 1;
  int64_t local_rank = 0;        // rank among the processes on this node
  int64_t local_world_size = 1;  // processes on this node
  int64_t group_rank = 0;        // node rank
  std::string master_addr = "127.0.0.1";
  // Where master_addr came from: "MASTER_ADDR", "SLURM_STEP_NODELIST" (its first host, when an
  // srun step spans several nodes) or "default".
  std::string master_addr_from = "default";
  int master_port = 29500;       // PyTorch's default
  int64_t restart_count = 0;     // LOCKSTEP_RESTART_COUNT: how often `lockstep run` restarted the group
  std::string source = "default";  // which launcher's variables were read: torchrun, mpirun, srun, default
};

// The most ranks a job may have (2^20; the largest jobs run ~10^5).
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 20;

// Reads the launcher's variables: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
// MASTER_ADDR, MASTER_PORT (lockstep run, torchrun); when RANK is absent, OMPI_COMM_WORLD_RANK /
// _SIZE / _LOCAL_RANK / _LOCAL_SIZE (mpirun), then SLURM_PROCID / NTASKS / LOCALID / NODEID (srun);
// otherwise a single process. Under srun without SLURM_NTASKS_PER_NODE the local size is this
// node's entry of SLURM_STEP_TASKS_PER_NODE ("2(x3),1"). mpirun says nothing about rank 0's
// address, so across hosts MASTER_ADDR must be exported to every rank; srun's rank 0 runs on the
// first host of SLURM_STEP_NODELIST, which is the default there (see Note [Rank 0's address under
// mpirun and srun]).
// LOCAL_WORLD_SIZE alone (no launcher's rank) sets local_world_size. This is the one place that
// reads these variables. Throws c10::ValueError naming the variable, its value and the rule when a
// value is malformed or inconsistent (rank >= world size, a port outside 1-65535).
WorldInfo world_from_env();

}  // namespace lockstep
