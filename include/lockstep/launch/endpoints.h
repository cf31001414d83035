#pragma once
// Addresses of the launchers of a job: HOST:PORT endpoints, routes and reachability.

#include <chrono>
#include <string>
#include <utility>

namespace lockstep::launch {

// HOST and PORT of "HOST:PORT"; throws c10::ValueError naming the endpoint when either is missing.
std::pair<std::string, int> split_endpoint(const std::string& endpoint);

// The IPv4 address `host` names (a name or a dotted quad); empty when it names none.
std::string ipv4_address(const std::string& host);

// The source address this host uses to reach host:port (no packet is sent: a UDP connect only
// routes). Throws c10::Error when there is no route.
std::string route_source_address(const std::string& host, int port);

// Whether something accepts TCP connections at host:port within `timeout`.
bool accepts_connections(const std::string& host, int port, std::chrono::milliseconds timeout);

}  // namespace lockstep::launch
