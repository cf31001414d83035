// See Note [Kubeflow PyTorchJob variables].
#include "lockstep/launch/cluster_env.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <string>

#include "lockstep/core/process.h"

namespace lockstep::launch {
namespace {

// torchrun's port for a c10d rendezvous endpoint given without one.
constexpr int kTorchrunRdzvPort = 29400;

// The PET_* variables whose presence makes the environment a job description.
constexpr const char* kPetNames[] = {"PET_NNODES",        "PET_NODE_RANK",     "PET_NPROC_PER_NODE",
                                     "PET_MASTER_ADDR",   "PET_MASTER_PORT",   "PET_RDZV_ENDPOINT",
                                     "PET_RDZV_BACKEND",  "PET_MAX_RESTARTS",  "PET_STANDALONE"};

class EnvReader {
 public:
  EnvReader(const EnvLookup& env, LaunchSettings& out) : env_(env), out_(out) {}

  // The value, or nullptr when unset or empty.
  const char* get(const char* name) const {
    const char* v = env_(name);
    return v != nullptr && *v != '\0' ? v : nullptr;
  }
  bool present(const char* name) const { return env_(name) != nullptr; }

  int64_t integer(const char* name, const std::string& text, int64_t low, int64_t high) const {
    const c10::optional<int64_t> value = parse_integer(text);
    TORCH_CHECK_VALUE(value.has_value(), name, "='", text, "' is not an integer");
    TORCH_CHECK_VALUE(*value >= low && *value <= high, name, "=", *value, " is outside [", low, ", ", high, "]");
    return *value;
  }

  void note(const std::string& what, const std::string& value, const char* from) {
    out_.origins.push_back(what + " " + value + " from " + from);
  }

 private:
  const EnvLookup& env_;
  LaunchSettings& out_;
};

// PET_NNODES: "N", or "MIN:MAX" (an elastic job when MIN < MAX).
void read_nnodes(const EnvReader& r, const std::string& text, LaunchSettings& s) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) {
    s.nnodes = r.integer("PET_NNODES", text, 1, 1 << 20);
    return;
  }
  const int64_t min = r.integer("PET_NNODES", text.substr(0, colon), 1, 1 << 20);
  const int64_t max = r.integer("PET_NNODES", text.substr(colon + 1), 1, 1 << 20);
  TORCH_CHECK_VALUE(min <= max, "PET_NNODES=", text, " has MIN above MAX; the operator writes minReplicas:maxReplicas");
  s.nnodes = max;
  if (min < max) s.min_nodes = min;
}

// PET_NPROC_PER_NODE: a count, or torchrun's gpu, cpu or auto (nproc_per_node_from); the operator
// writes "auto" when spec.nprocPerNode is unset.
int64_t read_nproc(const EnvReader& r, const std::string& text) {
  if (text == "gpu" || text == "cuda" || text == "cpu" || text == "auto")
    return nproc_per_node_from(text, "PET_NPROC_PER_NODE", VisibleDevices::probe(), available_cores());
  return r.integer("PET_NPROC_PER_NODE", text, 1, 1 << 16);
}

// PET_RDZV_CONF "key=value,...": join_timeout (seconds) is lockstep's rendezvous timeout.
void read_rdzv_conf(EnvReader& r, const std::string& text, LaunchSettings& s) {
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, end - start);
    if (item.rfind("join_timeout=", 0) == 0) {
      s.rdzv_timeout = static_cast<double>(r.integer("PET_RDZV_CONF join_timeout", item.substr(13), 1, 1 << 30));
      r.note("rdzv timeout", item.substr(13) + " s", "PET_RDZV_CONF");
    }
    start = end + 1;
  }
}

// PET_RDZV_ENDPOINT "HOST[:PORT]": where the nodes meet when no master address is given.
void read_endpoint(EnvReader& r, const std::string& text, LaunchSettings& s) {
  const size_t colon = text.rfind(':');
  const bool has_port = colon != std::string::npos && text.find(']', colon) == std::string::npos;
  s.master_addr = has_port ? text.substr(0, colon) : text;
  s.master_port = has_port ? static_cast<int>(r.integer("PET_RDZV_ENDPOINT", text.substr(colon + 1), 1, 65534))
                           : kTorchrunRdzvPort;
  r.note("master", *s.master_addr + ":" + std::to_string(*s.master_port), "PET_RDZV_ENDPOINT");
}

void read_master(EnvReader& r, LaunchSettings& s) {
  for (const char* name : {"PET_MASTER_ADDR", "MASTER_ADDR"}) {
    if (const char* v = r.get(name)) {
      s.master_addr = v;
      r.note("master address", v, name);
      break;
    }
  }
  for (const char* name : {"PET_MASTER_PORT", "MASTER_PORT"}) {
    if (const char* v = r.get(name)) {
      s.master_port = static_cast<int>(r.integer(name, v, 1, 65534));
      r.note("master port", v, name);
      break;
    }
  }
  if (!s.master_addr)
    if (const char* endpoint = r.get("PET_RDZV_ENDPOINT")) read_endpoint(r, endpoint, s);
}

}  // namespace

LaunchSettings launch_settings_from_env(const EnvLookup& env) {
  LaunchSettings s;
  EnvReader r(env, s);
  bool pet = false;
  for (const char* name : kPetNames) pet = pet || r.present(name);
  // Before operator 1.7: pods counted by WORLD_SIZE, numbered by RANK. A launcher's worker also has
  // LOCAL_RANK, and is no pod.
  const bool legacy = !pet && r.get("MASTER_ADDR") && r.get("RANK") && r.get("WORLD_SIZE") && !r.get("LOCAL_RANK");
  if (!pet && !legacy) return s;

  if (r.present("PET_STANDALONE")) {
    s.nnodes = 1;
    s.node_rank = 0;
    r.note("nnodes", "1", "PET_STANDALONE");
  } else if (const char* v = r.get("PET_NNODES")) {
    read_nnodes(r, v, s);
    r.note("nnodes", s.min_nodes ? std::string(v) : std::to_string(*s.nnodes), "PET_NNODES");
  } else if (legacy) {
    s.nnodes = r.integer("WORLD_SIZE", r.get("WORLD_SIZE"), 1, 1 << 20);
    r.note("nnodes", std::to_string(*s.nnodes), "WORLD_SIZE (the pods of a PyTorchJob)");
  }
  const char* rank_name = r.get("PET_NODE_RANK") ? "PET_NODE_RANK" : legacy ? "RANK" : nullptr;
  if (rank_name != nullptr && !s.node_rank && !s.min_nodes) {  // an elastic job numbers its nodes itself
    s.node_rank = r.integer(rank_name, r.get(rank_name), 0, 1 << 20);
    r.note("node rank", std::to_string(*s.node_rank), rank_name);
  }
  if (s.nnodes && s.node_rank)
    TORCH_CHECK_VALUE(*s.node_rank < *s.nnodes, rank_name, "=", *s.node_rank, " is outside [0, ", *s.nnodes,
                      ") for ", *s.nnodes, " nodes; the environment describes another job than this one");
  TORCH_CHECK_VALUE(!s.nnodes || *s.nnodes == 1 || s.node_rank || s.min_nodes, "the environment describes a job of ", *s.nnodes,
                    " nodes but not this node's rank (PET_NODE_RANK): an elastic PyTorchJob without a Master "
                    "replica does not write it; set PET_NODE_RANK from the pod's label "
                    "training.kubeflow.org/replica-index (docs/clusters.md)");
  if (const char* v = r.get("PET_NPROC_PER_NODE")) {
    s.nproc_per_node = read_nproc(r, v);
    r.note("nproc per node", std::to_string(*s.nproc_per_node), "PET_NPROC_PER_NODE");
  }
  if (!r.present("PET_STANDALONE")) read_master(r, s);
  if (const char* v = r.get("PET_RDZV_BACKEND")) {
    const std::string backend = v;
    TORCH_CHECK_VALUE(backend == "c10d" || backend == "static", "PET_RDZV_BACKEND=", backend,
                      " is not a rendezvous lockstep run has: it meets in a TCP store on node 0 (as torchrun's "
                      "c10d and static backends do); use c10d");
  }
  if (const char* v = r.get("PET_MAX_RESTARTS")) {
    s.max_restarts = r.integer("PET_MAX_RESTARTS", v, 0, 1 << 20);
    r.note("max restarts", v, "PET_MAX_RESTARTS");
  }
  if (const char* v = r.get("PET_RDZV_CONF")) read_rdzv_conf(r, v, s);
  return s;
}

}  // namespace lockstep::launch
