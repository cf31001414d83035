// A memory plan's accessors and how it reads: a rank's breakdown in a line, the table, the JSON
// of `lockstep plan --json` (see Note [Planning memory]).
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstdio>

#include "lockstep/core/process.h"
#include "lockstep/log/svg_chart.h"
#include "lockstep/train/memory_plan.h"
#include "memory_probe.h"

namespace lockstep::train {
namespace {

double in_mib(int64_t bytes) { return static_cast<double>(bytes) / kMiB; }

}  // namespace

std::string rank_breakdown(const RankMemory& m) {
  char line[440];
  std::snprintf(line, sizeof(line), "rank %lld%s: parameters %.2f, gradients %.2f, optimizer state %.2f, fp32 masters %.2f, "
                "activations %.2f, buffers %.2f%s, baseline %.1f, data %.1f; peak %.1f MiB (%s)",
                static_cast<long long>(m.rank), m.stage >= 0 ? c10::str(" (stage ", m.stage, ")").c_str() : "",
                in_mib(m.parameters), in_mib(m.gradients), in_mib(m.optimizer_state), in_mib(m.masters),
                in_mib(m.activations), in_mib(m.buffers),
                c10::str(m.collectives > 0 ? ", collectives " + log::fixed(in_mib(m.collectives), 2) : "",
                         m.cached > 0 ? ", cached " + log::fixed(in_mib(m.cached), 2) : "").c_str(),
                in_mib(m.baseline), in_mib(m.data), in_mib(m.peak()), m.peak_moment().c_str());
  return line;
}

void MemoryPlanOptions::validate() const {
  TORCH_CHECK_VALUE(world_size() >= 1, "MemoryPlanOptions::world_size ", world_size(), " must be at least 1");
  TORCH_CHECK_VALUE(local_ranks() >= 0, "MemoryPlanOptions::local_ranks ", local_ranks(), " must be >= 0 (0: world_size)");
  TORCH_CHECK_VALUE(probe_rows() >= 1, "MemoryPlanOptions::probe_rows ", probe_rows(), " must be at least 1");
}

int64_t RankMemory::peak() const { return std::max({launch_check, first_step, steady, evaluation}); }

std::string RankMemory::peak_moment() const {
  if (launch_check > std::max({first_step, steady, evaluation})) return "check at launch";
  if (evaluation > steady && evaluation > first_step) return "evaluation";
  return first_step > steady ? "first step" : "steady state";
}

const RankMemory& MemoryPlan::largest() const {
  TORCH_CHECK(!ranks.empty(), "memory plan: no ranks");
  return *std::max_element(ranks.begin(), ranks.end(),
                           [](const RankMemory& a, const RankMemory& b) { return a.peak() < b.peak(); });
}

nlohmann::ordered_json MemoryPlan::to_json() const {
  nlohmann::ordered_json j{{"strategy", strategy}, {"opt_level", opt_level}, {"world_size", world_size},
                           {"batch_size", batch_size}, {"checkpoint_activations", checkpoint_activations}};
  j["ranks"] = nlohmann::ordered_json::array();
  for (const RankMemory& m : ranks) {
    nlohmann::ordered_json r{{"rank", m.rank}};
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
  std::string out;
  for (const RankMemory& m : ranks) out += rank_breakdown(m) + "\n";
  return out;
}

}  // namespace lockstep::train
