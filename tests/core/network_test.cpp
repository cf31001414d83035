#include "lockstep/core/network.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../test_util.h"

namespace lockstep {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

TEST(NetworkInterfaces, ListsLoopbackOnceAndParsesCommaSeparatedNames) {
  const std::vector<std::string> here = network_interfaces();
  EXPECT_THAT(here, Contains("lo"));
  EXPECT_TRUE(std::is_sorted(here.begin(), here.end()));
  EXPECT_EQ(std::adjacent_find(here.begin(), here.end()), here.end()) << "each name once (lo has IPv4 and IPv6)";
  EXPECT_EQ(parse_interfaces("lo", "--iface"), std::vector<std::string>{"lo"});
  EXPECT_EQ(parse_interfaces("lo,lo", "--iface"), (std::vector<std::string>{"lo", "lo"}));
  EXPECT_THAT(testing::error_message([] { parse_interfaces("", "--iface"); }), HasSubstr("--iface is empty"));
  EXPECT_THAT(testing::error_message([] { parse_interfaces("lo,eth9x", "--iface"); }),
              HasSubstr("--iface names network interface 'eth9x', which this host does not have"));
}

}  // namespace
}  // namespace lockstep
