// A memory plan's accessors and how it reads: a rank's breakdown in a line, the table, the JSON
// of `lockstep plan --json` (see Note [Planning memory]).
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstdio>

#include "lockstep/core/process.h"
#include "lockstep/core/world.h"
#include "lockstep/log/svg_chart.h"
#include "lockstep/train/memory_plan.h"
#include "memory_probe.h"

namespace lockstep::train {
namespace {

double in_mib(int64_t bytes) { return static_cast<double>(bytes) / kMiB; }

}  // namespace

std::string rank_breakdown(const RankMemory& m) {
  char line[440];
  std::snprintf(line, sizeof(line), "%s%s: parameters %.2f, gradients %.2f, optimizer state %.2f, fp32 masters %.2f, "
                "activations %.2f, buffers %.2f%s, baseline %.1f, data %.1f; peak %.1f MiB (%s)",
                m.which_ranks().c_str(), m.stage >= 0 ? c10::str(" (stage ", m.stage, ")").c_str() : "",
                in_mib(m.parameters), in_mib(m.gradients), in_mib(m.optimizer_state), in_mib(m.masters),
                in_mib(m.activations), in_mib(m.buffers),
                c10::str(m.collectives > 0 ? ", collectives " + log::fixed(in_mib(m.collectives), 2) : "",
                         m.cached > 0 ? ", cached " + log::fixed(in_mib(m.cached), 2) : "").c_str(),
                in_mib(m.baseline), in_mib(m.data), in_mib(m.peak()), m.peak_moment().c_str());
  return line;
}

void MemoryPlanOptions::validate() const {
  TORCH_CHECK_VALUE(world_size() >= 1, "MemoryPlanOptions::world_size ", world_size(), " must be at least 1");
  // See Note [Plans of many ranks].
  TORCH_CHECK_VALUE(world_size() <= kMaxWorldSize, "MemoryPlanOptions::world_size ", world_size(),
                    " is more ranks than lockstep runs (at most ", kMaxWorldSize, ", 2^20)");
  TORCH_CHECK_VALUE(local_ranks() >= 0 && local_ranks() <= world_size(), "MemoryPlanOptions::local_ranks ",
                    local_ranks(), " must be between 0 (all ranks on one host) and MemoryPlanOptions::world_size ",
                    world_size(), ": a host holds at most the run's ranks");
  TORCH_CHECK_VALUE(probe_rows() >= 1, "MemoryPlanOptions::probe_rows ", probe_rows(), " must be at least 1");
}

int64_t RankMemory::peak() const { return std::max({launch_check, first_step, steady, evaluation}); }

std::string RankMemory::peak_moment() const {
  if (launch_check > std::max({first_step, steady, evaluation})) return "check at launch";
  if (evaluation > steady && evaluation > first_step) return "evaluation";
  return first_step > steady ? "first step" : "steady state";
}

std::string RankMemory::which_ranks() const {
  if (count == 1) return c10::str("rank ", rank);
  const int64_t last = rank + (count - 1) * stride;  // below the world size: no overflow
  if (stride == 1) return c10::str("ranks ", rank, "-", last);
  if (count == 2) return c10::str("ranks ", rank, ", ", last);
  if (count == 3) return c10::str("ranks ", rank, ", ", rank + stride, ", ", last);
  return c10::str("ranks ", rank, ", ", rank + stride, ", ..., ", last, " (", count, " ranks)");
}

const RankMemory& MemoryPlan::largest() const {
  TORCH_CHECK(!ranks.empty(), "memory plan: no ranks");
  return *std::max_element(ranks.begin(), ranks.end(),
                           [](const RankMemory& a, const RankMemory& b) { return a.peak() < b.peak(); });
}

RankMemory MemoryPlan::of_rank(int64_t r) const {
  TORCH_CHECK_VALUE(r >= 0 && r < world_size, "memory plan: rank ", r, " is outside [0, ", world_size, ")");
  for (const RankMemory& m : ranks) {
    if (r < m.rank || (r - m.rank) % m.stride != 0 || (r - m.rank) / m.stride >= m.count) continue;
    RankMemory one = m;
    one.rank = r;
    one.count = 1;
    return one;
  }
  TORCH_CHECK(false, "memory plan: no entry holds rank ", r, " of ", world_size);
}

nlohmann::ordered_json MemoryPlan::to_json() const {
  nlohmann::ordered_json j{{"strategy", strategy}, {"opt_level", opt_level}, {"world_size", world_size},
                           {"batch_size", batch_size}, {"checkpoint_activations", checkpoint_activations}};
  j["ranks"] = nlohmann::ordered_json::array();
  for (const RankMemory& m : ranks) {
    nlohmann::ordered_json r{{"rank", m.rank}, {"count", m.count}, {"stride", m.stride}};
    if (m.stage >= 0) r["stage"] = m.stage;
    r.update({{"parameters", m.parameters}, {"gradients", m.gradients}, {"optimizer_state", m.optimizer_state},
              {"masters", m.masters}, {"activations", m.activations}, {"buffers", m.buffers},
              {"collectives", m.collectives}, {"cached", m.cached},
              {"baseline", m.baseline}, {"data", m.data}, {"first_step", m.first_step}, {"steady", m.steady},
              {"evaluation", m.evaluation}, {"launch_check", m.launch_check},
              {"peak", m.peak()}, {"peak_moment", m.peak_moment()}});
    j["ranks"].push_back(std::move(r));
  }
  return j;
}

std::string MemoryPlan::table() const {
  // See Note [Plans of many ranks]: the first and the last halves past kPlanTableEntries.
  const auto n = static_cast<int64_t>(ranks.size()), half = kPlanTableEntries / 2;
  std::string out;
  for (int64_t i = 0; i < n; ++i) {
    if (n > kPlanTableEntries && i == half) {
      // Only a pipeline's stages make several entries: each entry is a stage's ranks.
      out += c10::str("... ", n - 2 * half, " more entries, stages ", ranks[i].stage, "-", ranks[n - half - 1].stage,
                      " (the JSON form lists each)\n");
      i = n - half - 1;
      continue;
    }
    out += rank_breakdown(ranks[i]) + "\n";
  }
  return out;
}

}  // namespace lockstep::train
