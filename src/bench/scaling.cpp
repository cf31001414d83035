// See Note [The alpha-beta model] and Note [A step's exposed communication].
#include "lockstep/bench/scaling.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include "lockstep/log/run_record.h"

namespace lockstep::bench {
namespace {

std::vector<std::string> split(const std::string& line, char by) {
  std::vector<std::string> out;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, by)) out.push_back(field);
  return out;
}

bool is_flat_all_reduce(const CollectiveTiming& r) { return r.collective == "all_reduce" && r.algorithm == "flat"; }

}  // namespace

std::vector<CollectiveTiming> read_collectives_csv(const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK_VALUE(in.good(), "cannot read collectives results '", path, "'");
  std::vector<CollectiveTiming> rows;
  std::string line;
  std::getline(in, line);
  TORCH_CHECK_VALUE(line.rfind("collective,algorithm,bytes,ranks,hosts,time_us", 0) == 0, path,
                    ": not a collectives.csv of lockstep bench --collectives (header '", line, "')");
  for (int number = 2; std::getline(in, line); ++number) {
    const auto f = split(line, ',');
    TORCH_CHECK_VALUE(f.size() == 8, path, ":", number, ": ", f.size(), " fields, expected 8: '", line, "'");
    CollectiveTiming r;
    try {
      r.collective = f[0];
      r.algorithm = f[1];
      r.bytes = std::stoll(f[2]);
      r.ranks = std::stoll(f[3]);
      r.hosts = std::stoll(f[4]);
      r.seconds = std::stod(f[5]) * 1e-6;
      r.algbw_gbps = std::stod(f[6]);
      r.busbw_gbps = std::stod(f[7]);
    } catch (const std::exception&) {
      TORCH_CHECK_VALUE(false, path, ":", number, ": a field is not a number: '", line, "'");
    }
    // A row is a measured job: at least one host, every host with the same number of ranks.
    TORCH_CHECK_VALUE(r.hosts >= 1 && r.ranks >= r.hosts && r.ranks % r.hosts == 0 && r.bytes >= 0 &&
                          std::isfinite(r.seconds) && r.seconds >= 0,
                      path, ":", number, ": hosts ", r.hosts, ", ranks ", r.ranks, ", bytes ", r.bytes,
                      " is not a measured job (hosts >= 1, ranks a multiple of hosts, bytes and time >= 0): '",
                      line.substr(0, 200), "'");
    rows.push_back(r);
  }
  return rows;
}

std::vector<CollectiveTiming> median_of_runs(const std::vector<CollectiveTiming>& rows) {
  using Key = std::tuple<std::string, std::string, int64_t, int64_t, int64_t>;
  std::vector<Key> order;
  std::map<Key, std::vector<CollectiveTiming>> runs;
  for (const auto& r : rows) {
    const Key key{r.collective, r.algorithm, r.bytes, r.ranks, r.hosts};
    auto& same = runs[key];
    if (same.empty()) order.push_back(key);
    same.push_back(r);
  }
  std::vector<CollectiveTiming> out;
  for (const auto& key : order) {
    auto& same = runs[key];
    std::sort(same.begin(), same.end(), [](const auto& a, const auto& b) { return a.seconds < b.seconds; });
    const size_t n = same.size();
    CollectiveTiming m = same[n / 2];
    m.seconds = n % 2 == 1 ? same[n / 2].seconds : (same[n / 2 - 1].seconds + same[n / 2].seconds) / 2.0;
    const double bus_factor = m.algbw_gbps > 0.0 ? m.busbw_gbps / m.algbw_gbps : 0.0;
    m.algbw_gbps = static_cast<double>(m.bytes) / m.seconds / 1e9;
    m.busbw_gbps = m.algbw_gbps * bus_factor;
    m.runs = static_cast<int64_t>(n);
    out.push_back(m);
  }
  return out;
}

dist::CollectiveCosts fit_collective_costs(const std::vector<CollectiveTiming>& rows, int64_t min_bytes) {
  std::vector<double> link_bytes, link_s, host_bytes, host_s;
  for (const auto& r : rows) {
    if (!is_flat_all_reduce(r) || r.bytes < min_bytes) continue;
    if (r.hosts == 2 && r.ranks == 2) {
      link_bytes.push_back(static_cast<double>(r.bytes));
      link_s.push_back(r.seconds);
    } else if (r.hosts == 1 && r.ranks >= 2) {
      host_bytes.push_back(static_cast<double>(r.bytes));
      host_s.push_back(r.seconds);
    }
  }
  TORCH_CHECK_VALUE(link_bytes.size() >= 2, "fitting the link needs flat all-reduces of 2 hosts x 1 rank at two sizes "
                    ">= ", min_bytes, " bytes or more; found ", link_bytes.size());
  TORCH_CHECK_VALUE(host_bytes.size() >= 2, "fitting the host needs flat all-reduces of 1 host x 2 ranks at two sizes "
                    ">= ", min_bytes, " bytes or more; found ", host_bytes.size());
  dist::CollectiveCosts costs;
  const dist::LinkCost ring = dist::fit_line(link_bytes, link_s);  // 2 alpha + S beta
  costs.link = dist::LinkCost{ring.alpha / 2.0, ring.beta};
  costs.host = dist::fit_line(host_bytes, host_s);
  return costs;
}

std::vector<ModelCheck> check_collective_costs(const dist::CollectiveCosts& costs,
                                               const std::vector<CollectiveTiming>& rows, int64_t min_bytes) {
  std::vector<ModelCheck> checks;
  for (const auto& r : rows) {
    if (r.collective != "all_reduce" || r.bytes < min_bytes) continue;
    const dist::ClusterShape shape{r.hosts, r.ranks / r.hosts};
    const auto algorithm = r.algorithm == "hierarchical" ? dist::AllReduceAlgorithm::kHierarchical
                                                         : dist::AllReduceAlgorithm::kFlat;
    checks.push_back(ModelCheck{r, costs.all_reduce_seconds(r.bytes, shape, algorithm)});
  }
  return checks;
}

dist::StepShape step_shape_from_log(const std::string& path) {
  const log::RunRecord run = log::read_run_log(path);
  TORCH_CHECK_VALUE(run.summary.is_object() && run.summary.contains("profile"), path,
                    ": no profiled summary; run lockstep train --profile --log-jsonl ", path, " to the end first");
  dist::StepShape step;
  step.gradient_bytes = run.summary.at("param_bytes").get<int64_t>();
  for (const auto& phase : run.summary.at("profile").at("phases")) {
    const std::string name = phase.at("name").get<std::string>();
    const double s = phase.at("mean_ms").get<double>() / 1e3;
    if (name == "forward" || name == "loss") step.forward_s += s;
    if (name == "backward") step.backward_s += s;
    if (name == "optimizer") step.optimizer_s += s;
  }
  return step;
}

std::vector<ScalingRow> predict_scaling(const dist::StepShape& step, const dist::CollectiveCosts& costs,
                                        int64_t ranks_per_host, int64_t max_hosts) {
  TORCH_CHECK_VALUE(ranks_per_host >= 1 && max_hosts >= 1, "scaling needs ranks per host and hosts >= 1, got ",
                    ranks_per_host, " and ", max_hosts);
  std::vector<ScalingRow> rows;
  for (int64_t hosts = 1; hosts <= max_hosts; hosts *= 2) {
    ScalingRow row;
    row.shape = dist::ClusterShape{hosts, ranks_per_host};
    row.flat = dist::predict_step(step, costs, row.shape, dist::AllReduceAlgorithm::kFlat);
    row.hierarchical = dist::predict_step(step, costs, row.shape, dist::AllReduceAlgorithm::kHierarchical);
    rows.push_back(row);
  }
  return rows;
}

}  // namespace lockstep::bench
