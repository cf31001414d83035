#include "lockstep/log/html_report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "../test_util.h"
#include "lockstep/train/train.h"

namespace lockstep::log {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Debian's chromium, the independent renderer: "" when it is not installed.
std::string chromium() {
  for (const char* candidate : {"/usr/bin/chromium", "/usr/bin/chromium-browser"})
    if (::access(candidate, X_OK) == 0) return candidate;
  return "";
}

struct Rendered {
  int exit_code = -1;
  std::string dom;             // the DOM after loading, as Chromium serialises it
  std::vector<std::string> console;  // console messages and page errors Chromium logged
};

// Loads `html_path` in headless Chromium and returns the DOM it built and every console message
// (script errors, CSP violations: Chromium logs them as "CONSOLE(line)" on stderr at --v=0).
Rendered render(const std::string& html_path, const testing::TempDir& dir) {
  const std::string flags = "--headless --disable-gpu --no-sandbox --no-first-run --user-data-dir=" + dir.path() +
                            "/profile --enable-logging=stderr --v=0";
  // In a subshell: run_command's own 2>&1 must not take stderr from the log file.
  const std::string command = "(timeout 120 " + chromium() + " " + flags + " --dump-dom file://" + html_path + " >" +
                              dir.path() + "/dom.html 2>" + dir.path() + "/chromium.log)";
  Rendered r;
  r.exit_code = testing::run_command(command).exit_code;
  r.dom = testing::read_text(dir / "dom.html");
  std::istringstream log(testing::read_text(dir / "chromium.log"));
  for (std::string line; std::getline(log, line);)
    if (line.find("CONSOLE") != std::string::npos || line.find("Uncaught") != std::string::npos)
      r.console.push_back(line);
  return r;
}

// (data-x, data-y) of every chart point of `series` in the DOM.
std::vector<std::pair<double, double>> points(const std::string& dom, const std::string& series) {
  std::vector<std::pair<double, double>> out;
  const std::regex circle("<circle[^>]*data-series=\"" + series + "\"[^>]*>");
  const std::regex x(" data-x=\"([^\"]*)\""), y(" data-y=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), circle); it != std::sregex_iterator(); ++it) {
    const std::string e = it->str();
    std::smatch mx, my;
    if (std::regex_search(e, mx, x) && std::regex_search(e, my, y)) out.emplace_back(std::stod(mx[1]), std::stod(my[1]));
  }
  return out;
}

std::map<std::string, double> bar_values(const std::string& dom, const std::string& series) {
  std::map<std::string, double> out;
  const std::regex bar("<rect class=\"bar\"[^>]*data-category=\"([^\"]*)\" data-series=\"" + series +
                       "\" data-value=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), bar); it != std::sregex_iterator(); ++it)
    out[(*it)[1]] = std::stod((*it)[2]);
  return out;
}

void expect_close(double a, double b, const std::string& what) {
  EXPECT_LE(std::abs(a - b), 1e-8 * std::max(1.0, std::abs(b))) << what << ": chart " << a << ", log " << b;
}

// A real run (bf16 with dynamic loss scaling, so every curve has data, and --profile) through
// `lockstep report --bench`, loaded in headless Chromium: the page renders without a console
// error, and the DOM Chromium built holds every logged loss, learning rate, throughput, loss scale
// and accuracy, the profile's phases and the bench rows.
TEST(HtmlReport, RendersInChromiumWithoutConsoleErrorsAndItsChartsHoldTheLoggedValues) {
  if (chromium().empty()) GTEST_SKIP() << "chromium not found: scripts/bootstrap --test installs Debian's chromium";
  testing::TempDir dir;
  auto options = train::TrainOptions().model("mlp").data(train::DataSource::kSynthetic).limit(400)
                     .precision(train::Precision::kBf16).loss_scale("dynamic");
  options.trainer().batch_size(20).epochs(2).log_every(3).profile(true).progress(nullptr).log().jsonl(dir / "run.jsonl");
  train::train(options);
  BenchResults bench;
  bench.date = "2026-11-22T00:00:00Z", bench.cpu = "test cpu", bench.cores = 2, bench.command = "lockstep bench";
  bench.rows.push_back({"local fp32", "lockstep", "", 1, 2, true, "", 3.0, 1234.5, 250, 1000, 1000, 1000});
  bench.rows.push_back({"ddp", "pytorch", "", 2, 1, true, "", 4.0, 987.25, 600, 0, 0, 0});
  {
    std::ofstream(dir / "results.json") << to_json(bench).dump();
  }
  const auto cli = testing::run_command(std::string(LOCKSTEP_CLI) + " report " + (dir / "run.jsonl") + " --bench " +
                                        dir.path() + " --out " + (dir / "report.html"));
  ASSERT_EQ(cli.exit_code, 0) << cli.output;

  const Rendered page = render(dir / "report.html", dir);
  ASSERT_EQ(page.exit_code, 0) << testing::read_text(dir / "chromium.log");
  EXPECT_THAT(page.console, IsEmpty());
  EXPECT_THAT(page.dom, HasSubstr("<h1>lockstep report: run.jsonl</h1>"));

  const RunRecord run = read_run_log(dir / "run.jsonl");
  ASSERT_EQ(run.steps.size(), 13u);  // 40 steps, every 3rd
  const auto loss = points(page.dom, "loss"), lr = points(page.dom, "lr"), speed = points(page.dom, "samples/s"),
             scale = points(page.dom, "loss scale"), acc = points(page.dom, "test accuracy");
  ASSERT_EQ(loss.size(), run.steps.size());
  ASSERT_EQ(lr.size(), run.steps.size());
  ASSERT_EQ(speed.size(), run.steps.size());
  ASSERT_EQ(scale.size(), run.steps.size());
  for (size_t i = 0; i < run.steps.size(); ++i) {
    const StepRecord& s = run.steps[i];
    const std::string at = "step " + std::to_string(s.step);
    expect_close(loss[i].first, static_cast<double>(s.step), at);
    expect_close(loss[i].second, s.loss, at + " loss");
    expect_close(lr[i].second, s.lr, at + " lr");
    expect_close(speed[i].second, s.samples_per_s, at + " samples/s");
    expect_close(scale[i].second, s.loss_scale, at + " loss scale");
  }
  EXPECT_EQ(scale.front().second, 65536.0);  // GradScaler's initial scale
  ASSERT_EQ(acc.size(), 2u);
  for (size_t i = 0; i < 2; ++i) expect_close(acc[i].second, run.epochs[i].test_acc, "epoch accuracy");

  const auto phases = bar_values(page.dom, "ms per step");
  ASSERT_EQ(phases.size(), 8u);  // seven phases and "other"
  for (const auto& phase : run.summary["profile"]["phases"])
    expect_close(phases.at(phase["name"].get<std::string>()), phase["mean_ms"].get<double>(), "phase");
  expect_close(bar_values(page.dom, "parameters").at("rank 0"), run.summary["param_bytes"].get<double>() / 1048576.0,
               "parameter MiB");
  const auto speeds = bar_values(page.dom, "samples/s");
  expect_close(speeds.at("local fp32 (1x2)"), 1234.5, "bench row");
  expect_close(speeds.at("pytorch ddp (2x1)"), 987.25, "bench peer row");
}

// The console check can fail: a page with a script error is caught (this page has no CSP).
TEST(HtmlReport, TheChromiumConsoleCheckCatchesAScriptError) {
  if (chromium().empty()) GTEST_SKIP() << "chromium not found: scripts/bootstrap --test installs Debian's chromium";
  testing::TempDir dir;
  {
    std::ofstream(dir / "bad.html") << "<!DOCTYPE html><html><body><p>x</p><script>no_such_function();</script>"
                                       "</body></html>";
  }
  const Rendered page = render(dir / "bad.html", dir);
  ASSERT_EQ(page.exit_code, 0);
  ASSERT_EQ(page.console.size(), 1u);
  EXPECT_THAT(page.console[0], HasSubstr("no_such_function is not defined"));
}

TEST(RunRecord, ALaterLineForTheSameStepWinsAndBadLinesAreNamed) {
  testing::TempDir dir;
  {
    std::ofstream(dir / "a.jsonl") << R"({"event":"run","settings":{"model":"mlp"}})" "\n"
                                      R"({"event":"step","epoch":1,"step":10,"loss":2.0,"lr":0.1,"samples_per_s":5})" "\n"
                                      R"({"event":"step","epoch":1,"step":20,"loss":null,"lr":0.1,"samples_per_s":5})" "\n"
                                      R"({"event":"run","settings":{"model":"mlp"}})" "\n"
                                      R"({"event":"step","epoch":1,"step":20,"loss":1.5,"lr":0.1,"samples_per_s":6})" "\n"
                                      R"({"event":"future_event"})" "\n";
    std::ofstream(dir / "b.jsonl") << R"({"event":"step"})" "\nnot json\n";
  }
  const RunRecord r = read_run_log(dir / "a.jsonl");
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_EQ(r.steps[1].loss, 1.5);
  EXPECT_EQ(r.steps[1].samples_per_s, 6.0);
  EXPECT_EQ(r.resumes, 1);
  EXPECT_EQ(r.settings["model"], "mlp");
  EXPECT_THAT(testing::error_message([&] { read_run_log(dir / "b.jsonl"); }), HasSubstr("b.jsonl' line 2 is not a JSON object"));
  EXPECT_THAT(testing::error_message([&] { read_run_log(dir / "none.jsonl"); }), HasSubstr("cannot read the run log"));
}

// A log edited or cut by hand, or written by another program: fields of another type read as
// missing instead of escaping as nlohmann's type errors (which named no file), a step beyond int64
// reads as 0, and a line longer than the limit (a file without newlines) is refused after reading
// only that much, naming the file and the line.
TEST(RunRecord, FieldsOfAnotherTypeReadAsMissingAndAnEndlessLineIsRefused) {
  testing::TempDir dir;
  {
    std::ofstream(dir / "odd.jsonl") << R"({"event":5})" "\n"
                                        R"({"event":"step","step":1e300,"epoch":"one","loss":1.5})" "\n"
                                        R"({"event":"step","step":3,"loss":"high"})" "\n"
                                        R"({"event":"skipped_step","step":3,"reason":7})" "\n"
                                        R"({"event":"summary","steps":"many","param_bytes":-1,"grad_bytes":null,)"
                                        R"("profile":{"phases":[{"name":3,"mean_ms":"x"},7],"steps":1e300}})" "\n";
    std::ofstream long_line(dir / "long.jsonl");
    long_line << R"({"event":"step","step":1,"loss":1})" "\n" << std::string(kMaxRunLogLineBytes + 10, ' ') << "\n";
  }
  const RunRecord r = read_run_log(dir / "odd.jsonl");
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_EQ(r.steps[0].step, 0);
  EXPECT_EQ(r.steps[0].loss, 1.5);
  EXPECT_TRUE(std::isnan(r.steps[1].loss));
  ASSERT_EQ(r.skips.size(), 1u);
  EXPECT_EQ(r.skips[0].reason, "");
  const std::string html = report_html(r, "odd", std::nullopt);
  EXPECT_THAT(html, HasSubstr("profile-table"));
  EXPECT_THAT(testing::error_message([&] { read_run_log(dir / "long.jsonl"); }),
              HasSubstr("long.jsonl' line 2 is longer than 1048576 bytes"));
}

}  // namespace
}  // namespace lockstep::log
