#include "lockstep/log/html_report.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "lockstep/core/atomic_file.h"
#include "lockstep/core/process.h"
#include "lockstep/log/svg_chart.h"

namespace lockstep::log {
namespace {


// No script, no fetch of any kind: the page is complete as written (styles are inline).
constexpr const char* kHead = R"(<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<style>
body { font-family: sans-serif; margin: 24px auto; max-width: 1180px; color: #222; background: #fafafa; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
.lead { color: #444; margin-top: 0; } .grid { display: flex; flex-wrap: wrap; gap: 14px; }
.chart { border: 1px solid #ddd; border-radius: 4px; } .note { color: #666; font-size: 13px; }
table { border-collapse: collapse; font-size: 13px; background: #fff; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: left; } td.num { text-align: right; }
</style>
)";

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

// A summary's number; `missing` when absent or of another type (a log edited or cut by hand).
double summary_number(const nlohmann::ordered_json& j, const char* key, double missing = 0.0) {
  if (!j.is_object()) return missing;
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : missing;
}
std::string whole(double v) { return std::isfinite(v) ? fmt("%.0f", v) : "?"; }

std::string json_text(const nlohmann::ordered_json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// A setting as text; "?" when a log of another version lacks it.
std::string field(const nlohmann::ordered_json& settings, const char* key) {
  return settings.contains(key) ? json_text(settings.at(key)) : "?";
}

std::string curves(const RunRecord& run) {
  LineSeries loss{"loss", {}, {}}, lr{"lr", {}, {}}, speed{"samples/s", {}, {}}, scale{"loss scale", {}, {}},
      skipped{"skipped steps", {}, {}};
  bool scaled = false;
  for (const StepRecord& s : run.steps) {
    const double x = static_cast<double>(s.step);
    loss.x.push_back(x), loss.y.push_back(s.loss);
    lr.x.push_back(x), lr.y.push_back(s.lr);
    speed.x.push_back(x), speed.y.push_back(s.samples_per_s);
    skipped.x.push_back(x), skipped.y.push_back(static_cast<double>(s.skipped_steps));
    if (s.loss_scale > 0) scaled = true, scale.x.push_back(x), scale.y.push_back(s.loss_scale);
  }
  LineSeries epoch_loss{"epoch mean", {}, {}}, acc{"test accuracy", {}, {}};
  for (const EpochRecord& e : run.epochs) {
    epoch_loss.x.push_back(static_cast<double>(e.step)), epoch_loss.y.push_back(e.train_loss);
    acc.x.push_back(static_cast<double>(e.epoch)), acc.y.push_back(e.test_acc);
  }
  auto chart = [](const std::string& title, const std::string& y) {
    return LineChartOptions().title(title).x_label("optimizer step").y_label(y);
  };
  std::string out = "<div class=\"grid\">\n";
  out += line_chart_svg(chart("Training loss", "cross-entropy"), {loss, epoch_loss});
  out += line_chart_svg(LineChartOptions().title("Test accuracy per epoch").x_label("epoch").y_label("accuracy")
                            .y_from_zero(true).integer_x(true),
                        {acc});
  out += line_chart_svg(chart("Learning rate", "lr").y_from_zero(true), {lr});
  out += line_chart_svg(chart("Throughput", "samples/s, all ranks").y_from_zero(true), {speed});
  out += line_chart_svg(chart("Loss scale", "scale").empty_message("no loss scaling in this run (fp32 and bf16 need none)"),
                        scaled ? std::vector<LineSeries>{scale} : std::vector<LineSeries>{});
  out += line_chart_svg(chart("Skipped steps (non-finite loss or gradient)", "skipped so far").y_from_zero(true),
                        {skipped});
  out += "</div>\n";
  if (!run.skips.empty()) {
    out += "<table id=\"skips\"><tr><th>skipped step</th><th>reason</th></tr>\n";
    for (const SkipRecord& s : run.skips)
      out += "<tr><td class=\"num\">" + std::to_string(s.step) + "</td><td>" + xml_escape(s.reason) + "</td></tr>\n";
    out += "</table>\n";
  }
  return out;
}

std::string profile(const nlohmann::ordered_json& summary) {
  const auto* p = summary.is_object() && summary.contains("profile") ? &summary["profile"] : nullptr;
  if (!p || !p->is_object() || !p->contains("phases") || !(*p)["phases"].is_array())
    return "<p class=\"note\">Not profiled: run with <code>--profile</code> to see where each step's time goes.</p>\n";
  std::vector<std::string> names;
  BarSeries ms{"ms per step", {}};
  std::string table = "<table id=\"profile-table\"><tr><th>phase</th><th>ms / step</th><th>share</th></tr>\n";
  for (const auto& phase : (*p)["phases"]) {
    names.push_back(phase.is_object() && phase.contains("name") ? json_text(phase["name"]) : "?");
    const double mean_ms = summary_number(phase, "mean_ms", 0.0);
    ms.values.push_back(std::isfinite(mean_ms) ? std::max(0.0, mean_ms) : 0.0);
    table += "<tr><td>" + xml_escape(names.back()) + "</td><td class=\"num\">" + fmt("%.3f", ms.values.back()) +
             "</td><td class=\"num\">" + fmt("%.1f%%", 100 * summary_number(phase, "share", NAN)) + "</td></tr>\n";
  }
  table += "<tr><th>step</th><th class=\"num\">" + fmt("%.3f", summary_number(*p, "step_mean_ms", NAN)) +
           "</th><th class=\"num\">100%</th></tr>\n</table>\n";
  const std::string title = "Mean time per step by phase (" + whole(summary_number(*p, "steps", NAN)) + " steps)";
  return "<div class=\"grid\">\n" +
         bar_chart_svg(BarChartOptions().title(title).value_label("milliseconds per step"), names, {ms}) + table +
         "</div>\n";
}

std::string memory(const nlohmann::ordered_json& s) {
  if (!s.is_object() || !s.contains("param_bytes"))
    return "<p class=\"note\">No summary line: the run did not finish.</p>\n";
  // Bars need finite sizes >= 0: anything else (a hand-edited log) is drawn as 0 and shown in the table.
  const auto size = [](double v) { return std::isfinite(v) ? std::max(0.0, v) : 0.0; };
  const double p = summary_number(s, "param_bytes") / kMiB, g = summary_number(s, "grad_bytes") / kMiB,
               o = summary_number(s, "optim_bytes") / kMiB, rss = summary_number(s, "peak_rss_mib");
  const double other = size(rss - size(p) - size(g) - size(o));
  const std::string chart = bar_chart_svg(
      BarChartOptions().title("Memory of rank 0").value_label("MiB (the bar's length is the peak resident set size)"),
      {"rank 0"},
      {{"parameters", {size(p)}}, {"gradients", {size(g)}}, {"optimizer state", {size(o)}},
       {"other (peak RSS)", {other}}});
  std::string table = "<table id=\"memory-table\"><tr><th>part</th><th>MiB</th></tr>\n";
  for (const auto& [name, v] : std::vector<std::pair<std::string, double>>{
           {"parameters", p}, {"gradients", g}, {"optimizer state (and fp32 masters at O2)", o},
           {"other: activations, framework, data", other}, {"peak resident set size", rss}})
    table += "<tr><td>" + name + "</td><td class=\"num\">" + fmt("%.2f", v) + "</td></tr>\n";
  return "<div class=\"grid\">\n" + chart + table + "</table>\n</div>\n";
}

std::string key_values(const std::string& id, const nlohmann::ordered_json& j, const std::vector<std::string>& skip) {
  std::string out = "<table id=\"" + id + "\">\n";
  for (const auto& [key, value] : j.items()) {
    if (std::find(skip.begin(), skip.end(), key) != skip.end()) continue;
    out += "<tr><th>" + xml_escape(key) + "</th><td>" + xml_escape(json_text(value)) + "</td></tr>\n";
  }
  return out + "</table>\n";
}

std::string bench_section(const BenchResults& b) {
  std::string out = "<h2>Bench: every configuration on this machine</h2>\n<p class=\"lead\">" + xml_escape(b.date) +
                    ", " + xml_escape(b.cpu) + ", " + std::to_string(b.cores) + " cores: <code>" +
                    xml_escape(b.command) + "</code></p>\n<div class=\"grid\">\n" + throughput_chart_svg(b) +
                    memory_chart_svg(b) + "</div>\n<table id=\"bench-table\"><tr><th>configuration</th><th>impl</th>"
                    "<th>ranks x threads</th><th>samples/s</th><th>train s</th><th>peak RSS MiB</th><th>final loss</th>"
                    "<th>test acc</th><th>note</th></tr>\n";
  for (const BenchRow& r : b.rows)
    out += "<tr><td>" + xml_escape(r.name) + "</td><td>" + xml_escape(r.implementation) + "</td><td>" +
           std::to_string(r.world_size) + " x " + std::to_string(r.threads) + "</td>" +
           (r.ok ? "<td class=\"num\">" + fmt("%.0f", r.samples_per_s) + "</td><td class=\"num\">" +
                       fmt("%.2f", r.train_s) + "</td><td class=\"num\">" + fmt("%.0f", r.peak_rss_mib) +
                       "</td><td class=\"num\">" + fmt("%.4f", r.final_loss) + "</td><td class=\"num\">" +
                       fmt("%.4f", r.test_acc) + "</td>"
                 : "<td colspan=\"5\">failed: " + xml_escape(r.error) + "</td>") +
           "<td>" + xml_escape(r.note) + "</td></tr>\n";
  return out + "</table>\n";
}

}  // namespace

std::string report_html(const RunRecord& run, const std::string& title, const std::optional<BenchResults>& bench) {
  const nlohmann::ordered_json& s = run.settings;
  const nlohmann::ordered_json& sum = run.summary;
  std::string lead;
  if (s.is_object())
    lead += field(s, "model") + " on " + field(s, "data") + ", strategy " + field(s, "strategy") + ", " +
            field(s, "world_size") + " rank(s) x " + field(s, "threads") + " thread(s), " +
            field(s, "precision") + " " + field(s, "opt_level") + ", " + field(s, "optimizer") + ". ";
  if (sum.is_object())
    lead += whole(summary_number(sum, "steps")) + " steps in " + fmt("%.1f s", summary_number(sum, "train_s")) + " (" +
            fmt("%.0f", summary_number(sum, "samples_per_s")) + " samples/s), test accuracy " +
            fmt("%.4f", summary_number(sum, "test_acc")) + ", " + whole(summary_number(sum, "skipped_steps")) +
            " skipped step(s).";
  else
    lead += "The run has not finished (no summary line yet): the curves show what it logged so far.";
  if (run.resumes > 0) lead += " Resumed " + std::to_string(run.resumes) + " time(s).";

  std::string html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<title>lockstep report: " + xml_escape(title) +
                     "</title>\n" + kHead + "</head>\n<body>\n<h1>lockstep report: " + xml_escape(title) +
                     "</h1>\n<p class=\"lead\">" + xml_escape(lead) + "</p>\n";
  html += "<h2>Training curves</h2>\n" + curves(run);
  html += "<h2>Where a step's time goes</h2>\n" + profile(sum);
  html += "<h2>Memory</h2>\n" + memory(sum);
  html += "<h2>Settings</h2>\n";
  html += s.is_object() ? key_values("settings", s, {})
                        : "<p class=\"note\">This log predates the run's settings line.</p>\n";
  if (sum.is_object()) html += "<h2>Result</h2>\n" + key_values("summary", sum, {"event", "profile"});
  if (bench) html += bench_section(*bench);
  return html + "<p class=\"note\">Written by lockstep report. Hover a point or bar for its value.</p>\n</body>\n</html>\n";
}

void write_report(const ReportOptions& o) {
  const RunRecord run = read_run_log(o.run_log());
  std::optional<BenchResults> bench;
  if (!o.bench_dir().empty()) bench = read_bench_results(o.bench_dir());
  const std::string html = report_html(run, std::filesystem::path(o.run_log()).filename().string(), bench);
  write_file_atomic(o.out(), std::vector<char>(html.begin(), html.end()));
}

}  // namespace lockstep::log
