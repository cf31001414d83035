#pragma once

#include <string>
#include <vector>

namespace lockstep {

// Names of this host's network interfaces that have an IPv4 or IPv6 address (getifaddrs), sorted,
// each once: what --iface / LOCKSTEP_SOCKET_IFNAME may name.
std::vector<std::string> network_interfaces();

// The interface names of a comma-separated list ("eth1,eth2", GLOO_SOCKET_IFNAME's form), in order.
// Throws c10::ValueError naming `source` and the list when a name is empty or not an interface of
// this host, with the ones there are.
std::vector<std::string> parse_interfaces(const std::string& list, const std::string& source);

}  // namespace lockstep
