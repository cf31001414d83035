#include "lockstep/core/world.h"

#include <c10/util/Exception.h>

#include <cstdlib>

#include "lockstep/core/process.h"

namespace lockstep {
namespace {

// Names of one launcher's variables; nullptr where it has none.
struct EnvNames {
  const char* source;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
  const char* group_rank;
};

constexpr EnvNames kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", nullptr},
    {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_NODEID"},
};

int64_t read_or(const char* name, int64_t fallback) {
  return name == nullptr ? fallback : env_int(name).value_or(fallback);
}

}  // namespace

WorldInfo world_from_env() {
  WorldInfo w;
  for (const EnvNames& names : kLaunchers) {
    if (!env_int(names.rank).has_value()) continue;
    w.source = names.source;
    w.rank = *env_int(names.rank);
    w.world_size = read_or(names.world_size, 1);
    w.local_rank = read_or(names.local_rank, w.rank);
    w.local_world_size = read_or(names.local_world_size, w.world_size);
    w.group_rank = read_or(names.group_rank, 0);
    TORCH_CHECK(w.world_size >= 1, names.world_size, "=", w.world_size, " must be at least 1");
    TORCH_CHECK(w.rank >= 0 && w.rank < w.world_size, names.rank, "=", w.rank, " is outside [0, ",
                w.world_size, ") given ", names.world_size, "=", w.world_size,
                "; the launcher set inconsistent variables");
    TORCH_CHECK(w.local_rank >= 0 && w.local_rank < w.local_world_size, names.local_rank, "=",
                w.local_rank, " is outside [0, ", w.local_world_size, ")");
    break;
  }
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') {
    w.master_addr = addr;
    w.master_addr_given = true;
  }
  if (auto port = env_int("MASTER_PORT")) {
    TORCH_CHECK(*port > 0 && *port < 65536, "MASTER_PORT=", *port, " is not a TCP port (1-65535)");
    w.master_port = static_cast<int>(*port);
  }
  w.restart_count = env_int("LOCKSTEP_RESTART_COUNT").value_or(0);
  return w;
}

}  // namespace lockstep
