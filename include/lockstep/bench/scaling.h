#pragma once
// From measurements to predictions (Note [The alpha-beta model]): the link and host costs fitted
// from `lockstep bench --collectives` results, the model checked against every measured
// configuration, and the scaling table `lockstep plan --nodes ...` prints.

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/bench/collectives_bench.h"
#include "lockstep/dist/cost_model.h"

namespace lockstep::bench {

// The rows of a collectives.csv that `lockstep bench --collectives` wrote. Throws c10::ValueError
// naming the file and line of a malformed row.
std::vector<CollectiveTiming> read_collectives_csv(const std::string& path);

// Several results files of one configuration are runs of it: one row for each collective,
// algorithm, size, ranks and hosts, its time the median of the runs' (the mean of the middle two
// for an even count), `runs` how many there were, algbw and busbw recomputed from that time. On
// this machine a run of 1 host x 2 ranks now and then takes twice as long at one size while the
// runs beside it agree (docs/scaling.md); the medians of three runs are what the model is
// checked against. Order: as each row first appears.
std::vector<CollectiveTiming> median_of_runs(const std::vector<CollectiveTiming>& rows);

// The link's alpha and beta from the flat all-reduces of 2 hosts x 1 rank (a ring of two: 2 alpha +
// S beta), the host's from those of 1 host x 2 or more ranks, each over sizes >= min_bytes. Throws
// c10::ValueError saying which configuration is missing.
dist::CollectiveCosts fit_collective_costs(const std::vector<CollectiveTiming>& rows, int64_t min_bytes);

struct ModelCheck {
  CollectiveTiming measured;
  double predicted_s = 0.0;
  double error() const { return predicted_s / measured.seconds - 1.0; }
};

// Every all-reduce row of `rows` of at least min_bytes beside the model's prediction for it.
std::vector<ModelCheck> check_collective_costs(const dist::CollectiveCosts& costs,
                                               const std::vector<CollectiveTiming>& rows, int64_t min_bytes);

// A step's compute from a run's --log-jsonl summary (lockstep train --profile): forward (with the
// loss), backward and optimizer phases of rank 0's profile, and the gradient bytes (param_bytes).
// Throws c10::ValueError naming the file when it has no profiled summary.
dist::StepShape step_shape_from_log(const std::string& path);

struct ScalingRow {
  dist::ClusterShape shape;
  dist::StepPrediction flat, hierarchical;
  double efficiency(const dist::StepPrediction& p, double single_step_s) const { return single_step_s / p.step_s; }
  // The faster of the two (flat when equal or when hierarchical does not apply).
  bool hierarchical_wins() const { return hierarchical.step_s < flat.step_s; }
};

// Hosts 1, 2, 4, ... up to `max_hosts` with `ranks_per_host` each: the predicted step of each
// all-reduce algorithm for the same per-rank batch (weak scaling).
std::vector<ScalingRow> predict_scaling(const dist::StepShape& step, const dist::CollectiveCosts& costs,
                                        int64_t ranks_per_host, int64_t max_hosts);

}  // namespace lockstep::bench
