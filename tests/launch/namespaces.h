#pragma once
// Two network namespaces as two "nodes" of a job, for the multi-node, mpirun and SLURM tests.

#include <unistd.h>

#include <string>
#include <vector>

#include "../test_util.h"

namespace lockstep::testing {

// Two network namespaces, each a "node" with its own address, joined by a veth pair whose ends
// carry the same interface name in both (so one GLOO_SOCKET_IFNAME fits every node, as mpirun -x
// passes one value to all ranks). Removed (with the veth pair) when the object dies.
class NamespacePair {
 public:
  NamespacePair() {
    const std::string id = std::to_string(::getpid() % 100000);
    names_ = {"lockstep-a-" + id, "lockstep-b-" + id};
    const std::string a = "lsa" + id, b = "lsb" + id;  // interface names are at most 15 characters
    const std::vector<std::string> steps{
        "ip netns add " + names_[0],
        "ip netns add " + names_[1],
        "ip link add " + a + " type veth peer name " + b,
        "ip link set " + a + " netns " + names_[0],
        "ip link set " + b + " netns " + names_[1],
        "ip -n " + names_[0] + " link set " + a + " name " + kDevice,
        "ip -n " + names_[1] + " link set " + b + " name " + kDevice,
        "ip -n " + names_[0] + " addr add " + kAddresses[0] + "/24 dev " + kDevice,
        "ip -n " + names_[1] + " addr add " + kAddresses[1] + "/24 dev " + kDevice,
        "ip -n " + names_[0] + " link set lo up",
        "ip -n " + names_[1] + " link set lo up",
        "ip -n " + names_[0] + " link set " + kDevice + " up",
        "ip -n " + names_[1] + " link set " + kDevice + " up",
        "ip netns exec " + names_[0] + " true",
    };
    for (const std::string& step : steps) {
      CommandResult r = run_command(step);
      if (r.exit_code != 0) {
        error_ = "`" + step + "` failed (exit " + std::to_string(r.exit_code) + "): " + r.output;
        return;
      }
    }
  }
  ~NamespacePair() {
    for (const std::string& name : names_) run_command("ip netns del " + name);
  }
  NamespacePair(const NamespacePair&) = delete;
  NamespacePair& operator=(const NamespacePair&) = delete;

  // Shapes both ends of the veth pair with tbf to `rate` ("1gbit"), as each host's link is in a
  // cluster: "" when done, else the command that failed and why.
  std::string shape(const std::string& rate) const {
    for (const std::string& name : names_) {
      const std::string step = "ip netns exec " + name + " tc qdisc add dev " + kDevice + " root tbf rate " + rate +
                               " burst 256kb latency 100ms";
      CommandResult r = run_command(step);
      if (r.exit_code != 0) return "`" + step + "` failed (exit " + std::to_string(r.exit_code) + "): " + r.output;
    }
    return "";
  }

  // Empty when both namespaces are up; otherwise the step that failed and why.
  const std::string& error() const { return error_; }
  const std::string& name(int node) const { return names_[node]; }
  std::vector<std::string> exec(int node) const { return {"ip", "netns", "exec", names_[node]}; }
  static std::string device(int /*node*/) { return kDevice; }

  static constexpr const char* kAddresses[2] = {"10.231.77.1", "10.231.77.2"};
  static constexpr const char* kDevice = "lsveth";

 private:
  std::vector<std::string> names_;
  std::string error_;
};

// `n` network namespaces as hosts of a cluster, each with one interface (kDevice) on a bridge in a
// "switch" namespace of its own, as machines on one network switch: host h is 10.231.(id).(h + 1).
// Removed (with the links) when the object dies.
class NamespaceHosts {
 public:
  explicit NamespaceHosts(int n) {
    const std::string id = std::to_string(::getpid() % 100000);
    const std::string net = "10.232." + std::to_string(::getpid() % 250) + ".";
    switch_ = "lockstep-sw-" + id;
    std::vector<std::string> steps{"ip netns add " + switch_, "ip -n " + switch_ + " link add lsbr type bridge",
                                   "ip -n " + switch_ + " link set lsbr up"};
    for (int h = 0; h < n; ++h) {
      const std::string ns = "lockstep-h" + std::to_string(h) + "-" + id;
      const std::string a = "lsh" + std::to_string(h) + "a" + id, b = "lsh" + std::to_string(h) + "b" + id;
      names_.push_back(ns);
      addresses_.push_back(net + std::to_string(h + 1));
      for (const std::string& step : {"ip netns add " + ns, "ip link add " + a + " type veth peer name " + b,
                                      "ip link set " + a + " netns " + ns, "ip link set " + b + " netns " + switch_,
                                      "ip -n " + ns + " link set " + a + " name " + kDevice,
                                      "ip -n " + ns + " addr add " + addresses_.back() + "/24 dev " + kDevice,
                                      "ip -n " + ns + " link set lo up", "ip -n " + ns + " link set " + kDevice + " up",
                                      "ip -n " + switch_ + " link set " + b + " master lsbr",
                                      "ip -n " + switch_ + " link set " + b + " up"})
        steps.push_back(step);
    }
    for (const std::string& step : steps) {
      CommandResult r = run_command(step);
      if (r.exit_code != 0) {
        error_ = "`" + step + "` failed (exit " + std::to_string(r.exit_code) + "): " + r.output;
        return;
      }
    }
  }
  ~NamespaceHosts() {
    for (const std::string& name : names_) run_command("ip netns del " + name);
    run_command("ip netns del " + switch_);
  }
  NamespaceHosts(const NamespaceHosts&) = delete;
  NamespaceHosts& operator=(const NamespaceHosts&) = delete;

  const std::string& error() const { return error_; }
  std::vector<std::string> exec(int host) const { return {"ip", "netns", "exec", names_[host]}; }
  // Enters only the host's network namespace: `ip netns exec` also mounts a sysfs of its own, which
  // hides /sys/fs/cgroup (slurmd needs it).
  std::vector<std::string> enter(int host) const { return {"nsenter", "--net=/var/run/netns/" + names_[host]}; }
  const std::string& address(int host) const { return addresses_[host]; }
  int size() const { return static_cast<int>(names_.size()); }
  static constexpr const char* kDevice = "lsnet";

 private:
  std::string switch_;
  std::vector<std::string> names_, addresses_;
  std::string error_;
};

// Why network namespaces cannot be made here, or "" when they can.
inline std::string namespaces_unavailable() {
  if (::geteuid() != 0) return "not root: creating network namespaces needs CAP_SYS_ADMIN";
  if (run_command("command -v ip").exit_code != 0) return "`ip` not found: install iproute2 (scripts/bootstrap --test)";
  return "";
}

}  // namespace lockstep::testing
