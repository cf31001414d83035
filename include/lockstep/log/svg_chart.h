#pragma once

#include <torch/arg.h>

#include <string>
#include <vector>

namespace lockstep::log {

// Note [Charts that carry their values]
// Every chart is one standalone <svg> element (inlined in report.html, or an .svg file of its own),
// drawn with plain shapes and text: no script, no font or image fetched, so it renders the same in
// a browser, an image viewer and a headless test. Each data point (a line chart's marker, a bar
// segment) carries the value it was drawn from, unrounded, in data-series, data-x / data-category
// and data-y / data-value attributes, and a <title> a person sees on hover. A test reads those
// attributes back from the DOM a real browser built and compares them with the log they came from.

// One line of a line chart: y against x; non-finite y values are gaps in the line.
struct LineSeries {
  std::string name;
  std::vector<double> x, y;  // equal lengths
};

struct LineChartOptions {
  TORCH_ARG(std::string, title) = "";
  TORCH_ARG(std::string, x_label) = "";
  TORCH_ARG(std::string, y_label) = "";
  TORCH_ARG(int, width) = 560;   // px
  TORCH_ARG(int, height) = 300;  // px
  // The y axis starts at 0 (accuracy, throughput) instead of hugging the data (loss).
  TORCH_ARG(bool, y_from_zero) = false;
  // x takes whole values (epochs): no ticks between them.
  TORCH_ARG(bool, integer_x) = false;
  // Drawn under the title when there is nothing to plot ("no loss scaling in this run").
  TORCH_ARG(std::string, empty_message) = "no data";
};

// A line chart with axes, ticks on round values, grid lines, axis labels, a legend when there is
// more than one series, and a marker per point. Throws c10::ValueError when a series' x and y
// differ in length.
std::string line_chart_svg(const LineChartOptions& options, const std::vector<LineSeries>& series);

// One stack level of a bar chart: a value per category (parameters, gradients, ...).
struct BarSeries {
  std::string name;
  std::vector<double> values;  // one per category, >= 0
};

struct BarChartOptions {
  TORCH_ARG(std::string, title) = "";
  TORCH_ARG(std::string, value_label) = "";  // the value axis, with its unit
  TORCH_ARG(int, width) = 560;
  // Bars run horizontally, one row per category, so long category names stay readable.
  TORCH_ARG(int, row_height) = 26;
};

// Horizontal bars, one per category, the series stacked left to right in order (one series: plain
// bars), with the total printed at each bar's end and a legend for several series. Throws
// c10::ValueError for a series whose value count differs from the categories' or a negative value.
std::string bar_chart_svg(const BarChartOptions& options, const std::vector<std::string>& categories,
                          const std::vector<BarSeries>& series);

// Round tick positions covering [lo, hi]: about `target` of them, spaced 1, 2 or 5 x 10^k and at
// least `min_step` apart. A single value gets a range around it ([0, 1] for 0).
std::vector<double> nice_ticks(double lo, double hi, int target, double min_step = 0.0);

// A tick or total label: few digits, k/M/G for thousands and up (12000 -> "12k").
std::string short_number(double value);

// `value` with `digits` decimals, as the tables beside the charts print it (printf's "%.*f").
std::string fixed(double value, int digits);

// Text made safe inside XML/HTML content and attribute values.
std::string xml_escape(const std::string& text);

}  // namespace lockstep::log
