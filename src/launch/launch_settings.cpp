#include "lockstep/launch/launch_settings.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <stdexcept>

namespace lockstep::launch {

void LaunchSettings::apply_to(LaunchOptions& options) const {
  if (nproc_per_node) options.nproc_per_node(*nproc_per_node);
  if (nnodes) options.nnodes(*nnodes).min_nodes(min_nodes.value_or(0));
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

c10::optional<int64_t> parse_integer(const std::string& text) {
  size_t used = 0;
  try {
    const int64_t value = std::stoll(text, &used);
    if (used == text.size()) return value;
  } catch (const std::logic_error&) {  // not a number, or out of range
  }
  return c10::nullopt;
}

void LaunchOptions::parse_nnodes(const std::string& text) {
  auto number = [&](const std::string& part) {
    const c10::optional<int64_t> value = parse_integer(part);
    TORCH_CHECK_VALUE(value && *value >= 1, "--nnodes '", text,
                      "' is not N or MIN:MAX with whole numbers of at least 1 (e.g. 2, or 2:4 for an elastic job)");
    return *value;
  };
  const size_t colon = text.find(':');
  min_nodes_ = colon == std::string::npos ? 0 : number(text.substr(0, colon));
  nnodes_ = number(colon == std::string::npos ? text : text.substr(colon + 1));
}

int64_t nproc_per_node_from(const std::string& text, const std::string& what, const VisibleDevices& visible,
                            int64_t cores) {
  if (text == "cpu" || (text == "auto" && visible.cuda == 0)) return cores;
  if (text == "gpu" || text == "cuda" || text == "auto") {
    TORCH_CHECK_VALUE(visible.cuda > 0, what, " ", text, " starts one worker per CUDA device, but this host has ",
                      visible.describe(), "; give a number, or cpu for one per core (", cores, ")");
    return visible.cuda;
  }
  const c10::optional<int64_t> n = parse_integer(text);
  TORCH_CHECK_VALUE(n, what, " '", text, "' is not a number of workers, nor gpu, cpu or auto");
  return *n;  // bounded by LaunchOptions::validate
}

}  // namespace lockstep::launch
