#include "lockstep/core/world.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>

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

std::string env_text(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// Node `node`'s count in a SLURM tasks-per-node list ("2(x3),1": 2 on nodes 0-2, 1 on node 3).
std::optional<int64_t> slurm_tasks_on_node(const std::string& spec, int64_t node) {
  std::istringstream in(spec);
  for (std::string item; std::getline(in, item, ',');) {
    const size_t times = item.find("(x");
    try {
      const int64_t count = std::stoll(item);
      const int64_t repeat = times == std::string::npos ? 1 : std::stoll(item.substr(times + 2));
      if (node < repeat) return count;
      node -= repeat;
    } catch (const std::logic_error&) {
      TORCH_CHECK_VALUE(false, "SLURM_STEP_TASKS_PER_NODE='", spec,
                        "' is not a SLURM tasks-per-node list like 2(x3),1");
    }
  }
  return std::nullopt;
}

// The first host of a SLURM host list ("node[07-09,12],gpu1" -> "node07"). Names with one
// bracketed range, as SLURM writes them for most clusters; for others export MASTER_ADDR.
std::string first_slurm_host(const std::string& list) {
  const size_t bracket = list.find('[');
  const size_t comma = list.find(',');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket)) return list.substr(0, comma);
  const size_t end = list.find_first_of(",-]", bracket + 1);
  return list.substr(0, bracket) + list.substr(bracket + 1, end - bracket - 1);
}

// srun's local size when --ntasks-per-node was not given, and rank 0's host when the step spans
// nodes and MASTER_ADDR is unset. See Note [Rank 0's address under mpirun and srun].
void read_slurm_step(WorldInfo& w) {
  if (!env_int("SLURM_NTASKS_PER_NODE").has_value())
    if (auto n = slurm_tasks_on_node(env_text("SLURM_STEP_TASKS_PER_NODE"), w.group_rank)) w.local_world_size = *n;
  const std::string nodes = env_text("SLURM_STEP_NODELIST");
  if (w.master_addr_from == "default" && env_int("SLURM_STEP_NUM_NODES").value_or(1) > 1 && !nodes.empty()) {
    w.master_addr = first_slurm_host(nodes);
    w.master_addr_from = "SLURM_STEP_NODELIST";
  }
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
    TORCH_CHECK_VALUE(w.world_size >= 1, names.world_size, "=", w.world_size, " must be at least 1");
    // Before anything is sized by the world (the sampler pads its indices to a multiple of it).
    TORCH_CHECK_VALUE(w.world_size <= kMaxWorldSize, names.world_size, "=", w.world_size,
                      " is more ranks than lockstep runs (at most ", kMaxWorldSize, ")");
    TORCH_CHECK_VALUE(w.rank >= 0 && w.rank < w.world_size, names.rank, "=", w.rank, " is outside [0, ",
                      w.world_size, ") given ", names.world_size, "=", w.world_size,
                      "; the launcher set inconsistent variables");
    TORCH_CHECK_VALUE(w.local_world_size >= 1 && w.local_world_size <= w.world_size, names.local_world_size, "=",
                      w.local_world_size, " must be between 1 and ", names.world_size, "=", w.world_size,
                      " (the ranks on this node are some of the job's)");
    TORCH_CHECK_VALUE(w.local_rank >= 0 && w.local_rank < w.local_world_size, names.local_rank, "=", w.local_rank,
                      " is outside [0, ", w.local_world_size, ") given ", names.local_world_size, "=",
                      w.local_world_size, "; the launcher set inconsistent variables");
    break;
  }
  if (w.source == "default") {
    // A world without ranks would split into single processes that each train alone.
    const std::optional<int64_t> world_size = env_int("WORLD_SIZE");
    TORCH_CHECK_VALUE(!world_size.has_value() || *world_size == 1, "WORLD_SIZE=", world_size.value_or(1),
                      " is set but RANK is not; set both (a launcher such as lockstep run or torchrun does) or "
                      "neither");
    // LOCAL_WORLD_SIZE alone: processes started beside this one by hand.
    w.local_world_size = env_int("LOCAL_WORLD_SIZE").value_or(1);
    TORCH_CHECK_VALUE(w.local_world_size >= 1 && w.local_world_size <= kMaxWorldSize, "LOCAL_WORLD_SIZE=",
                      w.local_world_size, " must be at least 1 (and at most ", kMaxWorldSize, ")");
  }
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') {
    w.master_addr = addr;
    w.master_addr_from = "MASTER_ADDR";
  }
  if (w.source == "srun") read_slurm_step(w);
  if (auto port = env_int("MASTER_PORT")) {
    TORCH_CHECK_VALUE(*port > 0 && *port < 65536, "MASTER_PORT=", *port, " is not a TCP port (1-65535)");
    w.master_port = static_cast<int>(*port);
  }
  w.restart_count = env_int("LOCKSTEP_RESTART_COUNT").value_or(0);
  return w;
}

}  // namespace lockstep
