// `lockstep plan`'s time half (bench/scaling.h, Note [The alpha-beta model]): the model checked
// against measured collectives, and a run's step predicted at world sizes that cannot be tried.
#include "plan_time.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "checks.h"
#include "lockstep/bench/scaling.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/dist/cost_model.h"
#include "lockstep/log/run_record.h"
#include "lockstep/log/svg_chart.h"

namespace lockstep::cli {
namespace {

std::string format(const char* pattern, double a, double b = 0.0, double c = 0.0) {
  char text[160];
  std::snprintf(text, sizeof(text), pattern, a, b, c);
  return text;
}

// Each results file's rows, files of one configuration as its runs (their medians); the model
// fitted from them; every all-reduce row beside it.
int check_model(const TimePlanFlags& f) {
  std::vector<bench::CollectiveTiming> all;
  for (const auto& path : f.collectives) {
    const auto more = bench::read_collectives_csv(path);
    all.insert(all.end(), more.begin(), more.end());
  }
  const std::vector<bench::CollectiveTiming> rows = bench::median_of_runs(all);
  const dist::CollectiveCosts costs = bench::fit_collective_costs(rows, f.min_bytes);
  std::cout << "link (from 2 hosts x 1 rank): " << costs.link.describe() << "\n"
            << "host (from 1 host x 2 ranks, shared memory, one all-reduce): " << costs.host.describe() << "\n"
            << "| hosts x ranks | algorithm | size (MiB) | runs | measured (ms, median) | predicted (ms) | error |\n"
            << "|---------------|-----------|-----------:|-----:|----------------------:|---------------:|------:|\n";
  double worst = 0.0;
  for (const auto& c : bench::check_collective_costs(costs, rows, f.min_bytes)) {
    const auto& m = c.measured;
    worst = std::max(worst, std::abs(c.error()));
    std::cout << "| " << m.hosts << " x " << m.ranks / m.hosts << " | " << m.algorithm << " | "
              << format("%.0f", static_cast<double>(m.bytes) / (1 << 20)) << " | " << m.runs << " | "
              << format("%.2f", m.seconds * 1e3)
              << " | " << format("%.2f", c.predicted_s * 1e3) << " | " << format("%+.1f%%", c.error() * 100) << " |\n";
  }
  std::cout << format("worst error: %.1f%%\n", worst * 100);
  if (f.profile_log.empty()) return 0;
  // A run on --nodes x --ranks-per-node: its own phases, its buckets' all-reduces predicted.
  const dist::StepShape step = bench::step_shape_from_log(f.profile_log);
  const dist::ClusterShape shape{std::max<int64_t>(1, f.nodes), f.ranks_per_node};
  const double measured = log::read_run_log(f.profile_log).summary.at("profile").at("step_mean_ms").get<double>();
  for (const auto algorithm : {dist::AllReduceAlgorithm::kFlat, dist::AllReduceAlgorithm::kHierarchical}) {
    const dist::StepPrediction p = dist::predict_step(step, costs, shape, algorithm);
    std::cout << "step of " << f.profile_log << " on " << shape.hosts << " x " << shape.ranks_per_host << ", "
              << (algorithm == dist::AllReduceAlgorithm::kFlat ? "flat" : "hierarchical")
              << format(": predicted %.1f ms (exposed communication %.1f ms), measured %.1f ms", p.step_s * 1e3,
                        p.exposed_s * 1e3, measured)
              << format(", error %+.1f%%\n", (p.step_s * 1e3 / measured - 1.0) * 100);
  }
  return 0;
}

int scaling(const TimePlanFlags& f) {
  dist::CollectiveCosts costs;
  costs.link = dist::LinkCost::parse(f.link);
  costs.host = dist::LinkCost::parse(f.host_link);
  const dist::StepShape step = bench::step_shape_from_log(f.profile_log);
  const double alone = step.forward_s + step.backward_s + step.optimizer_s;
  std::cout << "step of one rank (from " << f.profile_log << "): "
            << format("forward %.1f ms, backward %.1f ms, optimizer %.1f ms", step.forward_s * 1e3,
                      step.backward_s * 1e3, step.optimizer_s * 1e3)
            << format("; gradients %.1f MiB\n", static_cast<double>(step.gradient_bytes) / (1 << 20))
            << "link " << f.link << ": " << costs.link.describe() << "; inside a host " << f.host_link << ": "
            << costs.host.describe() << "\n"
            << "| hosts | ranks | flat step (ms) | flat efficiency | hierarchical step (ms) | hierarchical efficiency | "
               "faster |\n|------:|------:|---------------:|----------------:|-----------------------:|"
               "------------------------:|--------|\n";
  const auto rows = bench::predict_scaling(step, costs, f.ranks_per_node, f.nodes);
  log::LineSeries flat{"flat", {}, {}}, hierarchical{"hierarchical", {}, {}};
  for (const auto& r : rows) {
    const bool applies = r.shape.hosts >= 2 && r.shape.ranks_per_host >= 2;
    std::cout << "| " << r.shape.hosts << " | " << r.shape.ranks() << " | " << format("%.1f", r.flat.step_s * 1e3)
              << " | " << format("%.1f%%", r.efficiency(r.flat, alone) * 100) << " | "
              << (applies ? format("%.1f", r.hierarchical.step_s * 1e3) : "-") << " | "
              << (applies ? format("%.1f%%", r.efficiency(r.hierarchical, alone) * 100) : "-") << " | "
              << (applies && r.hierarchical_wins() ? "hierarchical" : "flat") << " |\n";
    flat.x.push_back(std::log2(static_cast<double>(r.shape.ranks())));
    flat.y.push_back(r.efficiency(r.flat, alone) * 100);
    hierarchical.x.push_back(flat.x.back());
    hierarchical.y.push_back(applies ? r.efficiency(r.hierarchical, alone) * 100 : NAN);
  }
  if (!f.svg.empty()) {
    const std::string chart = log::line_chart_svg(
        log::LineChartOptions()
            .title("Predicted scaling efficiency of " + std::filesystem::path(f.profile_log).stem().string() + ", " +
                   std::to_string(f.ranks_per_node) + " ranks per host, link " + f.link)
            .x_label("ranks, log2 (3: 8, 6: 64, 10: 1024)")
            .integer_x(true)
            .y_label("efficiency (%)")
            .y_from_zero(true),
        {flat, hierarchical});
    write_file_atomic(f.svg, std::vector<char>(chart.begin(), chart.end()));
    std::cout << "wrote " << f.svg << "\n";
  }
  return 0;
}

}  // namespace

void add_time_plan_options(CLI::App* cmd, const std::shared_ptr<TimePlanFlags>& f) {
  const std::string group = "Time (Note [The alpha-beta model]; docs/scaling.md)";
  cmd->add_option("--collectives", f->collectives,
                  "collectives.csv files of lockstep bench --collectives: fit the model (2 hosts x 1 rank, 1 host x 2 "
                  "ranks) and set every all-reduce beside its prediction")
      ->delimiter(',')->group(group);
  cmd->add_option("--min-bytes", f->min_bytes, "--collectives: the smallest messages compared")
      ->check(positive_count())->group(group);
  cmd->add_option("--nodes", f->nodes,
                  "Predict the step on 1, 2, 4, ... up to this many hosts (with --profile-log); with --collectives, "
                  "the hosts of the profiled run")
      ->check(positive_count())->group(group);
  cmd->add_option("--ranks-per-node", f->ranks_per_node, "Ranks on each host")->check(positive_count())->group(group);
  cmd->add_option("--link", f->link, "Each host's link: RATE/LATENCY, e.g. 100Gbit/5us")->group(group);
  cmd->add_option("--host-link", f->host_link,
                  "One all-reduce inside a host: RATE/LATENCY (default: this machine's shared memory as fitted in "
                  "docs/scaling.md)")
      ->group(group);
  cmd->add_option("--profile-log", f->profile_log,
                  "A one-rank run's --log-jsonl written with --profile: its forward, backward, optimizer and gradient "
                  "bytes")
      ->group(group);
  cmd->add_option("--svg", f->svg, "--nodes: also draw the efficiency of each all-reduce against the ranks here")
      ->group(group);
}

bool wants_time_plan(const TimePlanFlags& f) { return !f.collectives.empty() || f.nodes > 0; }

int run_time_plan(const TimePlanFlags& f) {
  // Before any file is read: --nodes x --ranks-per-node within the ranks a job may have (the
  // cost model's bound, which keeps the table's powers of two and its rank counts from wrapping).
  dist::ClusterShape{std::max<int64_t>(1, f.nodes), f.ranks_per_node}.validate();
  if (!f.collectives.empty()) return check_model(f);
  if (f.profile_log.empty()) {
    std::cerr << "lockstep plan --nodes: give --profile-log, a one-rank run's log: lockstep train ... --profile "
                 "--log-jsonl run.jsonl\n";
    return kUsageError;
  }
  return scaling(f);
}

}  // namespace lockstep::cli
