#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace lockstep {

constexpr double kMiB = 1024.0 * 1024.0;  // bytes in a mebibyte

// Peak resident set size of this process so far, in MiB (getrusage's ru_maxrss).
double peak_rss_mib();

// Cores this process may run on (its CPU affinity mask; falls back to hardware_concurrency).
int available_cores();

// Intra-op threads for one worker: available cores divided by the processes sharing this node
// (world_from_env's local_world_size: LOCAL_WORLD_SIZE from `lockstep run` and torchrun,
// OMPI_COMM_WORLD_LOCAL_SIZE from mpirun, SLURM_NTASKS_PER_NODE from srun), at least 1.
int default_intra_op_threads();

// The integer value of environment variable `name`, or nullopt when it is unset.
// Throws c10::ValueError naming the variable and its value when it is set but not an integer.
std::optional<int64_t> env_int(const char* name);

// True when standard output is a terminal (progress bars) rather than a pipe or file (plain lines).
bool stdout_is_terminal();

}  // namespace lockstep
