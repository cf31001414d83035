#include "lockstep/launch/launch_settings.h"

#include <algorithm>

namespace lockstep::launch {

void LaunchSettings::apply_to(LaunchOptions& options) const {
  if (nproc_per_node) options.nproc_per_node(*nproc_per_node);
  if (nnodes) options.nnodes(*nnodes);
  if (node_rank) options.node_rank(*node_rank);
  if (master_addr) options.master_addr(*master_addr);
  if (master_port) options.master_port(*master_port);
  if (max_restarts) options.max_restarts(*max_restarts);
  if (rdzv_timeout) options.rdzv_timeout(*rdzv_timeout);
  auto& env = options.worker_env();
  for (const auto& entry : worker_env) {
    env.erase(std::remove_if(env.begin(), env.end(), [&](const auto& e) { return e.first == entry.first; }),
              env.end());
    env.push_back(entry);
  }
}

}  // namespace lockstep::launch
