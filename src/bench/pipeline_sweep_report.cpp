// The pipeline sweep's files: table (markdown, CSV, JSON) and charts. See Note [The pipeline sweep].
#include "lockstep/bench/pipeline_sweep.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "lockstep/core/atomic_file.h"
#include "lockstep/log/svg_chart.h"

namespace lockstep::bench {
namespace {

using log::fixed;

// An RFC 4180 field: quoted, its quotes doubled.
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string percent(double fraction) { return fixed(100.0 * fraction, 0) + "%"; }

// Each stage's figure, "a / b / ..." (stage 0 first).
template <typename F>
std::string per_stage(const PipelineSweepRow& r, F figure) {
  std::string out;
  for (const StageFigures& s : r.stages) out += (out.empty() ? "" : " / ") + figure(s);
  return out.empty() ? "-" : out;
}

const PipelineSweepRow* find_row(const PipelineSweepResults& b, const std::string& name) {
  for (const auto& r : b.rows)
    if (r.name == name && r.ok) return &r;
  return nullptr;
}

nlohmann::ordered_json to_json(const PipelineSweepResults& b) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const PipelineSweepRow& r : b.rows) {
    nlohmann::ordered_json stages = nlohmann::ordered_json::array();
    for (const StageFigures& s : r.stages)
      stages.push_back({{"peak_rss_mib", s.peak_rss_mib}, {"step_ms", s.step_ms}, {"idle_ms", s.idle_ms},
                        {"idle_fraction", s.idle_fraction()}, {"activation_bytes", s.activation_bytes}});
    rows.push_back({{"name", r.name}, {"schedule", r.schedule}, {"micro_batches", r.micro_batches}, {"ranks", r.ranks},
                    {"ok", r.ok}, {"error", r.error}, {"step_s", r.step_s}, {"samples_per_s", r.samples_per_s},
                    {"peak_rss_mib", r.peak_rss_mib}, {"bubble", r.bubble}, {"stages", std::move(stages)}});
  }
  return {{"date", b.date}, {"cpu", b.cpu}, {"cores", b.cores}, {"command", b.command}, {"model", b.model},
          {"batch", b.batch}, {"stages", b.stages}, {"balance", b.balance}, {"rows", std::move(rows)}};
}

}  // namespace

std::string pipeline_sweep_markdown(const PipelineSweepResults& b) {
  std::ostringstream md;
  md << "# lockstep bench --pipeline-sweep\n\n- Date: " << b.date << "\n- CPU: " << b.cpu << " (" << b.cores
     << " cores)\n- Model: " << b.model << ", batch " << b.batch << ", K = " << b.stages
     << " stages cut by " << (b.balance == "time" ? "measured time" : "parameter count")
     << " (--balance " << b.balance << "), one thread per rank\n- Command: `" << b.command << "`\n\n"
     << "| run | M | ms/step | samples/s | vs model parallel | peak RSS MiB per rank | bubble (K-1)/(M+K-1) "
        "| measured idle per stage | activations held MiB per stage |\n"
     << "|---|---|---|---|---|---|---|---|---|\n";
  const PipelineSweepRow* plain = find_row(b, "model parallel");
  const PipelineSweepRow* best = nullptr;
  for (const PipelineSweepRow& r : b.rows) {
    md << "| " << r.name << " | " << r.micro_batches << " | ";
    if (!r.ok) {
      md << "failed: " << r.error << " | | | | | | |\n";
      continue;
    }
    md << fixed(r.step_s * 1000.0, 1) << " | " << fixed(r.samples_per_s, 1) << " | "
       << (plain ? fixed(plain->step_s / r.step_s, 2) + "x" : "-") << " | "
       << (r.stages.empty() ? fixed(r.peak_rss_mib, 0) : per_stage(r, [](const StageFigures& s) { return fixed(s.peak_rss_mib, 0); }))
       << " | " << (r.ranks > 1 ? percent(r.bubble) : "-") << " | "
       << per_stage(r, [](const StageFigures& s) { return percent(s.idle_fraction()); }) << " | "
       << per_stage(r, [](const StageFigures& s) { return fixed(static_cast<double>(s.activation_bytes) / (1 << 20), 1); })
       << " |\n";
    if (!r.schedule.empty() && (!best || r.step_s < best->step_s)) best = &r;
  }
  md << "\nTime per step is training time over optimizer steps (evaluation excluded). Idle is the time a stage "
        "waits to receive a neighbour's activations or gradients, over its step time (the profiler's sync phase). "
        "Activations held: the most tensor bytes a stage's forwards kept for their backwards at once.\n";
  if (best && plain)
    md << "\nFastest pipelined run: **" << best->name << "**, " << fixed(best->step_s * 1000.0, 1) << " ms per step, "
       << fixed(plain->step_s / best->step_s, 2) << "x plain model parallel (" << fixed(plain->step_s * 1000.0, 1)
       << " ms).\n";
  return md.str();
}

std::string pipeline_sweep_csv(const PipelineSweepResults& b) {
  std::string out = "name,schedule,micro_batches,ranks,ok,step_ms,samples_per_s,bubble,stage,peak_rss_mib,idle_fraction,"
                    "activation_bytes,error\n";
  for (const PipelineSweepRow& r : b.rows) {
    const std::string head = quoted(r.name) + "," + r.schedule + "," + std::to_string(r.micro_batches) + "," +
                             std::to_string(r.ranks) + "," + (r.ok ? "true" : "false") + "," + fixed(r.step_s * 1000.0, 3) +
                             "," + fixed(r.samples_per_s, 2) + "," + fixed(r.bubble, 4) + ",";
    const std::string error = quoted(r.error);
    if (r.stages.empty()) out += head + ",," + fixed(r.peak_rss_mib, 1) + ",,," + error + "\n";
    for (size_t s = 0; s < r.stages.size(); ++s)
      out += head + std::to_string(s) + "," + fixed(r.stages[s].peak_rss_mib, 1) + "," +
             fixed(r.stages[s].idle_fraction(), 4) + "," + std::to_string(r.stages[s].activation_bytes) + "," + error + "\n";
  }
  return out;
}

std::string time_per_step_chart_svg(const PipelineSweepResults& b) {
  const PipelineSweepRow* plain = find_row(b, "model parallel");
  const PipelineSweepRow* one = find_row(b, "one process");
  std::vector<log::LineSeries> series;
  double max_m = 1;
  for (const std::string schedule : {"gpipe", "1f1b"}) {
    log::LineSeries s{schedule + " pipeline (K=" + std::to_string(b.stages) + ")", {}, {}};
    if (plain) s.x.push_back(1), s.y.push_back(plain->step_s * 1000.0);  // M = 1 is plain model parallel
    for (const auto& r : b.rows)
      if (r.ok && r.schedule == schedule) s.x.push_back(static_cast<double>(r.micro_batches)), s.y.push_back(r.step_s * 1000.0);
    if (!s.x.empty()) max_m = std::max(max_m, s.x.back());
    series.push_back(std::move(s));
  }
  if (one) series.push_back({"one process, one thread", {1, max_m}, {one->step_s * 1000.0, one->step_s * 1000.0}});
  return log::line_chart_svg(log::LineChartOptions()
                                 .title("Time per step against micro-batches (M = 1: plain model parallel; lower is better)")
                                 .x_label("micro-batches per step (M)").y_label("ms per step").y_from_zero(true)
                                 .integer_x(true).width(720).height(360).empty_message("no successful runs"),
                             series);
}

std::string idle_chart_svg(const PipelineSweepResults& b) {
  std::vector<log::LineSeries> series;
  log::LineSeries formula{"bubble formula", {}, {}};
  for (const auto& r : b.rows)
    if (r.ranks > 1 && r.schedule != "1f1b") formula.x.push_back(static_cast<double>(r.micro_batches)), formula.y.push_back(100.0 * r.bubble);
  series.push_back(std::move(formula));
  for (const std::string schedule : {"gpipe", "1f1b"})
    for (int64_t stage = 0; stage < b.stages; ++stage) {
      log::LineSeries s{schedule + " stage " + std::to_string(stage), {}, {}};
      for (const auto& r : b.rows)
        if (r.ok && (r.schedule == schedule || r.name == "model parallel") && stage < static_cast<int64_t>(r.stages.size()))
          s.x.push_back(static_cast<double>(r.micro_batches)), s.y.push_back(100.0 * r.stages[stage].idle_fraction());
      series.push_back(std::move(s));
    }
  return log::line_chart_svg(log::LineChartOptions()
                                 .title("Measured idle time per stage against the bubble formula (K-1)/(M+K-1)")
                                 .x_label("micro-batches per step (M)").y_label("% of the step waiting on a neighbour")
                                 .y_from_zero(true).integer_x(true).width(820).height(360)
                                 .empty_message("no pipelined runs"),
                             series);
}

void write_pipeline_sweep_outputs(const PipelineSweepResults& results, const std::string& dir) {
  auto write = [&](const std::string& name, const std::string& text) {
    write_file_atomic(dir + "/" + name, std::vector<char>(text.begin(), text.end()));
  };
  write("pipeline_sweep.json", to_json(results).dump(2) + "\n");
  write("pipeline_sweep.csv", pipeline_sweep_csv(results));
  write("pipeline_sweep.md", pipeline_sweep_markdown(results));
  write("time_per_step.svg", time_per_step_chart_svg(results));
  write("idle.svg", idle_chart_svg(results));
}

}  // namespace lockstep::bench
