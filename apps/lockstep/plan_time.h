#pragma once
// `lockstep plan`'s time flags (plan_time.cpp): checking the alpha-beta model against measured
// collectives, and predicting a step's time at many hosts.

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"

namespace lockstep::cli {

struct TimePlanFlags {
  std::vector<std::string> collectives;  // collectives.csv files to fit and check the model with
  int64_t min_bytes = int64_t{1} << 20;
  int64_t nodes = 0;  // 0: no scaling table
  int64_t ranks_per_node = 1;
  std::string link = "100Gbit/5us";
  std::string host_link = "41Gbit/31us";  // this machine's shared memory, cold buffers, fitted in docs/scaling.md
  std::string svg;  // --nodes: the efficiency curves, as an SVG file
  std::string profile_log;
};

void add_time_plan_options(CLI::App* cmd, const std::shared_ptr<TimePlanFlags>& f);
// Whether the command line asked for time (--collectives or --nodes) rather than memory.
bool wants_time_plan(const TimePlanFlags& f);
int run_time_plan(const TimePlanFlags& f);

}  // namespace lockstep::cli
