// The Gloo half of dist::ProcessGroup (see Note [Backend seam] in process_group.cpp): which
// network interfaces a rank's Gloo binds, and the backend over a store.
#include "gloo_backend.h"

#define USE_C10D_GLOO 1
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <c10/util/StringUtil.h>

#include <cstdlib>

#include "lockstep/core/network.h"

namespace lockstep::dist {

// Note [Gloo headers]
// c10d's ProcessGroupGloo.hpp includes <gloo/...>, and neither PyPI's torch wheel nor pytorch.org's
// libtorch zip ships those headers; the Gloo that runs is the one linked into libtorch_cpu.so (its
// gloo:: symbols are exported there). lockstep compiles against Debian's libgloo-dev headers
// (2022) and links no Gloo library of its own. Two definitions of one Gloo class would break the
// one-definition rule only where code made from our copy of a header meets libtorch's objects, so
// this file, the one that includes ProcessGroupGloo.hpp, keeps to calls that do not depend on
// Gloo's layout:
// - out-of-line functions of libtorch: ProcessGroupGloo::Options's constructor, createDefaultDevice,
//   createDeviceForInterface and ProcessGroupGloo's constructor, whose arguments are c10d types;
// - shared_ptr<gloo::transport::Device>s passed along, whose layout does not depend on the Device;
// - one virtual call, Device::str(), the first slot after the destructor in every Gloo since 2017
//   (Debian's and the one PyTorch 2.14 pins alike).
// Nothing of Gloo is instantiated in lockstep's objects: tests/dist/gloo_headers_test.cpp lists
// liblockstep.a's defined symbols and finds no gloo:: function, vtable or typeinfo, and the suite's
// multi-rank tests run the collectives through libtorch's Gloo.

// Note [Gloo's network interface]
// PyTorch's Python binding of ProcessGroupGloo reads GLOO_SOCKET_IFNAME (interfaces separated by
// commas, one Gloo device each); the C++ class does not: its default device resolves this host's
// name, which on a multi-homed host or in a network namespace is the wrong address or 127.0.0.1,
// and then peers on other hosts cannot connect. lockstep reads the variable as Python does, after
// its own (InitOptions::iface, then LOCKSTEP_SOCKET_IFNAME, which `lockstep run --iface` sets), and
// refuses a name this host lacks before the rendezvous, where Gloo would fail only once connecting.

std::vector<std::string> chosen_interfaces(const std::string& iface, int64_t rank, int64_t world) {
  std::string list = iface, source = "iface";
  for (const char* name : {"LOCKSTEP_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}) {
    const char* value = std::getenv(name);
    if (!list.empty() || value == nullptr || *value == '\0') continue;
    list = value, source = name;
  }
  if (list.empty()) return {};
  return parse_interfaces(list, c10::str("rank ", rank, " of ", world, ": ", source));
}

c10::intrusive_ptr<c10d::Backend> gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank,
                                                    int64_t size, std::chrono::milliseconds timeout,
                                                    const std::vector<std::string>& interfaces,
                                                    std::string* bound) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  if (interfaces.empty()) options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  for (const std::string& name : interfaces) options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
  if (bound != nullptr) {
    std::vector<std::string> devices;
    for (const auto& device : options->devices)  // Gloo's own words: "tcp, pci=, iface=eth1, speed=-1, addr=[10.0.0.2]"
      devices.push_back(device->str() + (interfaces.empty() ? " (the host name's address)" : ""));
    *bound = c10::Join("; ", devices);
  }
  return c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("gloo", store),
                                                     static_cast<int>(rank), static_cast<int>(size), options);
}

}  // namespace lockstep::dist
