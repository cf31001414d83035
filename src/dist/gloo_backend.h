#pragma once
// Internal to src/dist: the Gloo backend behind dist::ProcessGroup (gloo_backend.cpp).
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::dist {

// The interfaces Gloo is to bind for rank `rank` of `world` (see Note [Gloo's network interface]):
// `iface`, else LOCKSTEP_SOCKET_IFNAME, else GLOO_SOCKET_IFNAME; empty for Gloo's default device.
// Throws c10::ValueError naming the source and a name this host lacks.
std::vector<std::string> chosen_interfaces(const std::string& iface, int64_t rank, int64_t world);

// A Gloo backend over `store` (its keys under "gloo/"): connects to every other rank of the group,
// through a device per interface of `interfaces` (Gloo's default device when empty). `bound`, when
// given, receives what the devices bound.
c10::intrusive_ptr<c10d::Backend> gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank,
                                                    int64_t size, std::chrono::milliseconds timeout,
                                                    const std::vector<std::string>& interfaces,
                                                    std::string* bound = nullptr);

}  // namespace lockstep::dist
