#include "lockstep/core/network.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <ifaddrs.h>
#include <sys/socket.h>

#include <algorithm>
#include <memory>
#include <sstream>

namespace lockstep {

std::vector<std::string> network_interfaces() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {};
  std::unique_ptr<ifaddrs, void (*)(ifaddrs*)> owner(list, ::freeifaddrs);
  std::vector<std::string> names;
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next)
    if (a->ifa_addr != nullptr && (a->ifa_addr->sa_family == AF_INET || a->ifa_addr->sa_family == AF_INET6))
      names.emplace_back(a->ifa_name);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

std::vector<std::string> parse_interfaces(const std::string& list, const std::string& source) {
  const std::vector<std::string> here = network_interfaces();
  std::vector<std::string> names;
  std::istringstream in(list);
  for (std::string name; std::getline(in, name, ',');) {
    TORCH_CHECK_VALUE(!name.empty(), source, " '", list, "' has an empty interface name; give names separated by "
                      "commas, e.g. eth0 or eth0,eth1");
    TORCH_CHECK_VALUE(std::find(here.begin(), here.end(), name) != here.end(), source, " names network interface '",
                      name, "', which this host does not have (or which has no address); its interfaces are ",
                      c10::Join(", ", here), ": pick the one on the network the other nodes reach");
    names.push_back(name);
  }
  TORCH_CHECK_VALUE(!names.empty(), source, " is empty; give an interface name, e.g. eth0");
  return names;
}

}  // namespace lockstep
