#pragma once
// StrategyOptions::group takes a share of its group (Note [Who keeps the process group alive]).
// run_ranks (../dist/multi_rank.h) owns each rank's group for the whole test body, so a strategy
// built and destroyed inside the body is lent the group: a shared_ptr that does not own it.

#include <memory>

#include "lockstep/dist/process_group.h"

namespace lockstep::testing {

inline std::shared_ptr<dist::ProcessGroup> lent(dist::ProcessGroup& group) {
  return std::shared_ptr<dist::ProcessGroup>(&group, [](dist::ProcessGroup*) {});
}

}  // namespace lockstep::testing
